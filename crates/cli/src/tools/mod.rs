//! Operator tools that talk to a running server: `lookup`, `state`,
//! `snapshot` and `watch`. All gRPC calls go through `inferencecache-client`,
//! so `lookup` prints exactly what a gateway using the SDK would get.

pub(crate) mod lookup;
mod output;
pub(crate) mod server;
pub(crate) mod snapshot;
pub(crate) mod state;
pub(crate) mod token;
pub(crate) mod watch;

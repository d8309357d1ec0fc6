//! Operator tools that talk to a running server: `lookup`, `state`,
//! `snapshot` and `watch`. All gRPC calls go through `inferencecache-client`,
//! so `lookup` prints exactly what a gateway using the SDK would get.

pub mod lookup;
mod output;
pub(crate) mod server;
pub mod snapshot;
pub mod state;
pub(crate) mod token;
pub mod watch;

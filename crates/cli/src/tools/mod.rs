//! Operator tools that talk to a running server: `lookup`, `state`,
//! `snapshot` and `watch`. All lookups go through `inferencecache-client`.

pub mod lookup;
pub mod snapshot;
pub mod state;
pub mod watch;

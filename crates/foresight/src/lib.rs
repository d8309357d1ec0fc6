//! Eviction foresight: which of the blocks an index says a vLLM engine
//! holds will still be there when the engine gets to the next request.
//!
//! An index is right about the moment of a lookup (up to the engine's event
//! lag), but a request is scheduled later, behind the requests already sent
//! to that engine. Each of those allocates blocks for the part of its
//! prompt it does not find cached from the front of vLLM's free queue, and
//! that front holds the least recently freed prefixes, tail block first. On
//! a small cache under concurrency those are the last blocks of a prefix
//! the index just promised: the hint claims them and the engine reuses less
//! (issue 33's "after the hint" over-claims).
//!
//! This crate holds what every router that models it shares, pure (no
//! I/O, no clock, no locks):
//! - [`pool`]: vLLM 0.32's block pool rules and a simulation of one
//!   engine's pool driven by requests starting and ending (the gateway
//!   sees both for the traffic it routes);
//! - [`dry_run`]: the check itself, over any model of the free queue
//!   ([`FreeQueue`]): the gateway's [`Pool`], or the server's view built
//!   from the engine's own store and removal events and the hints it
//!   delivered (`inferencecache-server`'s `foresight` module).

pub mod dry_run;
pub mod pool;

pub use dry_run::{Ahead, FreeQueue, claimable};
pub use pool::{Allocation, Pool, blocks_needed, hit_cap};

//! The inference-cache kvevent-subscriber core: it turns an engine's KV-cache
//! event stream (vLLM, SGLang; ZMQ + msgpack) into reports keyed by the shared
//! content fingerprint.
//!
//! # Data flow
//!
//! ```text
//! ZMQ [topic, seq, payload]           replay DEALER [b"", (topic,) seq, payload]
//!   │ Sequencer::live / replayed      (sequence.rs: gaps → replay, restarts →
//!   ▼                                  EngineRestarted, order kept)
//! Action::Apply { payload }
//!   │ decode_batch            (decode/: never panics; a bad event is
//!   ▼                          skipped and reported, the rest still applies)
//! DecodedBatch { ts, events: Vec<EngineEvent>, errors, data_parallel_rank }
//!   │ Mapping::apply_all      (mapping.rs: engine hash → fingerprint, tier,
//!   ▼                          adapter; unknown parents held back; bounded;
//!                              window.rs: hybrid models' valid match ends)
//! Vec<Update>  Report(PrefixReport) | Evict(PrefixEviction) | AllCleared
//!   │ (caller) ReportCacheState / PublishEvent
//! ```
//!
//! # Sequence rules
//!
//! Per publisher, with `L` the last applied `seq`: start → replay from 0; a
//! gap (`seq > L+1`) → replay from `L+1`; a reconnect → replay from `L` and
//! compare the message at `L` with the hash of the one applied (equal →
//! continue; different or gone → restart); a live `seq ≤ L` that is not a
//! late copy of an applied message → the engine restarted: send `ALL_CLEARED`
//! (acknowledged before any later add), [`Mapping::reset`], replay from 0.
//! Replays end with `seq = -1` or time out. See [`sequence`].
//!
//! # The sidecar
//!
//! [`sidecar::start`] runs it all under one cancellation token: a
//! [`transport::run`] task per data-parallel rank, the event loop
//! [`forward::run`] on a thread of its own (owns the [`ReplicaState`] and the
//! gRPC client; batches by `--window`, one long-lived `ReportCacheState`
//! stream, evictions and clears as pipelined `PublishEvent`s, a full-state
//! resync after every reconnect), the stats path [`stats::run`] (engine `/metrics` →
//! `ReplicaStats`) and the endpoints [`http`] (`/metrics`, `/healthz`,
//! `/readyz`). Proto types appear only in [`forward`].
//!
//! Everything except [`transport`] and the sidecar tasks is synchronous, bounded and free of I/O.
//! [`transport::run`] owns the ZMQ sockets of one data-parallel rank (SUB on
//! the engine's PUB, connect or bind; one short-lived DEALER per replay) and
//! hands the caller ordered [`Delivery`] values; the caller owns the
//! [`Mapping`] (one per rank: ranks have separate caches) and the gRPC client.
//!
//! [`ReplicaState::handle`] turns each [`Delivery`] into updates:
//!
//! ```text
//! Delivery::Apply { payload }      → decode_batch → rank's Mapping::apply_all
//! Delivery::EngineRestarted        → Mapping::reset + Update::AllCleared
//! Delivery::CaughtUp               → Mapping::drop_pending (held parents won't come)
//! Delivery::Lost { from, to }      → counted
//! an AllCleared from one rank      → the other ranks' blocks are re-reported
//! ```
//!
//! The caller sends `Report`s via `ReportCacheState` (after flushing buffered
//! reports first when an `Evict` or a T2 re-report follows), `Evict` as
//! `PublishEvent(PREFIX_EVICTED)`, and `AllCleared` as
//! `PublishEvent(ALL_CLEARED)`, waiting for its acknowledgement before sending
//! anything after it.
//!
//! # Memory bound
//!
//! The [`Mapping`] tracks at most `max_tracked_blocks` engine blocks (about
//! 130–170 bytes each); past that it forgets the least recently stored block
//! and emits an eviction for it. Held-back blocks (unknown parent) are bounded
//! by `max_pending_blocks`. The decoder caps msgpack nesting and never
//! reserves more elements than the payload has bytes left.

pub mod decode;
pub mod error;
pub mod event;
pub mod forward;
pub mod frames;
pub mod hash;
pub mod http;
pub mod loopback;
pub mod lora;
pub mod mapping;
pub mod metrics;
pub mod replica;
pub mod sequence;
pub mod sidecar;
pub mod stats;
pub mod transport;
pub mod window;

pub use decode::{
    DecodeError, DecodeOptions, DecodedBatch, TupleLayout, decode_batch, decode_batch_with,
};
pub use error::SidecarError;
pub use event::{BlockRemoved, BlockStored, EngineEvent, Medium};
pub use hash::EngineHash;
pub use lora::{LoraNamesError, parse_lora_adapter_names};
pub use mapping::{
    Mapping, MappingConfig, MappingStats, PrefixEviction, PrefixReport, Tier, Update,
};
pub use replica::{ReplicaState, ReplicaStats};
pub use sequence::{Action, ReplayId, SequenceStats, Sequencer, SequencerConfig, payload_hash};
pub use transport::{
    DEFAULT_ENGINE_DOWN_GRACE, Delivery, TransportConfig, TransportError, TransportStatus,
};

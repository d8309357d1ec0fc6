//! The inference-cache kvevent-subscriber core: it turns an engine's KV-cache
//! event stream (vLLM, SGLang; ZMQ + msgpack) into reports keyed by the shared
//! content fingerprint.
//!
//! Data flow (all pure and synchronous so far):
//!
//! ```text
//! ZMQ payload ──decode_batch──▶ DecodedBatch { events, errors }
//! ```
//!
//! [`decode_batch`] never panics and never fails a whole batch for one bad
//! event: each bad event becomes a [`DecodeError`] and is skipped.

pub mod decode;
pub mod event;
pub mod hash;

pub use decode::{
    DecodeError, DecodeOptions, DecodedBatch, TupleLayout, decode_batch, decode_batch_with,
};
pub use event::{BlockRemoved, BlockStored, EngineEvent, Medium};
pub use hash::EngineHash;

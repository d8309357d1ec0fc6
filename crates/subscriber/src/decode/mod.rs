//! msgpack `EventBatch` payload → [`DecodedBatch`].
//!
//! Accepted forms (see `engine-wire-formats.md` §5):
//! - batch: positional array `[ts, events, data_parallel_rank?, ...]` or a map
//!   `{"ts", "events", "data_parallel_rank" | "attn_dp_rank"}`;
//! - event: tagged tuple `["BlockStored", field1, ...]` (msgspec
//!   `array_like=True`, trailing defaults may be omitted, extra trailing
//!   elements ignored) or tagged map `{"type": "BlockStored", ...}` (unknown
//!   keys ignored, omitted keys take their defaults);
//! - block hash: uint (the full `u64` range), negative int, `bin`, or `str`.
//!
//! Fields that change what gets indexed (hashes, parent, tokens, block size,
//! LoRA, medium, group) are validated strictly: a wrong type makes that one
//! event an error. Purely informational fields with an unexpected type are
//! dropped to `None` instead, so a cosmetic upstream change cannot blank out
//! the cache view. An error never stops the rest of the batch.
//!
//! The payload is read in one forward pass ([`reader`]): token ids and hashes
//! go straight into the event, and ignored values are skipped in place, so no
//! value tree is built. A payload that is not one well-formed msgpack value
//! (truncated, or nested too deep) yields only [`DecodeError::Msgpack`] and
//! no events, as if it had been parsed whole first.

mod fields;
mod reader;

use crate::event::EngineEvent;
use fields::read_event;
use reader::{Head, Malformed, Reader};

/// How positional (tuple) events are laid out beyond the fields the engines
/// share. Maps are decoded by name and do not depend on this.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TupleLayout {
    /// vLLM: `BlockStored[6..]` = medium, lora_name, extra_keys, group_idx,
    /// kv_cache_spec_kind, kv_cache_spec_sliding_window; `BlockRemoved[2..]` =
    /// medium, group_idx.
    #[default]
    Vllm,
    /// SGLang: only the documented positions (`BlockStored` up to `medium`,
    /// `BlockRemoved` up to `medium`) are read; later positions are ignored
    /// because SGLang's tuple order there is not vLLM's.
    Sglang,
}

/// Decoder options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DecodeOptions {
    /// Layout of positional events.
    pub tuple_layout: TupleLayout,
}

/// Why part of a payload could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The payload is not one msgpack value.
    #[error("payload is not valid msgpack: {0}")]
    Msgpack(String),
    /// The batch envelope is unusable; no event of it was decoded.
    #[error("bad batch: {0}")]
    Batch(String),
    /// One event is unusable; the other events of the batch still apply.
    #[error("bad event #{index} ({tag}): {reason}")]
    Event {
        /// Position of the event in the batch.
        index: usize,
        /// Its tag, or `"?"` when it had none.
        tag: String,
        /// What was wrong.
        reason: String,
    },
}

/// The result of decoding one payload: every good event, plus one error per
/// bad one (or a single batch-level error).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DecodedBatch {
    /// Batch timestamp in Unix seconds; 0 when absent or not a finite number.
    pub ts: f64,
    /// Decoded events in wire order.
    pub events: Vec<EngineEvent>,
    /// Errors, in wire order.
    pub errors: Vec<DecodeError>,
    /// vLLM `data_parallel_rank` / SGLang `attn_dp_rank`, when sent.
    pub data_parallel_rank: Option<i64>,
    /// Events with a tag this decoder does not know (skipped, not errors).
    pub unknown_events: usize,
}

/// Decodes one `EventBatch` payload with the default (vLLM) options. Never
/// panics; see [`decode_batch_with`].
pub fn decode_batch(payload: &[u8]) -> DecodedBatch {
    decode_batch_with(payload, DecodeOptions::default())
}

/// Decodes one `EventBatch` payload. Never panics, whatever the input.
pub fn decode_batch_with(payload: &[u8], options: DecodeOptions) -> DecodedBatch {
    let mut out = DecodedBatch::default();
    match read_batch(&mut Reader::new(payload), options, &mut out) {
        Ok(()) => out,
        Err(e) => DecodedBatch {
            errors: vec![DecodeError::Msgpack(e.to_string())],
            ..DecodedBatch::default()
        },
    }
}

/// What the batch's `events` field turned out to be.
enum Events {
    Absent,
    Read,
    Nil,
    Other(&'static str),
}

/// The batch level is the root (level 0); `events` is level 1; each event 2.
fn read_batch(
    rd: &mut Reader<'_>,
    options: DecodeOptions,
    out: &mut DecodedBatch,
) -> Result<(), Malformed> {
    let root = rd.head(0)?;
    let events = match root {
        Head::Array(n) => {
            let mut events = Events::Absent;
            for i in 0..n {
                match i {
                    0 => out.ts = read_ts(rd)?,
                    1 => events = read_events(rd, options, out)?,
                    2 => out.data_parallel_rank = read_i64(rd)?,
                    _ => rd.skip(1)?,
                }
            }
            if n < 2 {
                out.errors.push(DecodeError::Batch(format!(
                    "array batch has {n} elements, need at least [ts, events]"
                )));
                out.ts = 0.0;
                return Ok(());
            }
            events
        }
        Head::Map(n) => {
            let (mut ts, mut events) = (None, Events::Absent);
            let (mut dp_rank, mut attn_rank) = (None, None);
            for _ in 0..n {
                let key = rd.head(1)?;
                rd.skip_body(key, 1)?;
                match key {
                    Head::Str(b"ts") if ts.is_none() => ts = Some(read_ts(rd)?),
                    Head::Str(b"events") if matches!(events, Events::Absent) => {
                        events = read_events(rd, options, out)?;
                    }
                    Head::Str(b"data_parallel_rank") if dp_rank.is_none() => {
                        dp_rank = Some(read_i64(rd)?);
                    }
                    Head::Str(b"attn_dp_rank") if attn_rank.is_none() => {
                        attn_rank = Some(read_i64(rd)?);
                    }
                    _ => rd.skip(1)?,
                }
            }
            out.ts = ts.unwrap_or(0.0);
            // A present but unusable `data_parallel_rank` still shadows
            // `attn_dp_rank`: the first name is the authoritative one.
            out.data_parallel_rank = dp_rank.or(attn_rank).flatten();
            events
        }
        other => {
            rd.skip_body(other, 0)?;
            out.errors.push(DecodeError::Batch(format!(
                "batch is {}, not an array or map",
                other.kind()
            )));
            return Ok(());
        }
    };
    match events {
        Events::Read | Events::Nil => {}
        Events::Other(kind) => out.errors.push(DecodeError::Batch(format!(
            "events is {kind}, not an array"
        ))),
        Events::Absent => out
            .errors
            .push(DecodeError::Batch("batch has no events".to_owned())),
    }
    Ok(())
}

fn read_ts(rd: &mut Reader<'_>) -> Result<f64, Malformed> {
    let h = rd.head(1)?;
    rd.skip_body(h, 1)?;
    Ok(h.as_f64().filter(|t| t.is_finite()).unwrap_or(0.0))
}

fn read_i64(rd: &mut Reader<'_>) -> Result<Option<i64>, Malformed> {
    let h = rd.head(1)?;
    rd.skip_body(h, 1)?;
    Ok(h.as_i64())
}

fn read_events(
    rd: &mut Reader<'_>,
    options: DecodeOptions,
    out: &mut DecodedBatch,
) -> Result<Events, Malformed> {
    let n = match rd.head(1)? {
        Head::Array(n) => n,
        Head::Nil => return Ok(Events::Nil),
        other => {
            rd.skip_body(other, 1)?;
            return Ok(Events::Other(other.kind()));
        }
    };
    out.events.reserve((n as usize).min(rd.remaining()));
    for index in 0..n as usize {
        match read_event(rd, 2, options)? {
            Ok(Some(e)) => out.events.push(e),
            Ok(None) => out.unknown_events += 1,
            Err((tag, reason)) => out.errors.push(DecodeError::Event { index, tag, reason }),
        }
    }
    Ok(Events::Read)
}

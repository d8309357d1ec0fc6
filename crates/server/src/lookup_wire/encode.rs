//! `LookupRouteResponse` encoded straight from the pipeline's outcome: no
//! generated message, so no `String` per replica id and reason code and no
//! `Vec` of scores to build and drop (issue 36). The bytes are prost's for
//! the same response (proto3 defaults omitted, fields in tag order), which
//! `lookup_wire/tests.rs` checks against `convert::route_response`.

use crate::route::RouteOutcome;
use bytes::BufMut;
use inferencecache_index::{ReplicaNames, ScoreById};
use prost::encoding::{WireType, encoded_len_varint, key_len};

/// A LookupRoute answer ready to encode.
#[derive(Debug)]
pub struct WireAnswer {
    /// What the pipeline answered.
    pub outcome: RouteOutcome,
    /// The adapter echoed when the outcome echoes it (`""` = none).
    pub adapter_id: String,
}

impl WireAnswer {
    /// The answer to a request naming `adapter` (echoed only on answers that
    /// rank replicas, as `convert::route_response` does).
    pub fn new(outcome: RouteOutcome, adapter: &str) -> Self {
        let adapter_id = if outcome.echo_adapter {
            adapter.to_owned()
        } else {
            String::new()
        };
        Self {
            outcome,
            adapter_id,
        }
    }

    /// The microseconds the response reports.
    fn latency_us(&self) -> i64 {
        i64::try_from(self.outcome.latency.as_micros()).unwrap_or(i64::MAX)
    }

    /// Encoded length in bytes (the length [`WireAnswer::encode`] writes).
    pub fn encoded_len(&self) -> usize {
        let o = &self.outcome;
        let scores: usize = o
            .scores
            .iter()
            .map(|s| {
                let n = score_len(&o.names, s);
                key_len(1) + encoded_len_varint(n as u64) + n
            })
            .sum();
        scores
            + str_len(2, o.reason.as_str())
            + int_len(3, self.latency_us())
            + packed_len(4, &o.echo_tokens)
            + str_len(5, &self.adapter_id)
    }

    /// Appends the encoded message to `buf`: assembled in the thread's
    /// buffer (plain `Vec` pushes, each score's length patched in after
    /// it), then one copy into `buf`. Through `BufMut` every key, varint
    /// byte and float was a call with its own capacity check: ~12 per
    /// score, 64 scores an answer at 64 replicas (issue 36, session 44).
    pub fn encode(&self, buf: &mut impl BufMut) {
        crate::scratch_bytes::with(|out| {
            self.encode_to(out);
            buf.put_slice(out);
        });
    }

    /// Appends the encoded message to `out`.
    fn encode_to(&self, out: &mut Vec<u8>) {
        let o = &self.outcome;
        for s in &o.scores {
            // Key, a one-byte length (patched; a longer one is spliced in:
            // only names over ~100 bytes need it), the fields.
            out.push(KEY_SCORE);
            let at = out.len();
            out.push(0);
            put_str_vec(1, o.names.name(s.replica).as_bytes(), out);
            put_float_vec(2, s.score, out);
            put_int_vec(3, i64::from(s.matched_tokens), out);
            put_float_vec(4, hit_prob(s), out);
            put_int_vec(5, i64::from(s.tier.to_wire()), out);
            let n = out.len() - at - 1;
            if n < 0x80 {
                out[at] = n as u8;
            } else {
                let mut len = [0u8; 10];
                let w = varint_into(n as u64, &mut len);
                out.splice(at..=at, len[..w].iter().copied());
            }
        }
        put_str_vec(2, o.reason.as_str().as_bytes(), out);
        put_int_vec(3, self.latency_us(), out);
        if !o.echo_tokens.is_empty() {
            out.push(key_byte(4, WireType::LengthDelimited));
            let n: usize = o
                .echo_tokens
                .iter()
                .map(|&t| encoded_len_varint(u64::from(t)))
                .sum();
            put_varint_vec(n as u64, out);
            for &t in &o.echo_tokens {
                put_varint_vec(u64::from(t), out);
            }
        }
        put_str_vec(5, self.adapter_id.as_bytes(), out);
    }
}

/// The key of field 1 (`replica_scores`, length-delimited).
const KEY_SCORE: u8 = key_byte(1, WireType::LengthDelimited);

/// A field key of one byte (every tag here is under 16).
const fn key_byte(tag: u32, wire: WireType) -> u8 {
    ((tag << 3) | wire as u32) as u8
}

/// `v` as a varint into `buf`; its length.
fn varint_into(mut v: u64, buf: &mut [u8; 10]) -> usize {
    let mut i = 0;
    while v >= 0x80 {
        buf[i] = (v as u8) | 0x80;
        v >>= 7;
        i += 1;
    }
    buf[i] = v as u8;
    i + 1
}

fn put_varint_vec(v: u64, out: &mut Vec<u8>) {
    if v < 0x80 {
        out.push(v as u8);
    } else {
        let mut b = [0u8; 10];
        let n = varint_into(v, &mut b);
        out.extend_from_slice(&b[..n]);
    }
}

fn put_str_vec(tag: u32, s: &[u8], out: &mut Vec<u8>) {
    if !s.is_empty() {
        out.push(key_byte(tag, WireType::LengthDelimited));
        put_varint_vec(s.len() as u64, out);
        out.extend_from_slice(s);
    }
}

/// int32 / int64 / enum: a negative value is its 64-bit two's complement.
fn put_int_vec(tag: u32, v: i64, out: &mut Vec<u8>) {
    if v != 0 {
        out.push(key_byte(tag, WireType::Varint));
        put_varint_vec(v as u64, out);
    }
}

fn put_float_vec(tag: u32, v: f32, out: &mut Vec<u8>) {
    if v != 0.0 {
        out.push(key_byte(tag, WireType::ThirtyTwoBit));
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// The probability on the wire: clamped to [0, 1] as `convert::score_to_proto`.
fn hit_prob(s: &ScoreById) -> f32 {
    s.estimated_cache_hit_prob.clamp(0.0, 1.0)
}

fn score_len(names: &ReplicaNames, s: &ScoreById) -> usize {
    str_len(1, names.name(s.replica))
        + float_len(2, s.score)
        + int_len(3, i64::from(s.matched_tokens))
        + float_len(4, hit_prob(s))
        + int_len(5, i64::from(s.tier.to_wire()))
}

fn str_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        key_len(tag) + encoded_len_varint(s.len() as u64) + s.len()
    }
}

/// int32 / int64 / enum: a negative value is its 64-bit two's complement.
fn int_len(tag: u32, v: i64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(v as u64)
    }
}

fn float_len(tag: u32, v: f32) -> usize {
    if v == 0.0 { 0 } else { key_len(tag) + 4 }
}

fn packed_len(tag: u32, v: &[u32]) -> usize {
    if v.is_empty() {
        return 0;
    }
    let n: usize = v.iter().map(|&t| encoded_len_varint(u64::from(t))).sum();
    key_len(tag) + encoded_len_varint(n as u64) + n
}

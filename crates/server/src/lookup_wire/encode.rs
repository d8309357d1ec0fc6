//! `LookupRouteResponse` encoded straight from the pipeline's outcome: no
//! generated message, so no `String` per replica id and reason code and no
//! `Vec` of scores to build and drop (issue 36). The bytes are prost's for
//! the same response (proto3 defaults omitted, fields in tag order), which
//! `lookup_wire/tests.rs` checks against `convert::route_response`.

use crate::route::RouteOutcome;
use bytes::BufMut;
use inferencecache_index::ReplicaScore;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

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

    /// Encoded length in bytes.
    pub fn encoded_len(&self) -> usize {
        let o = &self.outcome;
        let scores: usize = o
            .scores
            .iter()
            .map(|s| {
                let n = score_len(s);
                key_len(1) + encoded_len_varint(n as u64) + n
            })
            .sum();
        scores
            + str_len(2, o.reason.as_str())
            + int_len(3, self.latency_us())
            + packed_len(4, &o.echo_tokens)
            + str_len(5, &self.adapter_id)
    }

    /// Appends the encoded message to `buf`.
    pub fn encode(&self, buf: &mut impl BufMut) {
        let o = &self.outcome;
        for s in &o.scores {
            encode_key(1, WireType::LengthDelimited, buf);
            encode_varint(score_len(s) as u64, buf);
            put_str(1, &s.replica_id, buf);
            put_float(2, s.score, buf);
            put_int(3, i64::from(s.matched_tokens), buf);
            put_float(4, hit_prob(s), buf);
            put_int(5, i64::from(s.tier.to_wire()), buf);
        }
        put_str(2, o.reason.as_str(), buf);
        put_int(3, self.latency_us(), buf);
        if !o.echo_tokens.is_empty() {
            encode_key(4, WireType::LengthDelimited, buf);
            let n: usize = o
                .echo_tokens
                .iter()
                .map(|&t| encoded_len_varint(u64::from(t)))
                .sum();
            encode_varint(n as u64, buf);
            for &t in &o.echo_tokens {
                encode_varint(u64::from(t), buf);
            }
        }
        put_str(5, &self.adapter_id, buf);
    }
}

/// The probability on the wire: clamped to [0, 1] as `convert::score_to_proto`.
fn hit_prob(s: &ReplicaScore) -> f32 {
    s.estimated_cache_hit_prob.clamp(0.0, 1.0)
}

fn score_len(s: &ReplicaScore) -> usize {
    str_len(1, &s.replica_id)
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

fn put_str(tag: u32, s: &str, buf: &mut impl BufMut) {
    if !s.is_empty() {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(s.len() as u64, buf);
        buf.put_slice(s.as_bytes());
    }
}

fn put_int(tag: u32, v: i64, buf: &mut impl BufMut) {
    if v != 0 {
        encode_key(tag, WireType::Varint, buf);
        encode_varint(v as u64, buf);
    }
}

fn put_float(tag: u32, v: f32, buf: &mut impl BufMut) {
    if v != 0.0 {
        encode_key(tag, WireType::ThirtyTwoBit, buf);
        buf.put_f32_le(v);
    }
}

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

    /// The answer as one gRPC message on the wire: the 5-byte prefix
    /// (uncompressed, big-endian length) and the message, written into a
    /// recycled buffer (`answer_buffers`: 64 scores are over glibc's thread
    /// cache) that goes back to its pool once sent; the scores' buffer goes
    /// back to the thread for the next answer (issue 36). The bytes tonic's
    /// server encoder sends for the same answer (`lookup_wire/tests.rs`).
    pub fn into_framed(self) -> bytes::Bytes {
        let mut out = crate::answer_buffers::take();
        out.extend_from_slice(&[0; 5]);
        self.encode_to(&mut out);
        let len = u32::try_from(out.len() - 5).unwrap_or(u32::MAX);
        out[1..5].copy_from_slice(&len.to_be_bytes());
        inferencecache_index::recycle_scores(self.outcome.scores);
        crate::answer_buffers::freeze(out)
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
            // The numeric fields written in place into room made with one
            // fixed-size extend, then cut to their length: pushed one by one
            // they were ~8 capacity checks a score (issue 36, session 45).
            // Written on the stack and copied, the copy's wide loads waited
            // on the byte stores just made (a failed store forward: half of
            // this function's time at 64 replicas, session 46).
            let start = out.len();
            out.extend_from_slice(&[0; TAIL_BYTES]);
            let mut tail = Tail {
                b: &mut out[start..],
                n: 0,
            };
            tail.float(2, s.score);
            tail.int(3, i64::from(s.matched_tokens));
            tail.float(4, hit_prob(s));
            tail.int(5, i64::from(s.tier.to_wire()));
            let n = tail.n;
            out.truncate(start + n);
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

/// The most bytes of a score's numeric fields: two floats (key + 4) and
/// two varints (key + up to 10).
const TAIL_BYTES: usize = 2 * 5 + 2 * 11;

/// A score's numeric fields, encoded into the answer's room for them
/// ([`TAIL_BYTES`] long).
struct Tail<'a> {
    b: &'a mut [u8],
    n: usize,
}

impl Tail<'_> {
    fn byte(&mut self, v: u8) {
        self.b[self.n] = v;
        self.n += 1;
    }

    fn float(&mut self, tag: u32, v: f32) {
        if v != 0.0 {
            self.byte(key_byte(tag, WireType::ThirtyTwoBit));
            for x in v.to_le_bytes() {
                self.byte(x);
            }
        }
    }

    /// int32 / int64 / enum: a negative value is its 64-bit two's complement.
    fn int(&mut self, tag: u32, v: i64) {
        if v != 0 {
            self.byte(key_byte(tag, WireType::Varint));
            let mut v = v as u64;
            while v >= 0x80 {
                self.byte((v as u8) | 0x80);
                v >>= 7;
            }
            self.byte(v as u8);
        }
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
        // Room for the longest varint (a fixed-size extend, inlined), the
        // bytes written in place, then cut to the varint: a copy of `n`
        // bytes was a `memcpy` call per matched-tokens field, 2 % of a
        // 64-replica lookup (issue 36, session 45), and a copy from the
        // stack waits on the byte stores (session 46).
        let start = out.len();
        out.extend_from_slice(&[0; 10]);
        let mut v = v;
        let mut i = start;
        while v >= 0x80 {
            out[i] = (v as u8) | 0x80;
            v >>= 7;
            i += 1;
        }
        out[i] = v as u8;
        out.truncate(i + 1);
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

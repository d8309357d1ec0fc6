//! msgpack builders that encode exactly like the engines' msgspec encoders:
//! non-negative ints as the smallest uint, negative as the smallest int,
//! floats as float64, strings as str, bytes as bin.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use rmpv::Value;

pub(crate) fn s(v: &str) -> Value {
    Value::from(v)
}

pub(crate) fn u(v: u64) -> Value {
    Value::from(v)
}

pub(crate) fn i(v: i64) -> Value {
    Value::from(v)
}

pub(crate) fn bin(v: &[u8]) -> Value {
    Value::Binary(v.to_vec())
}

pub(crate) fn nil() -> Value {
    Value::Nil
}

pub(crate) fn arr(items: Vec<Value>) -> Value {
    Value::Array(items)
}

pub(crate) fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
}

pub(crate) fn tokens(range: std::ops::Range<u32>) -> Value {
    arr(range.map(|t| u(u64::from(t))).collect())
}

pub(crate) fn hashes_u64(hs: &[u64]) -> Value {
    arr(hs.iter().map(|&h| u(h)).collect())
}

pub(crate) fn encode(v: &Value) -> Vec<u8> {
    let mut buf = Vec::new();
    rmpv::encode::write_value(&mut buf, v).unwrap();
    buf
}

/// A vLLM ≥ 0.26 batch: positional envelope, tagged-map events.
pub(crate) fn vllm_batch(ts: f64, events: Vec<Value>) -> Vec<u8> {
    encode(&arr(vec![Value::F64(ts), arr(events), u(0)]))
}

/// A vLLM ≥ 0.26 `BlockStored` map with the fields 0.33 always sends.
pub(crate) fn vllm_stored(
    hashes: &[u64],
    parent: Option<u64>,
    toks: std::ops::Range<u32>,
    block_size: u64,
) -> Value {
    map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", hashes_u64(hashes)),
        ("parent_block_hash", parent.map_or(nil(), u)),
        ("token_ids", tokens(toks)),
        ("block_size", u(block_size)),
        ("lora_id", nil()),
        ("medium", s("GPU")),
        ("lora_name", nil()),
    ])
}

/// `n` 16-token blocks with hashes `base..base+n`, chained on `parent`,
/// their tokens counting up from `first_token`.
#[allow(dead_code)] // not every test binary that includes `common` stores runs
pub(crate) fn vllm_stored_run(base: u64, n: u64, parent: Option<u64>, first_token: u32) -> Value {
    let hashes: Vec<u64> = (base..base + n).collect();
    vllm_stored(
        &hashes,
        parent,
        first_token..first_token + 16 * n as u32,
        16,
    )
}

pub(crate) fn vllm_removed(hashes: &[u64], medium: &str) -> Value {
    map(vec![
        ("type", s("BlockRemoved")),
        ("block_hashes", hashes_u64(hashes)),
        ("medium", s(medium)),
    ])
}

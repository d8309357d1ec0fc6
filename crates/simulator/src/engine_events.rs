//! Engine-format KV events: what a vLLM engine would publish for the
//! simulated caches, encoded exactly as vLLM ≥ 0.26 puts them on the wire
//! (msgpack `[ts, [event maps], data_parallel_rank]`), so that the real
//! subscriber mapping decodes and fingerprints them.

use rmpv::Value;

/// Engine block hashes are process-private in vLLM; the simulator derives
/// them from the prefix hash with a per-replica salt so that no engine hash
/// equals a fingerprint and the subscriber has to translate every one.
pub fn engine_hash(replica_salt: u64, prefix_hash: u64) -> u64 {
    prefix_hash.rotate_left(23) ^ replica_salt
}

/// A `BlockStored` event map (vLLM 0.33 field names).
pub fn block_stored(
    block_hashes: &[u64],
    parent: Option<u64>,
    token_ids: &[u32],
    block_size: usize,
) -> Value {
    Value::Map(vec![
        (Value::from("type"), Value::from("BlockStored")),
        (
            Value::from("block_hashes"),
            Value::Array(block_hashes.iter().map(|&h| Value::from(h)).collect()),
        ),
        (
            Value::from("parent_block_hash"),
            parent.map_or(Value::Nil, Value::from),
        ),
        (
            Value::from("token_ids"),
            Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
        ),
        (Value::from("block_size"), Value::from(block_size as u64)),
        (Value::from("lora_id"), Value::Nil),
        (Value::from("medium"), Value::from("GPU")),
        (Value::from("lora_name"), Value::Nil),
    ])
}

/// A `BlockRemoved` event map.
pub fn block_removed(block_hashes: &[u64]) -> Value {
    Value::Map(vec![
        (Value::from("type"), Value::from("BlockRemoved")),
        (
            Value::from("block_hashes"),
            Value::Array(block_hashes.iter().map(|&h| Value::from(h)).collect()),
        ),
        (Value::from("medium"), Value::from("GPU")),
    ])
}

/// Encodes a batch `[ts, events, 0]`.
pub fn encode_batch(ts_seconds: f64, events: Vec<Value>) -> Vec<u8> {
    let batch = Value::Array(vec![
        Value::F64(ts_seconds),
        Value::Array(events),
        Value::from(0u64),
    ]);
    let mut out = Vec::new();
    // Writing into a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut out, &batch);
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use inferencecache_subscriber::{EngineEvent, decode_batch};

    #[test]
    fn the_subscriber_decodes_our_batches() {
        let tokens: Vec<u32> = (0..8).collect();
        let payload = encode_batch(
            12.5,
            vec![
                block_stored(&[7, 8], Some(6), &tokens, 4),
                block_removed(&[9]),
            ],
        );
        let batch = decode_batch(&payload);
        assert!(batch.errors.is_empty(), "{:?}", batch.errors);
        assert_eq!(batch.ts, 12.5);
        assert_eq!(batch.events.len(), 2);
        match &batch.events[0] {
            EngineEvent::BlockStored(s) => {
                assert_eq!(s.block_hashes.len(), 2);
                assert_eq!(s.token_ids, tokens);
                assert_eq!(s.block_size, 4);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(batch.events[1], EngineEvent::BlockRemoved(_)));
    }
}

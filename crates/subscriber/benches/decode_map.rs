//! Decode + map throughput on vLLM 0.33-shaped batches, with the tree
//! decoder this crate used before (the test oracle) as the same-process
//! baseline.
#![allow(missing_docs, dead_code, clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/decode_oracle/tree.rs"]
mod tree;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use inferencecache_subscriber::{
    DecodeOptions, DecodedBatch, Mapping, MappingConfig, decode_batch,
};
use rmpv::Value;

const BLOCKS_PER_EVENT: u64 = 8;
const EVENTS_PER_BATCH: u64 = 4;
const BLOCK_SIZE: u64 = 16;

type Decoder = fn(&[u8]) -> DecodedBatch;

/// One batch of `EVENTS_PER_BATCH` chained BlockStored events (map form),
/// engine hashes offset by `base` so every batch stores new blocks.
fn batch(base: u64) -> Vec<u8> {
    let mut events = Vec::new();
    for e in 0..EVENTS_PER_BATCH {
        let first = base + e * BLOCKS_PER_EVENT;
        let hashes = (first..first + BLOCKS_PER_EVENT)
            .map(|h| Value::from(u64::MAX - h))
            .collect();
        let parent = if e == 0 {
            Value::Nil
        } else {
            Value::from(u64::MAX - (first - 1))
        };
        let tokens = (0..BLOCKS_PER_EVENT * BLOCK_SIZE)
            .map(|t| Value::from(t + first * 7))
            .collect();
        events.push(Value::Map(vec![
            ("type".into(), "BlockStored".into()),
            ("block_hashes".into(), Value::Array(hashes)),
            ("parent_block_hash".into(), parent),
            ("token_ids".into(), Value::Array(tokens)),
            ("block_size".into(), Value::from(BLOCK_SIZE)),
            ("lora_id".into(), Value::Nil),
            ("medium".into(), "GPU".into()),
            ("lora_name".into(), Value::Nil),
        ]));
    }
    let v = Value::Array(vec![Value::F64(1.0), Value::Array(events), Value::from(0)]);
    let mut buf = Vec::new();
    rmpv::encode::write_value(&mut buf, &v).unwrap();
    buf
}

fn bench(c: &mut Criterion) {
    let payloads: Vec<Vec<u8>> = (0..256)
        .map(|i| batch(i * BLOCKS_PER_EVENT * EVENTS_PER_BATCH))
        .collect();
    let mut g = c.benchmark_group("subscriber");
    g.throughput(Throughput::Elements(BLOCKS_PER_EVENT * EVENTS_PER_BATCH));
    let decoders: [(&str, &str, Decoder); 2] = [
        (
            "decode_batch (32 blocks, 512 tokens)",
            "decode_batch + Mapping::apply_all (32 blocks)",
            decode_batch,
        ),
        (
            "baseline: tree decoder (32 blocks)",
            "baseline: tree decoder + Mapping::apply_all (32 blocks)",
            |p| tree::decode_batch_with(p, DecodeOptions::default()),
        ),
    ];
    for (decode_name, map_name, decode) in decoders {
        g.bench_function(decode_name, |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % payloads.len();
                decode(&payloads[i])
            })
        });
        g.bench_function(map_name, |b| {
            let mut m = Mapping::new(MappingConfig::default());
            let mut out = Vec::new();
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % payloads.len();
                out.clear();
                m.apply_all(&decode(&payloads[i]).events, &mut out);
                out.len()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);

//! `chain()` for 16-token blocks. Throughput is in blocks (elements/s), so
//! ns/block = 1e9 / elements-per-second. `xxh3_floor` hashes the same bytes in
//! one XXH3 call: the floor any chaining scheme pays, measured in the same
//! process as the baseline for the ratio.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use inferencecache_fingerprint::{SEED, chain};
use std::hint::black_box;
use xxhash_rust::xxh3::xxh3_64_with_seed;

fn tokens(blocks: usize) -> Vec<u32> {
    (0..(blocks * 16) as u32)
        .map(|t| t.wrapping_mul(2_654_435_761))
        .collect()
}

fn bench_chain(c: &mut Criterion) {
    let mut group = c.benchmark_group("chain_16_token_blocks");
    for blocks in [1usize, 8, 128, 1024] {
        let t = tokens(blocks);
        group.throughput(Throughput::Elements(blocks as u64));
        group.bench_with_input(BenchmarkId::new("chain", blocks), &t, |b, t| {
            b.iter(|| chain(black_box(t), 16))
        });
        let bytes: Vec<u8> = t.iter().flat_map(|x| x.to_le_bytes()).collect();
        group.bench_with_input(
            BenchmarkId::new("xxh3_floor", blocks),
            &bytes,
            |b, bytes| b.iter(|| xxh3_64_with_seed(black_box(bytes), SEED)),
        );
    }
    group.finish();
}

criterion_group!(benches, bench_chain);
criterion_main!(benches);

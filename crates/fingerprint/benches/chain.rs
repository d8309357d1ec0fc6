//! `chain()` throughput for 16-token blocks; divide the reported time by the
//! block count (shown as elements/s) for ns/block.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use inferencecache_fingerprint::chain;
use std::hint::black_box;

fn bench_chain(c: &mut Criterion) {
    let mut group = c.benchmark_group("chain_16_token_blocks");
    for blocks in [1usize, 8, 128, 1024] {
        let tokens: Vec<u32> = (0..(blocks * 16) as u32)
            .map(|t| t.wrapping_mul(2_654_435_761))
            .collect();
        group.throughput(Throughput::Elements(blocks as u64));
        group.bench_with_input(BenchmarkId::from_parameter(blocks), &tokens, |b, t| {
            b.iter(|| chain(black_box(t), 16))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_chain);
criterion_main!(benches);

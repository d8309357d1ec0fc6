//! The chain-run arena (`src/arena`, not yet the index's storage) against
//! the index on the same shapes: a long chain held whole by 8 replicas and
//! stored in four turns, the 128-block / 64-replica partial chain of
//! `benches/lookup.rs`, and a new 32-block chain stored. The index figures
//! are whole lookups (the walk is about two thirds of one, BENCHMARKS.md);
//! the arena's are its walk alone.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use inferencecache_index::arena::ChainArena;
use inferencecache_index::{CacheUpdate, Index, IndexConfig, LookupRequest, PrefixEntry, Tier};
use std::hint::black_box;

use common::splitmix as hash;

fn update(replica: usize, hashes: &[u64]) -> CacheUpdate {
    CacheUpdate {
        replica_id: format!("replica-{replica:02}"),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            block_hashes: hashes.iter().map(|h| h.to_le_bytes().to_vec()).collect(),
            block_token_counts: vec![16; hashes.len()],
            ..PrefixEntry::default()
        }],
        ..CacheUpdate::default()
    }
}

/// Both stores fed the same (replica, chain) writes, each replica also
/// holding 4096 unrelated blocks.
fn both(writes: &[(usize, Vec<u64>)], replicas: usize) -> (Index, ChainArena) {
    let idx = IndexConfig::new().build();
    let arena = ChainArena::new();
    let store = |r: usize, hs: &[u64]| {
        idx.ingest(&update(r, hs));
        let toks: Vec<i32> = (1..=hs.len() as i32).map(|i| 16 * i).collect();
        arena.store(1, r as u32, hs, &toks, 0, Tier::T1);
    };
    for (r, hs) in writes {
        store(*r, hs);
    }
    for r in 0..replicas {
        let bg: Vec<u64> = (0..4096u64).map(|i| hash(1000 + r as u64, i)).collect();
        store(r, &bg);
    }
    (idx, arena)
}

/// The arena's walk and the index's whole lookup of `chain` after the same
/// `writes` (`replicas` replicas), as `walk_<name>` and `index_lookup_<name>`.
fn walk_and_lookup(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    chain: &[u64],
    writes: &[(usize, Vec<u64>)],
    replicas: usize,
) {
    let (idx, arena) = both(writes, replicas);
    let counts = vec![16i32; chain.len()];
    let bytes: Vec<Vec<u8>> = chain.iter().map(|h| h.to_le_bytes().to_vec()).collect();
    let mut out = Vec::new();
    g.bench_function(format!("walk_{name}"), |b| {
        b.iter(|| {
            arena.walk(1, black_box(chain), &counts, 0, &mut out);
            black_box(out.len())
        })
    });
    g.bench_function(format!("index_lookup_{name}"), |b| {
        b.iter(|| {
            let req = LookupRequest::new("t", "m", "vllm").chain(&bytes, &counts);
            black_box(idx.lookup_route(black_box(&req)))
        })
    });
}

fn bench_walk(c: &mut Criterion) {
    let mut g = c.benchmark_group("arena");
    // A 110-block conversation chain: replica 0 stored it in four turns,
    // replicas 1..8 whole (the p99 shape of `bench/peers`).
    let long: Vec<u64> = (0..110).map(|i| hash(1, i)).collect();
    let mut writes: Vec<(usize, Vec<u64>)> = [0..30, 30..60, 60..90, 90..110]
        .into_iter()
        .map(|r| (0, long[r].to_vec()))
        .collect();
    writes.extend((1..8).map(|r| (r, long.clone())));
    walk_and_lookup(&mut g, "110_blocks_8_replicas_4_runs", &long, &writes, 8);
    // `benches/lookup.rs`'s partial chain: replica r holds 1 + 2r % 128 blocks.
    let chain: Vec<u64> = (0..128).map(|i| hash(2, i)).collect();
    let writes: Vec<(usize, Vec<u64>)> = (0..64)
        .map(|r| (r, chain[..1 + (r * 2) % 128].to_vec()))
        .collect();
    walk_and_lookup(
        &mut g,
        "128_blocks_64_replicas_partial",
        &chain,
        &writes,
        64,
    );
    g.finish();
}

fn bench_store(c: &mut Criterion) {
    let mut g = c.benchmark_group("arena_store");
    g.throughput(Throughput::Elements(32));
    let (idx, arena) = both(&[], 8);
    let mut n = 0u64;
    let toks: Vec<i32> = (1..=32).map(|i| 16 * i).collect();
    g.bench_function("new_32_block_chain", |b| {
        b.iter(|| {
            n += 1;
            let hs: Vec<u64> = (0..32).map(|i| hash(1 << 40 | n, i)).collect();
            arena.store(1, (n % 8) as u32, &hs, &toks, n as i64, Tier::T1);
        })
    });
    let mut n = 0u64;
    g.bench_function("index_new_32_block_chain", |b| {
        b.iter(|| {
            n += 1;
            let hs: Vec<u64> = (0..32).map(|i| hash(1 << 40 | n, i)).collect();
            idx.ingest(&update((n % 8) as usize, &hs));
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = bench_walk, bench_store
}
criterion_main!(benches);

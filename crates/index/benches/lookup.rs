//! Index benches: chain lookup (128-block request, 64 replicas, partial
//! matches), exact lookup, ingest throughput (128- and 32-block chains),
//! PREFIX_EVICTED removal, chain lookup under concurrent ingest, the same
//! chain lookup backing off hybrid models' invalid ends, and a
//! resident-memory report; the default path (`route_ttft` + `record_delivery`,
//! what `serve` does per lookup on defaults) beside the contract lookup at 1,
//! 16 and 256 replicas x 16,384 blocks, and both on the h2load rig's workload
//! (64 replicas holding nested prefixes; `NESTED_CPU=N` also prints both
//! paths' thread CPU time per lookup). Criterion reports time per lookup / per update; ingest groups also
//! report elements (entries) per second.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use inferencecache_index::{
    CacheEvent, CacheUpdate, EventKind, Index, IndexConfig, LookupRequest, PolicyResolver,
    PrefixEntry, ReplicaStatsReport, RouteParams, TtftWeights, chain_seed,
};
use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const BLOCKS: usize = 128;
const REPLICAS: usize = 64;

fn hash(seed: u64, i: u64) -> Vec<u8> {
    common::splitmix(seed, i).to_be_bytes().to_vec()
}

fn chain_update(replica: usize, hashes: &[Vec<u8>]) -> CacheUpdate {
    CacheUpdate {
        replica_id: format!("replica-{replica:02}"),
        model_id: "llama-3-70b".into(),
        tenant_id: "tenant-a".into(),
        hash_scheme: "vllm".into(),
        timestamp_us: 0,
        prefixes: vec![PrefixEntry {
            block_hashes: hashes.to_vec(),
            block_token_counts: vec![16; hashes.len()],
            ..PrefixEntry::default()
        }],
        stats: Some(ReplicaStatsReport {
            hit_rate: 0.5,
            pressure: 0.2,
            ..ReplicaStatsReport::default()
        }),
        adapter_id: String::new(),
    }
}

/// 64 replicas, replica i holds the first `1 + (i * 2) % 128` blocks of the
/// shared 128-block chain, plus ~250k background entries under other prefixes.
fn populated() -> (Arc<Index>, Vec<Vec<u8>>) {
    populated_with(IndexConfig::new())
}

fn populated_with(cfg: IndexConfig) -> (Arc<Index>, Vec<Vec<u8>>) {
    let idx = Arc::new(cfg.build());
    let chain: Vec<Vec<u8>> = (0..BLOCKS as u64).map(|i| hash(1, i)).collect();
    for r in 0..REPLICAS {
        let depth = 1 + (r * 2) % BLOCKS;
        idx.ingest(&chain_update(r, &chain[..depth]));
        // Background: each replica also holds 4096 unrelated blocks.
        let bg: Vec<Vec<u8>> = (0..4096u64).map(|i| hash(1000 + r as u64, i)).collect();
        idx.ingest(&chain_update(r, &bg));
    }
    (idx, chain)
}

fn bench_lookup(c: &mut Criterion) {
    let (idx, chain) = populated();
    let counts = vec![16i32; BLOCKS];
    let mut g = c.benchmark_group("lookup");
    g.bench_function("chain_128_blocks_64_replicas_partial", |b| {
        b.iter(|| {
            let req = LookupRequest::new("tenant-a", "llama-3-70b", "vllm").chain(&chain, &counts);
            black_box(idx.lookup_route(black_box(&req)))
        })
    });
    let (lfu_idx, _) = populated_with(IndexConfig::new().policy(Arc::new(Lfu)));
    g.bench_function("chain_128_blocks_64_replicas_partial_lfu_capture", |b| {
        b.iter(|| {
            let req = LookupRequest::new("tenant-a", "llama-3-70b", "vllm").chain(&chain, &counts);
            black_box(lfu_idx.lookup_route(black_box(&req)))
        })
    });
    drop(lfu_idx);
    // Hybrid models: every replica's last two held blocks are not a valid
    // match end (`PrefixEntry::no_match_end`), so each run backs off two
    // blocks after the walk.
    let (hybrid_idx, _) = populated();
    for r in 0..REPLICAS {
        let depth = 1 + (r * 2) % BLOCKS;
        for end in depth.saturating_sub(2).max(1)..=depth {
            let mut u = chain_update(r, &chain[..end]);
            u.prefixes[0].no_match_end = true;
            hybrid_idx.ingest(&u);
        }
    }
    g.bench_function(
        "chain_128_blocks_64_replicas_partial_hybrid_back_off",
        |b| {
            b.iter(|| {
                let req =
                    LookupRequest::new("tenant-a", "llama-3-70b", "vllm").chain(&chain, &counts);
                black_box(hybrid_idx.lookup_route(black_box(&req)))
            })
        },
    );
    drop(hybrid_idx);
    // The same full-attention lookup while another tenant's (hybrid)
    // partition holds marks: its walk skips the table.
    let (mixed_idx, _) = populated();
    let mut u = chain_update(0, &chain[..4]);
    u.tenant_id = "tenant-hybrid".into();
    u.prefixes[0].no_match_end = true;
    mixed_idx.ingest(&u);
    g.bench_function(
        "chain_128_blocks_64_replicas_partial_marks_elsewhere",
        |b| {
            b.iter(|| {
                let req =
                    LookupRequest::new("tenant-a", "llama-3-70b", "vllm").chain(&chain, &counts);
                black_box(mixed_idx.lookup_route(black_box(&req)))
            })
        },
    );
    drop(mixed_idx);
    let first = chain[0].clone();
    g.bench_function("exact_64_holders", |b| {
        b.iter(|| {
            let req =
                LookupRequest::<Vec<u8>>::new("tenant-a", "llama-3-70b", "vllm").exact(&first, 16);
            black_box(idx.lookup_route(black_box(&req)))
        })
    });
    let deep = chain[100].clone();
    g.bench_function("exact_14_holders", |b| {
        b.iter(|| {
            let req =
                LookupRequest::<Vec<u8>>::new("tenant-a", "llama-3-70b", "vllm").exact(&deep, 16);
            black_box(idx.lookup_route(black_box(&req)))
        })
    });
    let miss = hash(7, 7);
    g.bench_function("exact_miss_tenant_hot", |b| {
        b.iter(|| {
            let req =
                LookupRequest::<Vec<u8>>::new("tenant-a", "llama-3-70b", "vllm").exact(&miss, 16);
            black_box(idx.lookup_route(black_box(&req)))
        })
    });
    // The median `bench/peers` lookup: a 19-block request whose first block
    // 8 replicas hold and whose second block nobody does (fixed costs).
    let (short_idx, short) = first_block_held_by(8, 19);
    let short_counts = vec![16i32; short.len()];
    g.bench_function("chain_19_blocks_first_held_by_8", |b| {
        b.iter(|| {
            let req =
                LookupRequest::new("tenant-a", "llama-3-70b", "vllm").chain(&short, &short_counts);
            black_box(short_idx.lookup_route(black_box(&req)))
        })
    });
    g.finish();
}

/// `replicas` replicas each hold the first block of a `blocks`-block request
/// and a second block of their own; the request's other blocks are unheld.
fn first_block_held_by(replicas: usize, blocks: u64) -> (Index, Vec<Vec<u8>>) {
    let idx = IndexConfig::new().build();
    let request: Vec<Vec<u8>> = (0..blocks).map(|i| hash(3, i)).collect();
    for r in 0..replicas {
        let own = [request[0].clone(), hash(4, r as u64)];
        idx.ingest(&chain_update(r, &own));
    }
    (idx, request)
}

fn bench_ingest(c: &mut Criterion) {
    let (idx, chain) = populated();
    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements(BLOCKS as u64));
    let refresh = chain_update(3, &chain);
    g.bench_function("refresh_128_block_chain", |b| {
        b.iter(|| black_box(idx.ingest(black_box(&refresh))))
    });
    let mut n = 0u64;
    g.bench_function("new_128_block_chain", |b| {
        b.iter_batched(
            || {
                n += 1;
                let hs: Vec<Vec<u8>> = (0..BLOCKS as u64).map(|i| hash(50_000 + n, i)).collect();
                chain_update((n % 64) as usize, &hs)
            },
            |u| black_box(idx.ingest(&u)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// The ingest unit: one 32-block chain from one replica, refreshed
/// (every entry exists) and new (every entry is added).
fn bench_ingest_32(c: &mut Criterion) {
    let (idx, _) = populated();
    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements(32));
    let chain32: Vec<Vec<u8>> = (0..32u64).map(|i| hash(60_000, i)).collect();
    let refresh = chain_update(5, &chain32);
    idx.ingest(&refresh);
    g.bench_function("refresh_32_block_chain", |b| {
        b.iter(|| black_box(idx.ingest(black_box(&refresh))))
    });
    let mut n = 0u64;
    g.bench_function("new_32_block_chain", |b| {
        b.iter_batched(
            || {
                n += 1;
                let hs: Vec<Vec<u8>> = (0..32u64).map(|i| hash(80_000 + n, i)).collect();
                chain_update((n % 64) as usize, &hs)
            },
            |u| black_box(idx.ingest(&u)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

/// PREFIX_EVICTED: one event per block, like an engine's BlockRemoved
/// stream. Each batch re-ingests a 32-block chain (untimed) and the routine
/// removes its 32 blocks.
fn bench_remove(c: &mut Criterion) {
    let (idx, _) = populated();
    let mut g = c.benchmark_group("events");
    g.throughput(Throughput::Elements(32));
    let chain32: Vec<Vec<u8>> = (0..32u64).map(|i| hash(61_000, i)).collect();
    let evs: Vec<CacheEvent> = chain32
        .iter()
        .map(|h| CacheEvent {
            kind: EventKind::PrefixEvicted,
            replica_id: "replica-07".into(),
            model_id: "llama-3-70b".into(),
            tenant_id: "tenant-a".into(),
            prefix_hash: h.clone(),
            timestamp_us: 0,
            adapter_id: String::new(),
        })
        .collect();
    let up = chain_update(7, &chain32);
    g.bench_function("prefix_evicted_32_blocks", |b| {
        b.iter_batched(
            || {
                idx.ingest(&up);
            },
            |()| {
                for e in &evs {
                    black_box(idx.apply_event(black_box(e)));
                }
            },
            criterion::BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// A full TTL sweep over ~266k entries where nothing expires: the cost of the
/// walk (each of the 64 shard write locks is held for ~1/64 of it).
fn bench_sweep(c: &mut Criterion) {
    let (idx, _) = populated();
    let mut g = c.benchmark_group("sweep");
    g.bench_function("266k_entries_nothing_expired", |b| {
        b.iter(|| black_box(idx.sweep()))
    });
    g.finish();
}

struct Lfu;

impl PolicyResolver for Lfu {
    fn eviction_algorithm(&self, _tenant: &str) -> inferencecache_index::EvictionAlgorithm {
        inferencecache_index::EvictionAlgorithm::Lfu
    }
}

struct QuotaA;

impl PolicyResolver for QuotaA {
    fn tenant_quota(&self, tenant: &str) -> Option<i64> {
        (tenant == "tenant-a").then_some(100_000)
    }
}

/// Tenant at its 100k-prefix quota in a ~360k-entry index: every new chain
/// evicts 128 of its oldest prefixes.
fn bench_quota(c: &mut Criterion) {
    let idx = IndexConfig::new().policy(Arc::new(QuotaA)).build();
    for r in 0..REPLICAS {
        // Another tenant's background, and tenant-a filling its quota.
        let bg: Vec<Vec<u8>> = (0..4096u64).map(|i| hash(3000 + r as u64, i)).collect();
        let mut u = chain_update(r, &bg);
        u.tenant_id = "tenant-b".into();
        idx.ingest(&u);
        let own: Vec<Vec<u8>> = (0..1600u64).map(|i| hash(4000 + r as u64, i)).collect();
        idx.ingest(&chain_update(r, &own));
    }
    let mut g = c.benchmark_group("ingest");
    g.throughput(Throughput::Elements(BLOCKS as u64));
    let mut n = 0u64;
    g.bench_function("new_128_block_chain_at_tenant_quota", |b| {
        b.iter_batched(
            || {
                n += 1;
                let hs: Vec<Vec<u8>> = (0..BLOCKS as u64).map(|i| hash(70_000 + n, i)).collect();
                chain_update((n % 64) as usize, &hs)
            },
            |u| black_box(idx.ingest(&u)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();
}

fn bench_concurrent(c: &mut Criterion) {
    let (idx, chain) = populated();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let idx = idx.clone();
        let stop = stop.clone();
        let chain = chain.clone();
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                // Refresh the shared chain and add fresh blocks, like a live engine.
                idx.ingest(&chain_update(
                    (n % 64) as usize,
                    &chain[..1 + (n as usize * 2) % BLOCKS],
                ));
                let hs: Vec<Vec<u8>> = (0..16u64).map(|i| hash(90_000 + n, i)).collect();
                idx.ingest(&chain_update((n % 64) as usize, &hs));
                n += 1;
            }
            n
        })
    };
    let counts = vec![16i32; BLOCKS];
    let mut g = c.benchmark_group("lookup_under_ingest");
    g.bench_function("chain_128_blocks_64_replicas_partial", |b| {
        b.iter(|| {
            let req = LookupRequest::new("tenant-a", "llama-3-70b", "vllm").chain(&chain, &counts);
            black_box(idx.lookup_route(black_box(&req)))
        })
    });
    g.finish();
    stop.store(true, Ordering::Relaxed);
    let updates = writer.join().unwrap();
    eprintln!("lookup_under_ingest: background writer applied {updates} updates");
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|x| x.parse::<u64>().ok())
        })
        .map_or(0, |pages| pages * 4096)
}

/// Not a timing: resident bytes per distinct key and per extra holder.
/// `INDEX_BENCH_MEM_ENTRIES` (default 1,000,000) replica x prefix entries are
/// built as `entries / INDEX_BENCH_MEM_HOLDERS` (default 4) keys: first every
/// key with one holder (bytes per distinct key), then the other holders
/// (bytes per extra holder). One layout per process for clean RSS deltas.
fn memory_report(_c: &mut Criterion) {
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(d)
    };
    let entries = env("INDEX_BENCH_MEM_ENTRIES", 1_000_000);
    let holders = env("INDEX_BENCH_MEM_HOLDERS", 4).max(1) as usize;
    let keys = entries / holders as u64;
    let idx = IndexConfig::new().max_entries(0).build();
    let fill = |r: usize| {
        for chunk in 0..keys.div_ceil(1000) {
            let hs: Vec<Vec<u8>> = (chunk * 1000..((chunk + 1) * 1000).min(keys))
                .map(|i| hash(7, i))
                .collect();
            idx.ingest(&chain_update(r, &hs));
        }
    };
    let before = rss_bytes();
    fill(0);
    let one = rss_bytes();
    for r in 1..holders {
        fill(r);
    }
    let all = rss_bytes();
    let per_key = one.saturating_sub(before) as f64 / keys as f64;
    let extra = (holders as u64 - 1) * keys;
    let per_extra = if extra > 0 {
        all.saturating_sub(one) as f64 / extra as f64
    } else {
        0.0
    };
    eprintln!(
        "memory: {keys} keys x {holders} replicas = {} entries: {per_key:.1} bytes per distinct key \
         (one holder), {per_extra:.1} bytes per extra holder, {:.1} bytes per entry overall",
        idx.total_entries(),
        all.saturating_sub(before) as f64 / idx.total_entries() as f64
    );
}

/// Blocks each replica of [`fleet_of`] holds (`bench/peers`' cache size).
const FLEET_BLOCKS: u64 = 16_384;

/// `replicas` replicas each hold [`FLEET_BLOCKS`] blocks: the first
/// `1 + (i * 3) % 32` blocks of a shared 32-block request and the rest in
/// 1,024-block chains of their own.
fn fleet_of(replicas: usize) -> (Index, Vec<Vec<u8>>) {
    let idx = IndexConfig::new().max_entries(0).build();
    let request: Vec<Vec<u8>> = (0..32u64).map(|i| hash(5, i)).collect();
    for r in 0..replicas {
        idx.ingest(&chain_update(r, &request[..1 + (r * 3) % 32]));
        for c in 0..FLEET_BLOCKS / 1024 {
            let own: Vec<Vec<u8>> = (0..1024u64)
                .map(|i| hash(6_000 + (r as u64) * 64 + c, i))
                .collect();
            idx.ingest(&chain_update(r, &own));
        }
    }
    (idx, request)
}

/// The default path against the contract lookup, one 32-block request, at 1,
/// 16 and 256 replicas x 16,384 blocks (issue 36's scales). The default
/// path's deliveries renew the same tentative holdings and queue work on
/// the pick (real time drains it).
fn bench_default_path(c: &mut Criterion) {
    let mut g = c.benchmark_group("default_path");
    let counts = vec![16i32; 32];
    for replicas in [1usize, 16, 256] {
        let (idx, request) = fleet_of(replicas);
        let seed = chain_seed(&request);
        g.bench_function(
            format!("contract_lookup_32_blocks_{replicas}_replicas_x_16384"),
            |b| {
                b.iter(|| {
                    let req = LookupRequest::new("tenant-a", "llama-3-70b", "vllm")
                        .chain(&request, &counts);
                    black_box(idx.lookup_route(black_box(&req)))
                })
            },
        );
        let params = RouteParams {
            weights: TtftWeights::default(),
            min_matched_tokens: 0,
            ignore_matches: false,
            seed: &seed,
        };
        g.bench_function(
            format!("route_and_delivery_32_blocks_{replicas}_replicas_x_16384"),
            |b| {
                b.iter(|| {
                    let req = LookupRequest::new("tenant-a", "llama-3-70b", "vllm")
                        .chain(&request, &counts);
                    let route = idx.route_ttft(black_box(&req), &params);
                    if let Some(d) = &route.delivery {
                        idx.record_delivery(&req, d, params.weights.tentative_ttl);
                    }
                    black_box(route)
                })
            },
        );
    }
    g.finish();
}

/// The h2load rig's workload (`bench/h2load/frames.py`, `REPLICAS=64`): 64
/// replicas, replica r holding the first `32 * (r + 1) / 64` blocks of one
/// 32-block request (nested prefixes: every replica matches), the same
/// request looked up again and again. The default path's deliveries queue
/// work on each pick, so within a few lookups every replica is busy and the
/// picks rotate over the fleet (what the server sees under h2load).
fn bench_nested(c: &mut Criterion) {
    const NESTED: usize = 64;
    let mut g = c.benchmark_group("default_path");
    let idx = IndexConfig::new().build();
    let request: Vec<Vec<u8>> = (0..32u64)
        .map(|i| (0xB10C_0000 + i).to_be_bytes().to_vec())
        .collect();
    for r in 0..NESTED {
        let n = (32 * (r + 1) / NESTED).max(1);
        let mut u = chain_update(r, &request[..n]);
        u.replica_id = format!("replica-{r}");
        (u.model_id, u.tenant_id, u.stats) = ("m".into(), "t".into(), None);
        idx.ingest(&u);
    }
    let counts = vec![16i32; 32];
    let seed = chain_seed(&request);
    // By id, both: the server's calls (no reference count per score).
    g.bench_function("contract_lookup_32_blocks_64_nested", |b| {
        b.iter(|| {
            let req = LookupRequest::new("t", "m", "vllm").chain(&request, &counts);
            black_box(idx.lookup_route_by_id(black_box(&req)))
        })
    });
    let params = RouteParams {
        weights: TtftWeights::default(),
        min_matched_tokens: 0,
        ignore_matches: false,
        seed: &seed,
    };
    // `NESTED_CPU=N`: both paths N lookups each, three rounds alternating,
    // timed in this thread's CPU time (`/proc/thread-self/schedstat`), not
    // wall time: on the shared, loaded host wall time mostly measures the
    // other processes.
    if let Some(n) = std::env::var("NESTED_CPU")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
    {
        let cpu_ns = || -> u64 {
            std::fs::read_to_string("/proc/thread-self/schedstat")
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        for round in 0..3 {
            let t = cpu_ns();
            for _ in 0..n {
                let req = LookupRequest::new("t", "m", "vllm").chain(&request, &counts);
                black_box(idx.lookup_route_by_id(black_box(&req)));
            }
            let contract = (cpu_ns() - t) as f64 / f64::from(n);
            let t = cpu_ns();
            for _ in 0..n {
                let req = LookupRequest::new("t", "m", "vllm").chain(&request, &counts);
                let route = idx.route_ttft_by_id(black_box(&req), &params);
                if let Some(d) = &route.delivery {
                    idx.record_delivery(&req, d, params.weights.tentative_ttl);
                }
                black_box(route);
            }
            let default = (cpu_ns() - t) as f64 / f64::from(n);
            eprintln!(
                "nested cpu round {round}: contract {contract:.0} ns, default {default:.0} ns, \
                 {:.2}x",
                default / contract
            );
        }
    }
    g.bench_function("route_and_delivery_32_blocks_64_nested", |b| {
        b.iter(|| {
            let req = LookupRequest::new("t", "m", "vllm").chain(&request, &counts);
            let route = idx.route_ttft_by_id(black_box(&req), &params);
            if let Some(d) = &route.delivery {
                idx.record_delivery(&req, d, params.weights.tentative_ttl);
            }
            black_box(route)
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = memory_report, bench_nested, bench_default_path, bench_lookup, bench_ingest, bench_ingest_32, bench_remove, bench_quota, bench_sweep, bench_concurrent
}
criterion_main!(benches);

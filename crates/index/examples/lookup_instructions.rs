//! A fixed number of lookups of one kind, for instruction counts under
//! callgrind (repeatable on a noisy machine, unlike times):
//!
//! ```sh
//! cargo build --release --example lookup_instructions -p inferencecache-index
//! valgrind --tool=callgrind target/release/examples/lookup_instructions chain19 0
//! valgrind --tool=callgrind target/release/examples/lookup_instructions chain19 100000
//! ```
//!
//! The difference of the two totals over 100,000 is the instructions per
//! lookup. Kinds: `chain19` (the median `bench/peers` lookup: 19 blocks,
//! the first held by 8 replicas), `chain128` (128 blocks, 64 replicas at
//! depths 1..127) and `exact64` (one key held by 64 replicas). No replica
//! reports stats, as in `bench/peers`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// The benches' random hashes (their criterion settings go unused here).
#[path = "../benches/common/mod.rs"]
#[allow(dead_code)]
mod common;

use inferencecache_index::{CacheUpdate, Index, IndexConfig, LookupRequest, PrefixEntry};
use std::hint::black_box;

fn hash(seed: u64, i: u64) -> Vec<u8> {
    common::splitmix(seed, i).to_be_bytes().to_vec()
}

fn store(idx: &Index, replica: usize, hashes: &[Vec<u8>]) {
    idx.ingest(&CacheUpdate {
        replica_id: format!("replica-{replica:02}"),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            block_hashes: hashes.to_vec(),
            block_token_counts: vec![16; hashes.len()],
            ..PrefixEntry::default()
        }],
        ..CacheUpdate::default()
    });
}

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "chain19".into());
    let n: u64 = args.next().map_or(100_000, |s| s.parse().expect("a count"));
    let idx = IndexConfig::new().build();
    let (request, exact) = match kind.as_str() {
        "chain19" => {
            let request: Vec<Vec<u8>> = (0..19).map(|i| hash(3, i)).collect();
            for r in 0..8 {
                store(&idx, r, &[request[0].clone(), hash(4, r as u64)]);
            }
            (request, false)
        }
        "chain128" | "exact64" => {
            let chain: Vec<Vec<u8>> = (0..128).map(|i| hash(1, i)).collect();
            for r in 0..64 {
                store(&idx, r, &chain[..1 + (r * 2) % 128]);
            }
            (chain, kind == "exact64")
        }
        other => panic!("unknown kind {other}: chain19, chain128 or exact64"),
    };
    let counts = vec![16i32; request.len()];
    let mut matched = 0usize;
    for _ in 0..n {
        let r = if exact {
            let req = LookupRequest::<Vec<u8>>::new("t", "m", "vllm").exact(&request[0], 16);
            idx.lookup_route(black_box(&req))
        } else {
            let req = LookupRequest::new("t", "m", "vllm").chain(&request, &counts);
            idx.lookup_route(black_box(&req))
        };
        matched += r.scores.len();
    }
    println!("{kind}: {n} lookups, {matched} scores");
}

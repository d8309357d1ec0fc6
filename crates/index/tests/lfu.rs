//! Index behaviour tests: lfu.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;
use std::sync::Arc;

fn hit(e: &Env, hash: u64, times: usize) {
    for _ in 0..times {
        let r = e.exact("t", "m", "vllm", hash);
        e.idx.credit(&r.hits);
    }
}

#[test]
fn evict_by_lfu_evicts_lowest_count_first() {
    let e = Env::with(|c| c.max_entries(3));
    e.pol.set_lfu("t");
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.advance(MIN);
    e.put("t", "m", "vllm", "r1", &[(2, 16)]);
    e.advance(MIN);
    e.put("t", "m", "vllm", "r1", &[(3, 16)]);
    hit(&e, 1, 3);
    hit(&e, 3, 1);
    let out = e.put("t", "m", "vllm", "r1", &[(4, 16)]);
    // The new entry (count 0, newest) vs 2 (count 0, older): 2 goes.
    assert_eq!(out.evictions.cap_lfu, 1);
    assert!(e.exact("t", "m", "vllm", 2).scores.is_empty());
    assert_eq!(e.exact("t", "m", "vllm", 1).scores.len(), 1);
}

fn count(e: &Env, hash: u64) -> u64 {
    e.idx
        .access_count("t", "m", "vllm", "", &h(hash), "r1")
        .unwrap()
}

#[test]
fn evict_by_lfu_tie_breaks_on_last_seen_ascending() {
    let e = Env::with(|c| c.max_entries(2));
    e.pol.set_lfu("t");
    e.put("t", "m", "vllm", "r1", &[(2, 16)]);
    e.advance(MIN);
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.advance(MIN);
    // Equal counts (0): the older lastSeen (hash 2) goes, not the smaller hash.
    let out = e.put("t", "m", "vllm", "r1", &[(3, 16)]);
    assert_eq!(out.evictions.cap_lfu, 1);
    assert!(e.exact("t", "m", "vllm", 2).scores.is_empty());
    assert_eq!(e.exact("t", "m", "vllm", 1).scores.len(), 1);
    assert_eq!(e.exact("t", "m", "vllm", 3).scores.len(), 1);
}

#[test]
fn eviction_policy_switch_selects_different_victims() {
    let run = |lfu: bool| {
        let e = Env::with(|c| c.max_entries(2));
        e.pol.set_lfu("t");
        e.put("t", "m", "vllm", "r1", &[(1, 16)]);
        e.advance(MIN);
        e.put("t", "m", "vllm", "r1", &[(2, 16)]);
        hit(&e, 1, 5);
        if !lfu {
            e.pol.set_lru("t");
        }
        e.advance(MIN);
        let out = e.put("t", "m", "vllm", "r1", &[(3, 16)]);
        let survivors: Vec<u64> = [1, 2, 3]
            .into_iter()
            .filter(|&x| !e.exact("t", "m", "vllm", x).scores.is_empty())
            .collect();
        (out.evictions, survivors)
    };
    let (ev, s) = run(true);
    assert_eq!(ev.cap_lfu, 1);
    assert_eq!(s, vec![1, 3]); // 2 (count 0) is older than newcomer 3 (count 0)
    let (ev, s) = run(false);
    assert_eq!(ev.cap_lru, 1);
    assert_eq!(s, vec![2, 3]);
}

#[test]
fn lfu_counter_atomicity_under_concurrent_lookups() {
    let e = Arc::new(Env::new());
    e.pol.set_lfu("t");
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    let ts: Vec<_> = (0..4)
        .map(|_| {
            let e = e.clone();
            std::thread::spawn(move || hit(&e, 1, 250))
        })
        .collect();
    for t in ts {
        t.join().unwrap();
    }
    assert_eq!(count(&e, 1), 1000);
}

#[test]
fn delivered_hits_count_for_lru_tenants_too() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    let r = e.exact("t", "m", "vllm", 1);
    assert_eq!(r.hits.len(), 1, "LRU tenants capture hits too");
    assert_eq!(
        e.idx.cache_state("t", "m").hot_prefixes,
        0,
        "not yet delivered"
    );
    e.idx.credit(&r.hits);
    assert_eq!(count(&e, 1), 1);
    assert_eq!(e.idx.cache_state("t", "m").hot_prefixes, 1);
    // Zero-token entries are not captured.
    e.put("t", "m", "vllm", "r1", &[(2, 0)]);
    assert!(e.exact("t", "m", "vllm", 2).hits.is_empty());
}

#[test]
fn lru_eviction_ignores_the_access_counts() {
    let e = Env::with(|c| c.max_entries(1));
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    hit(&e, 1, 5);
    e.advance(MIN);
    e.put("t", "m", "vllm", "r1", &[(2, 16)]);
    // LRU: the older entry goes, however often it was hit.
    assert!(e.exact("t", "m", "vllm", 1).scores.is_empty());
    assert_eq!(e.exact("t", "m", "vllm", 2).scores.len(), 1);
}

#[test]
fn lfu_counter_survives_reingest() {
    let e = Env::with(|c| c.max_entries(1));
    e.pol.set_lfu("t");
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    hit(&e, 1, 2);
    e.advance(MIN);
    e.put("t", "m", "vllm", "r1", &[(1, 16)]); // refresh keeps the count
    assert_eq!(count(&e, 1), 2);
    e.advance(MIN);
    e.put("t", "m", "vllm", "r1", &[(2, 16)]);
    assert_eq!(e.exact("t", "m", "vllm", 1).scores.len(), 1);
}

#[test]
fn lfu_counter_bumps_every_block_in_a_chain_hit() {
    let e = Env::new();
    e.pol.set_lfu("t");
    e.put_chain("t", "m", "vllm", "r1", &[1, 2, 3], &[16; 3]);
    let r = e.chain("t", "m", "vllm", &[1, 2, 9], &[16; 3]);
    assert_eq!(r.hit_entries(), 2);
    // Not delivered: nothing credited.
    assert_eq!(count(&e, 1), 0);
    e.idx.credit(&r.hits);
    assert_eq!((count(&e, 1), count(&e, 2), count(&e, 3)), (1, 1, 0));
    assert_eq!(e.idx.cache_state("t", "m").hot_prefixes, 2);
}

#[test]
fn index_eviction_metric_labels() {
    let e = Env::with(|c| c.max_entries(2));
    e.pol.set_lfu("f");
    e.put("f", "m", "vllm", "r1", &[(1, 16)]);
    e.put("l", "m", "vllm", "r1", &[(1, 16)]);
    e.advance(MIN);
    let out = e.put("l", "m", "vllm", "r1", &[(2, 16), (3, 16)]);
    assert_eq!(out.evictions.cap_total(), 2);
    assert_eq!(out.evictions.cap_lfu, 1);
    assert_eq!(out.evictions.cap_lru, 1);
    assert_eq!(EvictionAlgorithm::Lfu.label(), "lfu");
    assert_eq!(EvictionAlgorithm::Lru.label(), "lru");
    e.advance(40 * MIN);
    let out = e.idx.sweep();
    assert_eq!((out.evictions.ttl_lru, out.evictions.ttl_lfu), (2, 0));
}

#[test]
fn lfu_chain_hit_counts_every_block_of_the_run() {
    let e = Env::new();
    e.pol.set_lfu("t");
    let mut a = legacy(1, 0);
    a.tier = Tier::from_wire(-1);
    let mut b = legacy(0, 0);
    b.tier = Tier::from_wire(-1);
    e.idx.ingest(&upd("t", "m", "vllm", "r1", vec![a, b]));
    let hs = vec![h(0), h(1)];
    let r = e.idx.lookup_route(
        &LookupRequest::new("t", "m", "vllm")
            .exact(&h(0), 0)
            .chain(&hs, &[0, 1]),
    );
    assert_eq!(r.scores[0].matched_tokens, 1);
    assert_eq!(r.hit_entries(), 2, "{:?}", r.hits);
}

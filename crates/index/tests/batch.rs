//! `Index::apply_batch`: writes in order, budgets once at the end, a refused
//! store ends the batch.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;

fn evicted(replica: &str, hash: u64) -> CacheEvent {
    CacheEvent {
        kind: EventKind::PrefixEvicted,
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        prefix_hash: h(hash),
        timestamp_us: 0,
        adapter_id: String::new(),
    }
}

fn store(replica: &str, hashes: &[u64]) -> CacheUpdate {
    upd(
        "t",
        "m",
        "vllm",
        replica,
        hashes.iter().map(|&x| legacy(x, 16)).collect(),
    )
}

#[test]
fn the_cap_is_enforced_once_after_the_whole_batch() {
    let e = Env::with(|c| c.max_entries(3));
    let (a, b) = (store("r1", &[1, 2, 3]), store("r1", &[4, 5]));
    let (x, y) = (evicted("r1", 4), evicted("r1", 5));
    // Over the cap after the second store, back under it after the removals:
    // applied one by one the cap would have evicted two entries.
    let out = e.idx.apply_batch([
        BatchWrite::Store(&a),
        BatchWrite::Store(&b),
        BatchWrite::Event(&x),
        BatchWrite::Event(&y),
    ]);
    assert_eq!((out.stores, out.events, out.refused_at), (2, 2, None));
    assert_eq!(out.ingest.entries_added, 5);
    assert_eq!(out.event.entries_removed, 2);
    assert_eq!(out.ingest.evictions.cap_total(), 0);
    assert_eq!(e.idx.total_entries(), 3);

    // Over it at the end: the oldest entries go, as a sweep would pick them.
    e.advance(MIN);
    let c = store("r2", &[6, 7]);
    let out = e.idx.apply_batch([BatchWrite::Store(&c)]);
    assert_eq!(out.ingest.evictions.cap_total(), 2);
    assert_eq!(e.idx.total_entries(), 3);
}

#[test]
fn a_store_refused_at_the_replica_limit_ends_the_batch() {
    let e = Env::with(|c| c.max_replicas(1));
    let (a, b, c) = (store("r1", &[1]), store("r2", &[2]), store("r1", &[3]));
    let out = e.idx.apply_batch([
        BatchWrite::Store(&a),
        BatchWrite::Store(&b),
        BatchWrite::Store(&c),
    ]);
    assert_eq!(out.refused_at, Some(1));
    assert_eq!(out.stores, 1);
    assert!(out.ingest.refused_replica_limit);
    assert_eq!(e.idx.total_entries(), 1, "nothing after the refused store");
}

#[test]
fn an_eviction_burst_equals_its_events_one_by_one() {
    let (one, burst) = (Env::new(), Env::new());
    for e in [&one, &burst] {
        e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16), (3, 16)]);
        e.put("t", "m", "vllm", "r2", &[(1, 16)]);
    }
    let evs = [
        evicted("r1", 1),
        evicted("r1", 3),
        evicted("r9", 2),
        evicted("r1", 7),
    ];
    let removed: u64 = evs
        .iter()
        .map(|ev| one.idx.apply_event(ev).entries_removed)
        .sum();
    let out = burst.idx.apply_batch(evs.iter().map(BatchWrite::Event));
    assert_eq!(out.event.entries_removed, removed);
    assert_eq!(removed, 2);
    assert_eq!(burst.idx.total_entries(), one.idx.total_entries());
    assert_eq!(burst.idx.distinct_prefixes(), one.idx.distinct_prefixes());
}

//! Index behaviour tests: quota.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;
use std::sync::Arc;

#[test]
fn tenant_quota_counts_multi_replica_prefix_once() {
    let e = Env::new();
    e.pol.set_quota("t", 2);
    e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    let out = e.put("t", "m", "vllm", "r2", &[(1, 16), (2, 16)]);
    assert!(out.evictions.quota.is_empty());
    assert_eq!(e.idx.total_entries(), 4);
}

#[test]
fn tenant_quota_evicts_oldest_over_entry_budget() {
    let e = Env::new();
    e.pol.set_quota("t", 2);
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.advance(MIN);
    e.put("t", "m", "vllm", "r1", &[(2, 16)]);
    e.advance(MIN);
    e.put("t", "m", "vllm", "r2", &[(1, 16)]); // key 1's age is its NEWEST lastSeen: T0+2m
    e.advance(MIN);
    let out = e.put("t", "m", "vllm", "r1", &[(3, 16)]);
    assert_eq!(out.evictions.quota, vec![(Arc::from("t"), 1)]);
    assert!(e.exact("t", "m", "vllm", 2).scores.is_empty());
    assert_eq!(ids(&e.exact("t", "m", "vllm", 1)), vec!["r1", "r2"]);
    assert_eq!(e.idx.cache_state("t", "m").total_prefixes, 2);
    assert_eq!(e.idx.total_entries(), 3);
}

#[test]
fn tenant_quota_drops_every_replica_of_a_victim_key() {
    let e = Env::new();
    e.pol.set_quota("t", 1);
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.put("t", "m", "vllm", "r2", &[(1, 16)]);
    e.advance(MIN);
    let out = e.put("t", "m", "vllm", "r1", &[(2, 16)]);
    assert_eq!(out.evictions.quota, vec![(Arc::from("t"), 1)]);
    assert_eq!(out.evictions.cap_total(), 0);
    assert_eq!(e.idx.total_entries(), 1);
    assert_eq!(ids(&e.exact("t", "m", "vllm", 2)), vec!["r1"]);
}

#[test]
fn tenant_quota_no_op_when_under_budget() {
    let e = Env::new();
    e.pol.set_quota("t", 5);
    let out = e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    assert!(out.evictions.quota.is_empty());
}

#[test]
fn tenant_quota_fails_open_without_resolver_entry() {
    let e = Env::new();
    e.pol.set_quota("other", 0);
    e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    assert_eq!(e.idx.total_entries(), 2);
}

#[test]
fn tenant_quota_nil_resolver_never_enforces() {
    let idx = Index::default();
    for i in 0..10 {
        idx.ingest(&upd("t", "m", "vllm", "r1", vec![legacy(i, 16)]));
    }
    assert_eq!(idx.distinct_prefixes(), 10);
}

#[test]
fn tenant_quota_negative_budget_skips_enforcement() {
    let e = Env::new();
    e.pol.set_quota("t", -1);
    e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    assert_eq!(e.idx.total_entries(), 2);
}

#[test]
fn tenant_quota_is_per_tenant_scoped() {
    let e = Env::new();
    e.pol.set_quota("a", 1);
    e.put("b", "m", "vllm", "r1", &[(1, 16), (2, 16), (3, 16)]);
    e.put("a", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    assert!(e.idx.has_any_for_tenant("a"));
    assert_eq!(
        e.idx.aggregate().per_tenant,
        vec![(Arc::from("a"), 1), (Arc::from("b"), 3)]
    );
}

#[test]
fn tenant_quota_zero_budget_evicts_all() {
    let e = Env::new();
    e.pol.set_quota("t", 0);
    let out = e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    assert_eq!(out.evictions.quota, vec![(Arc::from("t"), 2)]);
    assert_eq!(e.idx.total_entries(), 0);
}

#[test]
fn tenant_quota_runs_on_stats_only_updates() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    e.pol.set_quota("t", 1);
    e.stats("t", "m", "r1", 0.5, 0.0);
    assert_eq!(e.idx.distinct_prefixes(), 1);
}

#[test]
fn tenant_quota_tie_break_is_deterministic_across_full_key() {
    // Same age everywhere: model, scheme, adapter, hash decide.
    let e = Env::new();
    e.pol.set_quota("t", 1);
    let mut u = upd("t", "m2", "vllm", "r1", vec![legacy(1, 16)]);
    u.timestamp_us = T0 / 1000;
    e.idx.ingest(&u);
    let mut u = upd("t", "m1", "vllm", "r1", vec![legacy(9, 16)]);
    u.timestamp_us = T0 / 1000;
    e.idx.ingest(&u);
    // m1 < m2: the m1 key goes.
    assert!(e.idx.has_any_for_tenant_model("t", "m2"));
    assert!(!e.idx.has_any_for_tenant_model("t", "m1"));
    let mut u = upd("t", "m2", "sglang", "r1", vec![legacy(0, 16)]);
    u.timestamp_us = T0 / 1000;
    e.idx.ingest(&u);
    // same model: scheme "sglang" < "vllm".
    assert!(e.idx.has_any_for_tenant_model_scheme("t", "m2", "vllm"));
    let mut p = legacy(0, 16);
    p.adapter_id = "a".into();
    let mut u = upd("t", "m2", "vllm", "r1", vec![p]);
    u.timestamp_us = T0 / 1000;
    e.idx.ingest(&u);
    // adapter "" < "a": the base key (hash 1) goes, the adapter key stays.
    assert!(e.exact("t", "m2", "vllm", 1).scores.is_empty());
    assert_eq!(e.idx.distinct_prefixes(), 1);
}

fn put_at(e: &Env, replica: &str, hash: u64, offset_s: i64) {
    let mut u = upd("t", "m", "vllm", replica, vec![legacy(hash, 16)]);
    u.timestamp_us = T0 / 1000 + offset_s * 1_000_000;
    e.idx.ingest(&u);
}

/// A key outside the quota reserve whose age drops below the reserve's
/// threshold (its newest holder left) must become the next victim.
fn quota_reserve_tracks_age_drop(kind: EventKind) {
    let e = Env::with(|c| c.cap_reserve(2));
    e.advance(10 * MIN);
    e.pol.set_quota("t", 3);
    put_at(&e, "r1", 1, 120);
    put_at(&e, "r1", 2, 60);
    put_at(&e, "r1", 3, 30);
    put_at(&e, "r2", 3, 180); // key 3's age is 180 s
    put_at(&e, "r1", 4, 240); // over: reserve {2, 1}, key 2 goes
    assert!(e.exact("t", "m", "vllm", 2).scores.is_empty());
    let hash = (kind == EventKind::PrefixEvicted).then_some(3);
    e.event(kind, "t", "m", "r2", hash, "");
    // Key 3's age is now 30 s: older than key 1 (120 s).
    put_at(&e, "r1", 5, 300);
    assert!(e.exact("t", "m", "vllm", 3).scores.is_empty());
    assert_eq!(e.exact("t", "m", "vllm", 1).scores.len(), 1);
}

#[test]
fn tenant_quota_reserve_tracks_age_drop_after_prefix_evicted() {
    quota_reserve_tracks_age_drop(EventKind::PrefixEvicted);
}

#[test]
fn tenant_quota_reserve_tracks_age_drop_after_all_cleared() {
    quota_reserve_tracks_age_drop(EventKind::AllCleared);
}

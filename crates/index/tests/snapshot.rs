//! Index behaviour tests: snapshot.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;
use std::sync::Arc;

#[test]
fn snapshot_entry_invariant() {
    let e = Env::new();
    e.put("a", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    e.put("a", "m", "vllm", "r2", &[(1, 16)]);
    e.put("b", "m2", "sglang", "r1", &[(3, 16)]);
    e.put("", "m", "vllm", "r1", &[(4, 16)]);
    let s = e.idx.snapshot();
    let sum: i64 = s.tenants.iter().map(|t| t.index_entries).sum();
    assert_eq!(sum, s.total_prefixes);
    assert_eq!(s.total_prefixes, 4);
    let agg = e.idx.aggregate();
    assert_eq!(agg.total, 4);
    assert_eq!(agg.per_tenant[0], (Arc::from(""), 1));
}

#[test]
fn reserved_tenant_hidden_from_cap_and_aggregate() {
    let e = Env::with(|c| c.max_entries(2));
    e.put(
        PROBE_TENANT,
        "m",
        "vllm",
        "p",
        &[(10, 16), (11, 16), (12, 16)],
    );
    e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    // Reserved entries count in totals but not in cap math.
    assert_eq!(e.idx.total_entries(), 5);
    let out = e.put("t", "m", "vllm", "r1", &[(3, 16)]);
    assert_eq!(out.evictions.cap_total(), 1);
    assert_eq!(e.idx.total_entries(), 5);
    assert!(e.idx.has_any_for_tenant(PROBE_TENANT));
    let agg = e.idx.aggregate();
    assert_eq!(agg.total, 2);
    assert_eq!(agg.per_tenant.len(), 1);
    let s = e.idx.snapshot();
    assert!(s.replicas.iter().all(|r| &*r.tenant != PROBE_TENANT));
    assert!(s.tenants.iter().all(|t| &*t.tenant_id != PROBE_TENANT));
}

#[test]
fn snapshot_carries_t2_counters() {
    let e = Env::new();
    let mut u = upd("t", "m", "vllm", "r1", vec![legacy(1, 16)]);
    u.stats = Some(ReplicaStatsReport {
        t2_hit_tokens: 7,
        t2_query_tokens: 11,
        client_version: "vllm-0.9".into(),
        cache_memory_bytes: 123,
        ..Default::default()
    });
    e.idx.ingest(&u);
    let s = e.idx.snapshot();
    assert_eq!(s.replicas.len(), 1);
    assert_eq!(s.replicas[0].t2_hit_tokens, 7);
    assert_eq!(s.replicas[0].t2_query_tokens, 11);
    assert_eq!(s.replicas[0].cache_memory_bytes, 123);
    assert_eq!(&*s.replicas[0].client_version, "vllm-0.9");
    assert_eq!(
        &*e.idx.cache_state("t", "m").replicas[0].client_version,
        "vllm-0.9"
    );
}

#[test]
fn snapshot_aggregates() {
    let e = Env::new();
    e.put("a", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    e.advance(MIN);
    e.put("a", "m2", "vllm", "r1", &[(1, 16)]);
    e.stats("a", "m", "r1", 0.2, 0.0);
    e.stats("a", "m", "r2", 0.6, 0.0);
    e.advance(MIN);
    e.stats("a", "m2", "r1", 0.4, 0.0);
    let s = e.idx.snapshot();
    assert_eq!(s.replicas.len(), 2);
    let r1 = &s.replicas[0];
    assert_eq!(&*r1.replica_id, "r1");
    assert_eq!(r1.prefix_count, 3);
    assert_eq!(r1.last_event_at_ns, Some(T0 + 60_000_000_000));
    assert_eq!(r1.hit_rate, 0.4); // latest across models
    assert_eq!(r1.last_update_ns, Some(T0 + 120_000_000_000));
    let r2 = &s.replicas[1];
    assert_eq!(r2.prefix_count, 0);
    assert_eq!(r2.last_event_at_ns, None);
    assert_eq!(s.tenants.len(), 1);
    assert_eq!(s.tenants[0].index_entries, 3);
    assert!(s.tenants[0].hit_rate_reported);
    assert_eq!(s.tenants[0].hit_rate, 0.5);
    assert_eq!(s.tenants[0].memory_used, 0);
    assert_eq!(s.hot_prefixes, 0);
}

#[test]
fn snapshot_presence_bits_distinguish_absent_from_zero() {
    let e = Env::new();
    e.put("a", "m", "vllm", "r1", &[(1, 16)]);
    e.stats("b", "m", "r2", 0.0, 0.0);
    let s = e.idx.snapshot();
    let r1 = s.replicas.iter().find(|r| &*r.replica_id == "r1").unwrap();
    assert!(!r1.stats_reported);
    assert_eq!(r1.last_update_ns, None);
    let r2 = s.replicas.iter().find(|r| &*r.replica_id == "r2").unwrap();
    assert!(r2.stats_reported);
    assert_eq!(r2.hit_rate, 0.0);
    let ta = s.tenants.iter().find(|t| &*t.tenant_id == "a").unwrap();
    assert!(!ta.hit_rate_reported);
    let tb = s.tenants.iter().find(|t| &*t.tenant_id == "b").unwrap();
    assert!(tb.hit_rate_reported);
    assert_eq!(tb.index_entries, 0);
}

#[test]
fn empty_snapshot() {
    let e = Env::new();
    assert_eq!(e.idx.snapshot(), Snapshot::default());
}

#[test]
fn cache_state_counts_all_schemes_and_adapters() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    e.put("t", "m", "sglang", "r2", &[(1, 16)]);
    let mut p = legacy(1, 16);
    p.adapter_id = "lora".into();
    e.idx.ingest(&upd("t", "m", "vllm", "r1", vec![p]));
    e.stats("t", "m", "r2", 0.1, 0.0);
    e.stats("t", "m", "r1", 0.1, 0.0);
    let s = e.idx.cache_state("t", "m");
    assert_eq!(s.total_prefixes, 4);
    assert_eq!(
        s.replicas
            .iter()
            .map(|r| r.replica_id.to_string())
            .collect::<Vec<_>>(),
        vec!["r1", "r2"]
    );
    assert_eq!(s.hot_prefixes, 0);
    assert_eq!(e.idx.cache_state("t", "other"), CacheState::default());
}

#[test]
fn hot_prefixes_count_delivered_lfu_hits() {
    let e = Env::new();
    e.pol.set_lfu("t");
    e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16), (3, 16)]);
    e.put("t", "m", "vllm", "r2", &[(1, 16)]);
    let r = e.exact("t", "m", "vllm", 1);
    assert_eq!(r.hits.len(), 2);
    // Not delivered yet: nothing is hot.
    assert_eq!(e.idx.cache_state("t", "m").hot_prefixes, 0);
    e.idx.credit(&r.hits);
    let r = e.exact("t", "m", "vllm", 2);
    e.idx.credit(&r.hits);
    assert_eq!(e.idx.cache_state("t", "m").hot_prefixes, 2);
    assert_eq!(e.idx.snapshot().hot_prefixes, 2);
}

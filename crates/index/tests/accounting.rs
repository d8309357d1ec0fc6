//! Index behaviour tests: accounting.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;
use std::sync::Arc;

#[test]
fn metrics_sink_receives_counts() {
    let e = Env::new();
    e.put("t", "m1", "vllm", "r1", &[(1, 16), (2, 32)]);
    e.put("t", "m1", "vllm", "r2", &[(1, 16)]);
    e.put("u", "m2", "vllm", "r1", &[(9, 16)]);
    let c = e.idx.entry_counts_by_model();
    assert_eq!(c, vec![(Arc::from("m1"), 2), (Arc::from("m2"), 1)]);
}

#[test]
fn gauge_excludes_reserved_tenants() {
    let e = Env::new();
    e.put(PROBE_TENANT, "m1", "vllm", "r1", &[(1, 16)]);
    assert!(e.idx.entry_counts_by_model().is_empty());
}

#[test]
fn stats_keyed_by_top_level_replica_id() {
    let e = Env::new();
    let mut u = upd("t", "m", "vllm", "top", vec![]);
    u.stats = Some(ReplicaStatsReport {
        hit_rate: 0.5,
        ..Default::default()
    });
    e.idx.ingest(&u);
    let s = e.idx.cache_state("t", "m");
    assert_eq!(s.replicas.len(), 1);
    assert_eq!(&*s.replicas[0].replica_id, "top");
}

#[test]
fn concurrent_ingest_reports_final_count() {
    let e = Arc::new(Env::new());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let e = e.clone();
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    e.put("t", "m", "vllm", &format!("r{t}"), &[(i, 16)]);
                    let _ = e.idx.entry_counts_by_model();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(e.idx.entry_counts_by_model(), vec![(Arc::from("m"), 200)]);
}

#[test]
fn concurrent_reporters_never_regress_the_gauge() {
    let e = Arc::new(Env::new());
    let gauge = Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::<
        String,
        u64,
    >::new()));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let (e, gauge) = (e.clone(), gauge.clone());
            std::thread::spawn(move || {
                for i in 0..200u64 {
                    e.put("t", "m", "vllm", &format!("r{t}"), &[(t * 1000 + i, 16)]);
                    e.idx.report_entry_counts(|m, n| {
                        gauge.lock().unwrap().insert(m.to_string(), n);
                    });
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(gauge.lock().unwrap().get("m"), Some(&800));
}

#[test]
fn metrics_zeroed_when_model_drains() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert_eq!(e.idx.entry_counts_by_model(), vec![(Arc::from("m"), 1)]);
    e.event(EventKind::AllCleared, "t", "m", "r1", None, "");
    assert_eq!(e.idx.entry_counts_by_model(), vec![(Arc::from("m"), 0)]);
    assert!(e.idx.entry_counts_by_model().is_empty());
}

#[test]
fn ingest_sanitizes_non_finite_stats() {
    let e = Env::new();
    e.stats("t", "m", "r1", f32::NAN, f32::INFINITY);
    let s = e.idx.cache_state("t", "m");
    assert_eq!(s.replicas[0].hit_rate, 0.0);
    assert_eq!(s.replicas[0].pressure, 0.0);
}

#[test]
fn ingest_sanitizes_negative_infinity() {
    let e = Env::new();
    e.stats("t", "m", "r1", f32::NEG_INFINITY, f32::NEG_INFINITY);
    let s = e.idx.cache_state("t", "m");
    assert_eq!(s.replicas[0].hit_rate, 0.0);
    assert_eq!(s.replicas[0].pressure, 0.0);
}

#[test]
fn tenant_hot_requires_recent_stats() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.stats("t", "m", "r1", 0.9, 0.0);
    assert_eq!(e.exact("t", "m", "vllm", 99).strategy, Strategy::TenantHot);
    e.advance(5 * MIN);
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert_ne!(e.exact("t", "m", "vllm", 99).strategy, Strategy::TenantHot);
}

#[test]
fn lookup_ignores_stale_stats_pressure_penalty() {
    let e = Env::new();
    e.stats("t", "m", "r1", 0.5, 1.0);
    // Fresh stats: pressure 1.0 zeroes the score.
    e.put("t", "m", "vllm", "r1", &[(1, 100)]);
    assert_eq!(e.exact("t", "m", "vllm", 1).scores[0].score, 0.0);
    // Stats older than the TTL: pressure is ignored.
    e.advance(31 * MIN);
    e.put("t", "m", "vllm", "r1", &[(1, 100)]);
    let r = e.exact("t", "m", "vllm", 1);
    assert_eq!(r.scores[0].score, 100.0);
}

#[test]
fn tenant_hot_ignores_stats_only_replicas() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.stats("t", "m", "r1", 0.5, 0.0);
    e.stats("t", "m", "r2", 0.9, 0.0);
    let r = e.exact("t", "m", "vllm", 99);
    assert_eq!(r.strategy, Strategy::TenantHot);
    assert_eq!(ids(&r), vec!["r1"]);
}

#[test]
fn replica_updated_event_does_not_keep_stale_stats_fresh() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.stats("t", "m", "r1", 0.9, 0.0);
    e.advance(6 * MIN);
    let out = e.event(EventKind::ReplicaUpdated, "t", "m", "r1", None, "");
    assert_eq!(out.stats_touched, 1);
    let s = e.idx.cache_state("t", "m");
    assert_eq!(s.replicas[0].last_seen_ns, e.clock.now_ns());
    assert_eq!(s.replicas[0].stats_reported_ns, T0);
    assert_ne!(e.exact("t", "m", "vllm", 99).strategy, Strategy::TenantHot);
}

#[test]
fn replica_updated_without_stats_entry_is_noop() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert_eq!(
        e.event(EventKind::ReplicaUpdated, "t", "m", "r1", None, "")
            .stats_touched,
        0
    );
    assert!(e.idx.cache_state("t", "m").replicas.is_empty());
}

#[test]
fn replica_updated_keeps_stats_alive_through_sweep() {
    let e = Env::new();
    e.stats("t", "m", "r1", 0.9, 0.0);
    e.advance(20 * MIN);
    e.event(EventKind::ReplicaUpdated, "t", "m", "r1", None, "");
    e.advance(20 * MIN);
    assert_eq!(e.idx.sweep().stats_removed, 0);
    e.advance(10 * MIN);
    assert_eq!(e.idx.sweep().stats_removed, 1);
}

//! Index behaviour tests: index basics.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;
use std::sync::Arc;
use std::time::Duration;

#[test]
fn non_positive_durations_clamp_to_defaults() {
    let idx = IndexConfig::new().default_ttl(Duration::ZERO).build();
    assert_eq!(idx.default_ttl_ns(), 30 * 60 * 1_000_000_000);
    assert_eq!(idx.max_entries(), 1_000_000);
    assert_eq!(Index::default().max_entries(), DEFAULT_MAX_ENTRIES);
    // A zero policy TTL also falls back.
    let e = Env::new();
    e.pol.set_ttl("t", Duration::ZERO);
    assert_eq!(e.idx.tenant_ttl_ns("t"), 30 * 60 * 1_000_000_000);
}

#[test]
fn legacy_exact_match_path_unchanged() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(42, 128)]);
    let r = e.exact("t", "m", "vllm", 42);
    assert_eq!(r.strategy, Strategy::PrefixMatch);
    assert_eq!(r.strategy, Strategy::PrefixMatch);
    assert_eq!(r.scores.len(), 1);
    let s = &r.scores[0];
    assert_eq!(
        (
            &*s.replica_id,
            s.score,
            s.matched_tokens,
            s.estimated_cache_hit_prob
        ),
        ("r1", 128.0, 128, 1.0)
    );
    assert_eq!(s.tier.to_wire(), 1);
}

#[test]
fn tier_wire_mapping() {
    assert_eq!(Tier::from_wire(0), Tier::UNSPECIFIED);
    assert_eq!(Tier::from_wire(2), Tier::T2);
    assert_eq!(Tier::from_wire(7).raw(), 7);
    assert_eq!(Tier::from_wire(-1), Tier::INVALID);
    assert_eq!(Tier::from_wire(7).to_wire(), 0);
    assert_eq!(Tier::INVALID.to_wire(), 0);
    assert_eq!(Tier::T3.to_wire(), 3);
    assert_eq!(Tier::UNSPECIFIED.normalized(), Tier::T1);
    assert_eq!(Tier::INVALID.normalized(), Tier::INVALID);
}

#[test]
fn event_kind_wire_mapping() {
    assert_eq!(EventKind::from_wire(0), None);
    assert_eq!(EventKind::from_wire(1), Some(EventKind::PrefixAdded));
    assert_eq!(EventKind::from_wire(2), Some(EventKind::PrefixEvicted));
    assert_eq!(EventKind::from_wire(3), Some(EventKind::ReplicaUpdated));
    assert_eq!(EventKind::from_wire(4), Some(EventKind::AllCleared));
    assert_eq!(EventKind::from_wire(99), None);
}

#[test]
fn eviction_algorithm_from_policy_string() {
    assert_eq!(
        EvictionAlgorithm::from_policy_str("LFU"),
        EvictionAlgorithm::Lfu
    );
    assert_eq!(
        EvictionAlgorithm::from_policy_str("lfu"),
        EvictionAlgorithm::Lfu
    );
    assert_eq!(
        EvictionAlgorithm::from_policy_str(""),
        EvictionAlgorithm::Lru
    );
    assert_eq!(
        EvictionAlgorithm::from_policy_str("fifo"),
        EvictionAlgorithm::Lru
    );
}

#[test]
fn wire_timestamps_zero_means_now() {
    let e = Env::new();
    let mut u = upd("t", "m", "vllm", "r1", vec![legacy(1, 16)]);
    u.timestamp_us = T0 / 1000 - 60_000_000; // one minute ago
    e.idx.ingest(&u);
    let r = e.exact("t", "m", "vllm", 1);
    assert_eq!(
        r.scores[0].estimated_cache_hit_prob,
        (1.0 - 1.0 / 30.0_f64) as f32
    );
    assert_eq!(wire_us_to_ns(0, 5), 5);
    assert_eq!(wire_us_to_ns(3, 5), 3000);
}

#[derive(Default)]
struct Rec {
    log: std::sync::Mutex<Vec<String>>,
}

impl IndexObserver for Rec {
    fn prefix_added(&self, c: &PrefixChange) {
        self.log
            .lock()
            .unwrap()
            .push(format!("add {} {:?}", c.replica_id, c.prefix_hash));
    }
    fn prefix_removed(&self, c: &PrefixChange, r: RemovalReason) {
        self.log.lock().unwrap().push(format!(
            "rm {} {:?} {}",
            c.replica_id,
            c.prefix_hash,
            r.label()
        ));
    }
    fn replica_cleared(&self, t: &str, m: &str, r: &str, _: i64) {
        self.log
            .lock()
            .unwrap()
            .push(format!("cleared {t} {m} {r}"));
    }
    fn replica_updated(&self, t: &str, m: &str, r: &str, _: i64) {
        self.log
            .lock()
            .unwrap()
            .push(format!("updated {t} {m} {r}"));
    }
}

#[test]
fn observer_receives_adds_and_removals_with_reasons() {
    let rec = Arc::new(Rec::default());
    let e = Env::with(|c| c.max_entries(3).observer(rec.clone()));
    e.pol.set_quota("q", 1);
    e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    e.put("t", "m", "vllm", "r1", &[(1, 16)]); // refresh: not an add
    e.event(EventKind::PrefixEvicted, "t", "m", "r1", Some(2), "");
    e.put("q", "m", "vllm", "r1", &[(5, 16)]);
    e.advance(MIN);
    e.put("q", "m", "vllm", "r1", &[(6, 16)]); // quota evicts 5
    e.put("t", "m", "vllm", "r2", &[(7, 16), (8, 16)]); // cap evicts the oldest (1)
    e.stats("t", "m", "r2", 0.1, 0.0);
    e.event(EventKind::ReplicaUpdated, "t", "m", "r2", None, "");
    e.event(EventKind::AllCleared, "t", "m", "r2", None, "");
    e.advance(40 * MIN);
    e.idx.sweep();
    let log = rec.log.lock().unwrap().clone();
    let h = |n: u64| format!("{:?}", n.to_be_bytes());
    let expected = vec![
        format!("add r1 {}", h(1)),
        format!("add r1 {}", h(2)),
        format!("rm r1 {} evicted", h(2)),
        format!("add r1 {}", h(5)),
        format!("add r1 {}", h(6)),
        format!("rm r1 {} quota", h(5)),
        format!("add r2 {}", h(7)),
        format!("add r2 {}", h(8)),
        format!("rm r1 {} cap", h(1)),
        "updated t m r2".to_string(),
        format!("rm r2 {} cleared", h(7)),
        format!("rm r2 {} cleared", h(8)),
        "cleared t m r2".to_string(),
        format!("rm r1 {} ttl", h(6)),
    ];
    let mut got_sorted = log.clone();
    let mut exp_sorted = expected.clone();
    // Removals inside one ALL_CLEARED walk follow shard order: compare as sets there.
    got_sorted[10..12].sort();
    exp_sorted[10..12].sort();
    assert_eq!(got_sorted, exp_sorted, "{log:#?}");
}

#[test]
fn retain_min_matched_tokens_prunes_hits_together() {
    let e = Env::new();
    e.pol.set_lfu("t");
    e.put_chain("t", "m", "vllm", "a", &[1, 2, 3, 4], &[16; 4]);
    e.put_chain("t", "m", "vllm", "b", &[1], &[16]);
    let mut r = e.chain("t", "m", "vllm", &[1, 2, 3, 4], &[16; 4]);
    assert_eq!(r.hit_entries(), 5);
    assert_eq!(r.hits.len(), 2);
    assert!(r.retain_min_matched_tokens(64));
    assert_eq!(ids(&r), vec!["a"]);
    assert_eq!(r.hit_entries(), 4);
    let kept = e.idx.hit_replicas(&r.hits);
    assert!(kept.iter().all(|(name, _)| &**name == "a"), "{kept:?}");
    assert!(!r.retain_min_matched_tokens(1000));
    assert_eq!(r.strategy, Strategy::None);
    assert!(r.hits.is_empty());
}

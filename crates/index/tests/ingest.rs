//! Index behaviour tests: ingest.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;

#[test]
fn ingest_and_lookup_ranks_by_tokens_and_freshness() {
    let e = Env::new();
    e.put("t", "m", "vllm", "old", &[(1, 200)]);
    e.advance(15 * MIN);
    e.put("t", "m", "vllm", "big", &[(1, 200)]);
    e.put("t", "m", "vllm", "small", &[(1, 50)]);
    e.put("t", "m", "vllm", "other", &[(2, 50)]); // 4 serving replicas, 3 hold
    let r = e.exact("t", "m", "vllm", 1);
    assert_eq!(ids(&r), vec!["big", "old", "small"]);
    let dp = (1.0 - 3.0 / 4.0_f64) as f32;
    assert_eq!(score_of(&r, "big"), 200.0 * dp);
    assert_eq!(score_of(&r, "old"), 200.0 * 0.5 * dp);
    assert_eq!(score_of(&r, "small"), 50.0 * dp);
}

#[test]
fn ingest_is_idempotent() {
    let e = Env::new();
    for _ in 0..3 {
        e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 32)]);
        e.put_chain("t", "m", "vllm", "r1", &[1, 3], &[16, 16]);
    }
    assert_eq!(e.idx.total_entries(), 3);
    assert_eq!(e.idx.distinct_prefixes(), 3);
    assert_eq!(e.idx.cache_state("t", "m").total_prefixes, 3);
}

#[test]
fn prefix_added_event_does_not_refresh_across_schemes() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.advance(20 * MIN);
    let out = e.event(EventKind::PrefixAdded, "t", "m", "r1", Some(1), "");
    assert_eq!(out, EventOutcome::default());
    e.advance(10 * MIN);
    assert!(e.exact("t", "m", "vllm", 1).scores.is_empty());
    assert!(e.exact("t", "m", "sglang", 1).scores.is_empty());
}

#[test]
fn ingest_defaults_tier_t1_exact() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert_eq!(e.exact("t", "m", "vllm", 1).scores[0].tier, Tier::T1);
}

#[test]
fn ingest_defaults_tier_t1_chain() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "r1", &[1, 2], &[16, 16]);
    assert_eq!(
        e.chain("t", "m", "vllm", &[1, 2], &[16, 16]).scores[0].tier,
        Tier::T1
    );
}

#[test]
fn ingest_carries_explicit_tier() {
    let e = Env::new();
    for (hash, wire) in [(1u64, 2), (2, 3), (3, 9), (4, -4)] {
        let mut p = legacy(hash, 16);
        p.tier = Tier::from_wire(wire);
        e.idx.ingest(&upd("t", "m", "vllm", "r1", vec![p]));
    }
    assert_eq!(e.exact("t", "m", "vllm", 1).scores[0].tier, Tier::T2);
    assert_eq!(e.exact("t", "m", "vllm", 2).scores[0].tier, Tier::T3);
    assert_eq!(e.exact("t", "m", "vllm", 3).scores[0].tier.raw(), 9);
    assert_eq!(e.exact("t", "m", "vllm", 4).scores[0].tier, Tier::INVALID);
    assert_eq!(e.exact("t", "m", "vllm", 4).scores[0].tier.to_wire(), 0);
}

#[test]
fn chain_lookup_against_legacy_ingest_exact_only() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 999)]);
    let r = e.chain("t", "m", "vllm", &[1, 2, 3], &[16, 16, 16]);
    // Block 0 matches; matched tokens come from the request counts.
    assert_eq!(r.scores[0].matched_tokens, 16);
}

#[test]
fn chain_ingest_mismatched_lengths_dropped() {
    let e = Env::new();
    let out = e.put_chain("t", "m", "vllm", "r1", &[1, 2], &[16]);
    assert_eq!(out.dropped_mismatched_chain, 1);
    assert_eq!(e.idx.total_entries(), 0);
}

#[test]
fn chain_ingest_one_sided_hashes_only_dropped() {
    let e = Env::new();
    let mut p = chain(&[1, 2], &[]);
    p.prefix_hash = h(7); // no legacy fallback
    let out = e.idx.ingest(&upd("t", "m", "vllm", "r1", vec![p]));
    assert_eq!(out.dropped_mismatched_chain, 1);
    assert_eq!(e.idx.total_entries(), 0);
}

#[test]
fn chain_ingest_one_sided_counts_only_dropped() {
    let e = Env::new();
    let out = e.put_chain("t", "m", "vllm", "r1", &[], &[16, 16]);
    assert_eq!(out.dropped_mismatched_chain, 1);
    assert_eq!(e.idx.total_entries(), 0);
}

#[test]
fn chain_ingest_empty_hash_scheme_fails_open() {
    let e = Env::new();
    let mut u = upd("t", "m", "", "r1", vec![chain(&[1], &[16]), legacy(2, 16)]);
    u.stats = Some(ReplicaStatsReport {
        hit_rate: 0.3,
        ..Default::default()
    });
    let out = e.idx.ingest(&u);
    assert_eq!(out.skipped_no_scheme, 2);
    assert!(out.stats_stored);
    assert_eq!(e.idx.total_entries(), 0);
    assert_eq!(e.idx.cache_state("t", "m").replicas.len(), 1);
}

#[test]
fn chain_ingest_with_co_set_legacy_prefix_hash_preserves_both() {
    let e = Env::new();
    let mut p = chain(&[1, 2], &[16, 32]);
    p.prefix_hash = h(100);
    p.token_count = 77;
    e.idx.ingest(&upd("t", "m", "vllm", "r1", vec![p]));
    assert_eq!(e.idx.total_entries(), 3);
    assert_eq!(e.exact("t", "m", "vllm", 100).scores[0].matched_tokens, 77);
    // Cumulative counts are stored on chain keys.
    assert_eq!(e.exact("t", "m", "vllm", 2).scores[0].matched_tokens, 48);
    assert_eq!(e.exact("t", "m", "vllm", 1).scores[0].matched_tokens, 16);
}

#[test]
fn legacy_entry_with_empty_prefix_hash_is_dropped() {
    let e = Env::new();
    let p = PrefixEntry {
        token_count: 16,
        ..Default::default()
    };
    let out = e.idx.ingest(&upd("t", "m", "vllm", "r1", vec![p]));
    assert_eq!(out.dropped_empty_hash, 1);
    assert_eq!(e.idx.total_entries(), 0);
    let r = e
        .idx
        .lookup(&LookupRequest::<Vec<u8>>::new("t", "m", "vllm"));
    assert!(r.scores.is_empty());
}

#[test]
fn ingest_is_additive() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16), (2, 16)]);
    e.put("t", "m", "vllm", "r1", &[(3, 16)]);
    assert_eq!(e.idx.total_entries(), 3);
}

#[test]
fn ingest_overwrites_last_seen_even_when_older() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    let mut u = upd("t", "m", "vllm", "r1", vec![legacy(1, 32)]);
    u.timestamp_us = T0 / 1000 - 15 * 60 * 1_000_000;
    e.idx.ingest(&u);
    let s = &e.exact("t", "m", "vllm", 1).scores[0];
    assert_eq!(s.estimated_cache_hit_prob, 0.5);
    assert_eq!(s.matched_tokens, 32);
}

#[test]
fn reserved_tenant_entries_count_toward_totals() {
    let e = Env::new();
    e.put(PROBE_TENANT, "m", "vllm", "__probe-x", &[(1, 16)]);
    assert_eq!(e.idx.total_entries(), 1);
    let hb = h(1);
    let r = e
        .idx
        .lookup_route(&LookupRequest::<Vec<u8>>::new(PROBE_TENANT, "m", "vllm").exact(&hb, 0));
    assert_eq!(r.strategy, Strategy::PrefixMatch);
}

#[test]
fn hashes_of_any_length_round_trip() {
    let e = Env::new();
    for len in [1usize, 8, 18, 19, 32, 64, 100] {
        let hash: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
        let p = PrefixEntry {
            prefix_hash: hash.clone(),
            token_count: len as i32,
            ..Default::default()
        };
        e.idx.ingest(&upd("t", "m", "vllm", "r1", vec![p]));
        let r = e
            .idx
            .lookup_route(&LookupRequest::<Vec<u8>>::new("t", "m", "vllm").exact(&hash, 0));
        assert_eq!(r.scores[0].matched_tokens, len as i32, "len {len}");
        let hs = vec![hash.clone()];
        let r = e
            .idx
            .lookup_route(&LookupRequest::new("t", "m", "vllm").chain(&hs, &[16]));
        assert_eq!(r.scores[0].matched_tokens, 16);
    }
    assert_eq!(e.idx.distinct_prefixes(), 7);
    let long: Vec<u8> = (0..32).map(|i| (i * 7 + 32) as u8).collect();
    let out = e.idx.apply_event(&CacheEvent {
        kind: EventKind::PrefixEvicted,
        replica_id: "r1".into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        prefix_hash: long,
        timestamp_us: 0,
        adapter_id: String::new(),
    });
    assert_eq!(out.entries_removed, 1);
    e.advance(40 * MIN);
    assert_eq!(e.idx.sweep().evictions.ttl_total(), 6);
    assert_eq!(e.idx.total_entries(), 0);
}

#[test]
fn engine_load_is_stored_sanitized_and_shown_in_views() {
    let e = Env::new();
    let mut u = upd("t", "m", "vllm", "r1", vec![]);
    u.stats = Some(ReplicaStatsReport {
        load: Some(EngineLoad {
            running_requests: 3,
            waiting_requests: 2,
            kv_cache_usage: f32::NAN,
            kv_cache_capacity_tokens: 8192,
        }),
        ..Default::default()
    });
    assert!(e.idx.ingest(&u).stats_stored);
    let load = e.idx.cache_state("t", "m").replicas[0].load.unwrap();
    assert_eq!((load.running_requests, load.waiting_requests), (3, 2));
    assert_eq!(load.kv_cache_usage, 0.0, "non-finite usage is stored as 0");
    assert_eq!(load.requests(), 5);
    assert_eq!(load.free_tokens(), Some(8192));

    u.stats
        .as_mut()
        .unwrap()
        .load
        .as_mut()
        .unwrap()
        .kv_cache_usage = 7.5;
    e.idx.ingest(&u);
    let load = e.idx.snapshot().replicas[0].load.unwrap();
    assert_eq!(load.kv_cache_usage, 1.0, "usage is clamped to [0, 1]");
    assert_eq!(load.free_tokens(), Some(0));

    // A producer without the extension (the reference's) reports no load.
    u.stats.as_mut().unwrap().load = None;
    e.idx.ingest(&u);
    assert_eq!(e.idx.cache_state("t", "m").replicas[0].load, None);
}

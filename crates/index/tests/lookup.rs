//! Index behaviour tests: lookup.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;
use std::time::Duration;

#[test]
fn lookup_unknown_prefix_is_empty() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    let hb = h(2);
    assert!(
        e.idx
            .lookup(&LookupRequest::<Vec<u8>>::new("t", "m", "vllm").exact(&hb, 0))
            .scores
            .is_empty()
    );
}

#[test]
fn hash_scheme_isolates_matches() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.put("t", "m", "sglang", "r2", &[(1, 16)]);
    assert_eq!(ids(&e.exact("t", "m", "vllm", 1)), vec!["r1"]);
    assert_eq!(ids(&e.exact("t", "m", "sglang", 1)), vec!["r2"]);
}

#[test]
fn no_cross_engine_false_hit_vllm_vs_sglang() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    let r = e.exact("t", "m", "sglang", 1);
    assert!(r.scores.is_empty());
    assert_eq!(r.strategy, Strategy::UnknownHashScheme);
}

#[test]
fn empty_hash_scheme_fails_open() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    let hb = h(1);
    assert!(
        e.idx
            .lookup(&LookupRequest::<Vec<u8>>::new("t", "m", "").exact(&hb, 0))
            .scores
            .is_empty()
    );
}

#[test]
fn tenant_isolation() {
    let e = Env::new();
    e.put("a", "m", "vllm", "r1", &[(1, 16)]);
    assert!(e.exact("b", "m", "vllm", 1).scores.is_empty());
}

#[test]
fn lookup_route_orchestrator_strategies() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.stats("t", "m", "r1", 0.5, 0.0);
    assert_eq!(e.exact("t", "m", "vllm", 1).strategy, Strategy::PrefixMatch);
    assert_eq!(e.exact("t", "m", "vllm", 2).strategy, Strategy::TenantHot);
    e.stats("t", "m", "r1", 0.05, 0.0);
    assert_eq!(e.exact("t", "m", "vllm", 2).strategy, Strategy::None);
    // Mismatched chain → None even with data.
    let hs = vec![h(1)];
    let r = e
        .idx
        .lookup_route(&LookupRequest::new("t", "m", "vllm").chain(&hs, &[16, 16]));
    assert_eq!(r.strategy, Strategy::None);
}

#[test]
fn tenant_hot_recency_clamped_against_clock_skew() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    let mut u = upd("t", "m", "", "r1", vec![]);
    u.timestamp_us = T0 / 1000 + 60_000_000; // one minute in the future
    u.stats = Some(ReplicaStatsReport {
        hit_rate: 0.5,
        ..Default::default()
    });
    e.idx.ingest(&u);
    let r = e.exact("t", "m", "vllm", 2);
    assert_eq!(r.strategy, Strategy::TenantHot);
    assert_eq!(r.scores[0].score, 0.5);
}

#[test]
fn tenant_hot_matched_tokens_is_zero() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.stats("t", "m", "r1", 0.5, 0.0);
    e.advance(Duration::from_secs(150));
    let r = e.exact("t", "m", "vllm", 2);
    let s = &r.scores[0];
    assert_eq!(s.matched_tokens, 0);
    assert_eq!(s.tier, Tier::UNSPECIFIED);
    assert_eq!(s.estimated_cache_hit_prob, 0.5);
    assert_eq!(s.score, 0.5 * 0.5);
}

#[test]
fn tenant_hot_honors_hit_rate_threshold() {
    let e = Env::new();
    e.put("t", "m", "vllm", "a", &[(1, 16)]);
    e.put("t", "m", "vllm", "b", &[(1, 16)]);
    e.stats("t", "m", "a", 0.1, 0.0);
    e.stats("t", "m", "b", 0.099, 0.0);
    assert_eq!(ids(&e.exact("t", "m", "vllm", 2)), vec!["a"]);
}

#[test]
fn tenant_hot_disabled_by_zero_max_age() {
    let e = Env::with(|c| {
        c.ranking(RankingConfig {
            tenant_hot_max_age: Duration::ZERO,
            ..RankingConfig::default()
        })
    });
    e.put("t", "m", "vllm", "a", &[(1, 16)]);
    e.stats("t", "m", "a", 0.9, 0.0);
    assert_eq!(e.exact("t", "m", "vllm", 2).strategy, Strategy::None);
}

#[test]
fn tenant_hot_requires_replica_serving_requested_scheme() {
    let e = Env::new();
    e.put("t", "m", "sglang", "a", &[(1, 16)]);
    e.put("t", "m", "vllm", "b", &[(1, 16)]);
    e.stats("t", "m", "a", 0.9, 0.0);
    e.stats("t", "m", "b", 0.2, 0.0);
    assert_eq!(ids(&e.exact("t", "m", "vllm", 2)), vec!["b"]);
}

#[test]
fn tenant_hot_drops_replica_after_prefix_sweep() {
    let e = Env::new();
    e.pol.set_ttl("t", 2 * MIN);
    e.put("t", "m", "vllm", "a", &[(1, 16)]);
    e.advance(2 * MIN);
    e.stats("t", "m", "a", 0.9, 0.0);
    e.put("t", "m", "vllm", "b", &[(5, 16)]);
    // Stale but not yet swept: a still serves the scope.
    assert_eq!(ids(&e.exact("t", "m", "vllm", 2)), vec!["a"]);
    e.idx.sweep();
    // a no longer serves the scheme: not TENANT_HOT.
    let r = e.exact("t", "m", "vllm", 2);
    assert_eq!(r.strategy, Strategy::None);
}

#[test]
fn tenant_hot_isolated_by_tenant() {
    let e = Env::new();
    e.put("a", "m", "vllm", "r1", &[(1, 16)]);
    e.put("b", "m", "vllm", "r2", &[(1, 16)]);
    e.stats("a", "m", "r1", 0.9, 0.0);
    assert_eq!(e.exact("b", "m", "vllm", 2).strategy, Strategy::None);
    assert_eq!(ids(&e.exact("a", "m", "vllm", 2)), vec!["r1"]);
}

#[test]
fn tenant_hot_isolated_by_model() {
    let e = Env::new();
    e.put("a", "m1", "vllm", "r1", &[(1, 16)]);
    e.put("a", "m2", "vllm", "r1", &[(1, 16)]);
    e.stats("a", "m1", "r1", 0.9, 0.0);
    assert_eq!(e.exact("a", "m2", "vllm", 2).strategy, Strategy::None);
}

#[test]
fn lookup_route_empty_hash_scheme_fails_open_across_strategies() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.stats("t", "m", "r1", 0.9, 0.0);
    assert_eq!(e.exact("t", "m", "", 1).strategy, Strategy::None);
    assert_eq!(e.exact("t", "m", "", 2).strategy, Strategy::None);
    assert_eq!(e.chain("t", "m", "", &[1], &[16]).strategy, Strategy::None);
    assert!(e.idx.tenant_hot("t", "m", "", 0).is_empty());
}

#[test]
fn chain_lookup_returns_longest_common_prefix() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[1, 2, 3], &[16; 3]);
    let r = e.chain("t", "m", "vllm", &[1, 2, 9, 3], &[10, 20, 30, 40]);
    assert_eq!(r.scores[0].matched_tokens, 30);
}

#[test]
fn chain_lookup_full_chain_match() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[1, 2, 3], &[16; 3]);
    let r = e.chain("t", "m", "vllm", &[1, 2, 3], &[16; 3]);
    assert_eq!(r.strategy, Strategy::PrefixMatch);
    assert_eq!(r.scores[0].matched_tokens, 48);
    assert_eq!(r.scores[0].score, 48.0);
}

#[test]
fn chain_lookup_reports_coldest_tier_across_run() {
    let e = Env::new();
    let mut p = chain(&[1], &[16]);
    p.tier = Tier::T1;
    let mut q = PrefixEntry {
        prefix_hash: h(2),
        token_count: 32,
        tier: Tier::T3,
        ..Default::default()
    };
    q.adapter_id = String::new();
    let mut r3 = legacy(3, 48);
    r3.tier = Tier::T2;
    e.idx.ingest(&upd("t", "m", "vllm", "a", vec![p, q, r3]));
    let r = e.chain("t", "m", "vllm", &[1, 2, 3], &[16; 3]);
    assert_eq!(r.scores[0].tier, Tier::T3);
    let r = e.chain("t", "m", "vllm", &[1], &[16]);
    assert_eq!(r.scores[0].tier, Tier::T1);
}

#[test]
fn chain_lookup_no_overlap_returns_empty() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[1, 2], &[16; 2]);
    let r = e.chain("t", "m", "vllm", &[5, 1], &[16; 2]);
    assert!(r.scores.is_empty());
    assert_eq!(r.strategy, Strategy::None);
}

#[test]
fn chain_lookup_hash_scheme_isolation() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[1, 2], &[16; 2]);
    e.put_chain("t", "m", "sglang", "b", &[1], &[16]);
    let r = e.chain("t", "m", "sglang", &[1, 2], &[16; 2]);
    assert_eq!(ids(&r), vec!["b"]);
    assert_eq!(r.scores[0].matched_tokens, 16);
}

#[test]
fn chain_lookup_run_freshness_is_weakest_link() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[1], &[16]);
    e.advance(15 * MIN);
    e.put_chain("t", "m", "vllm", "a", &[7, 2], &[16, 16]); // block 2 fresh, block 1 old
    let r = e.chain("t", "m", "vllm", &[1, 2], &[16; 2]);
    assert_eq!(r.scores[0].matched_tokens, 32);
    assert_eq!(r.scores[0].estimated_cache_hit_prob, 0.5);
    assert_eq!(r.scores[0].score, 16.0);
}

#[test]
fn chain_lookup_stale_block_ends_run() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[2], &[16]);
    e.advance(30 * MIN);
    e.put_chain("t", "m", "vllm", "a", &[1], &[16]);
    let r = e.chain("t", "m", "vllm", &[1, 2], &[16; 2]);
    assert_eq!(r.scores[0].matched_tokens, 16);
    assert_eq!(r.scores[0].estimated_cache_hit_prob, 1.0);
}

#[test]
fn chain_lookup_mismatched_lengths_fail_open() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[1, 2], &[16; 2]);
    let hs = vec![h(1), h(2)];
    let r = e
        .idx
        .lookup(&LookupRequest::new("t", "m", "vllm").chain(&hs, &[16]));
    assert!(r.scores.is_empty());
    let r = e
        .idx
        .lookup_route(&LookupRequest::new("t", "m", "vllm").chain(&hs, &[16]));
    assert_eq!(r.strategy, Strategy::None);
}

#[test]
fn chain_lookup_one_sided_counts_only_fails_open() {
    let e = Env::new();
    e.put("t", "m", "vllm", "a", &[(1, 16)]);
    let hb = h(1);
    let none: &[Vec<u8>] = &[];
    // Counts without hashes: chain-bearing and mismatched, even with a prefix_hash.
    let r = e.idx.lookup_route(
        &LookupRequest::new("t", "m", "vllm")
            .exact(&hb, 16)
            .chain(none, &[16]),
    );
    assert_eq!(r.strategy, Strategy::None);
    assert!(
        e.idx
            .lookup(
                &LookupRequest::new("t", "m", "vllm")
                    .exact(&hb, 16)
                    .chain(none, &[16])
            )
            .scores
            .is_empty()
    );
}

#[test]
fn chain_lookup_skips_non_positive_matched() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[1], &[16]);
    let r = e.chain("t", "m", "vllm", &[1], &[0]);
    assert!(r.scores.is_empty());
}

#[test]
fn exact_lookup_returns_zero_token_entries_with_score_zero() {
    let e = Env::new();
    e.put("t", "m", "vllm", "a", &[(1, 0)]);
    let r = e.exact("t", "m", "vllm", 1);
    assert_eq!(r.strategy, Strategy::PrefixMatch);
    assert_eq!(r.scores[0].score, 0.0);
}

#[test]
fn chain_lookup_accepts_fixed_size_hashes() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[1, 2], &[16; 2]);
    let hs: Vec<[u8; 8]> = vec![1u64.to_be_bytes(), 2u64.to_be_bytes()];
    let r = e
        .idx
        .lookup_route(&LookupRequest::new("t", "m", "vllm").chain(&hs, &[16, 16]));
    assert_eq!(r.scores[0].matched_tokens, 32);
}

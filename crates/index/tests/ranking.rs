//! Index behaviour tests: ranking.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;

fn exact_slo(e: &Env, hash: u64, ttft: i32) -> LookupRouteResult {
    let hb = h(hash);
    e.idx.lookup_route(
        &LookupRequest::<Vec<u8>>::new("t", "m", "vllm")
            .exact(&hb, 0)
            .slo_ttft_ms(ttft),
    )
}

#[test]
fn lookup_pressure_and_slo_factors_collapse_to_unity_when_signals_absent() {
    let e = Env::new();
    e.put("t", "m", "vllm", "a", &[(1, 100)]);
    assert_eq!(exact_slo(&e, 1, 0).scores[0].score, 100.0);
    assert_eq!(exact_slo(&e, 1, 500).scores[0].score, 100.0);
}

#[test]
fn lookup_pressure_aware_ranking() {
    let e = Env::new();
    e.put("t", "m", "vllm", "a", &[(1, 100)]);
    e.put("t", "m", "vllm", "b", &[(1, 100)]);
    e.put("t", "m", "vllm", "c", &[(9, 100)]);
    e.put("t", "m", "vllm", "d", &[(9, 100)]);
    e.stats("t", "m", "a", 0.5, 0.75);
    e.stats("t", "m", "b", 0.5, 0.25);
    let r = exact_slo(&e, 1, 0);
    assert_eq!(ids(&r), vec!["b", "a"]);
    let dp = (1.0 - 2.0 / 4.0_f64) as f32;
    assert_eq!(r.scores[0].score, 100.0 * 1.0 * 0.75 * 1.0 * dp);
    assert_eq!(r.scores[1].score, 100.0 * 1.0 * 0.25 * 1.0 * dp);
    // Pressure > 1 clamps to 0.
    e.stats("t", "m", "a", 0.5, 3.0);
    assert_eq!(score_of(&exact_slo(&e, 1, 0), "a"), 0.0);
}

#[test]
fn lookup_slo_aware_ranking_biases_freshness() {
    let e = Env::new();
    e.put("t", "m", "vllm", "old", &[(1, 100)]);
    e.advance(15 * MIN);
    e.put("t", "m", "vllm", "new", &[(1, 60)]);
    // Loose: 100*0.5 = 50 vs 60.
    let loose = exact_slo(&e, 1, 200);
    assert_eq!(ids(&loose), vec!["new", "old"]);
    assert_eq!(score_of(&loose, "old"), 0.0); // both hold: dp 0 with 2 serving
    let e2 = Env::new();
    e2.put("t", "m", "vllm", "x", &[(5, 1)]);
    e2.put("t", "m", "vllm", "y", &[(5, 1)]);
    e2.put("t", "m", "vllm", "z", &[(5, 1)]);
    e2.put("t", "m", "vllm", "old", &[(1, 100)]);
    e2.advance(15 * MIN);
    let tight = exact_slo(&e2, 1, 199);
    // 100 * 0.5 * 1 * (1 + 0.5) * dp(1/4)
    assert_eq!(
        tight.scores[0].score,
        100.0 * 0.5 * 1.0 * 1.5 * (0.75_f64 as f32)
    );
    let edge = exact_slo(&e2, 1, 200);
    assert_eq!(edge.scores[0].score, 100.0 * 0.5 * (0.75_f64 as f32));
}

#[test]
fn lookup_slo_bias_disabled_when_knobs_zero() {
    for ranking in [
        RankingConfig {
            slo_tight_bias: 0.0,
            ..RankingConfig::default()
        },
        RankingConfig {
            slo_tight_ttft_ms: 0,
            ..RankingConfig::default()
        },
    ] {
        let e = Env::with(|c| c.ranking(ranking));
        e.put("t", "m", "vllm", "a", &[(1, 100)]);
        assert_eq!(exact_slo(&e, 1, 50).scores[0].score, 100.0);
    }
    let e = Env::new();
    e.put("t", "m", "vllm", "a", &[(1, 100)]);
    assert_eq!(exact_slo(&e, 1, 50).scores[0].score, 200.0);
}

#[test]
fn worst_tier_prefers_least_local() {
    assert_eq!(Tier::worst(Tier::T1, Tier::T2), Tier::T2);
    assert_eq!(Tier::worst(Tier::T3, Tier::T2), Tier::T3);
    assert_eq!(Tier::worst(Tier::T1, Tier::UNSPECIFIED), Tier::UNSPECIFIED);
    assert_eq!(Tier::worst(Tier::UNSPECIFIED, Tier::T3), Tier::UNSPECIFIED);
    assert_eq!(Tier::worst(Tier::T3, Tier::from_wire(7)).raw(), 7);
    assert_eq!(
        Tier::worst(Tier::from_wire(7), Tier::INVALID),
        Tier::INVALID
    );
}

#[test]
fn chain_lookup_shares_pressure_and_slo_factors_with_exact() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[1, 2], &[50, 50]);
    e.put("t", "m", "vllm", "a", &[(100, 100)]);
    e.stats("t", "m", "a", 0.5, 0.4);
    e.advance(3 * MIN);
    let hs = vec![h(1), h(2)];
    let c = [50, 50];
    let chain = e.idx.lookup_route(
        &LookupRequest::new("t", "m", "vllm")
            .chain(&hs, &c)
            .slo_ttft_ms(100),
    );
    let exact = exact_slo(&e, 100, 100);
    assert_eq!(chain.scores[0].score, exact.scores[0].score);
    let fresh = freshness(e.clock.now_ns(), T0, 30 * 60 * 1_000_000_000);
    assert_eq!(
        exact.scores[0].score,
        prefix_score(100, fresh, pressure_factor(1.0, 0.4), 1.0)
    );
}

#[test]
fn freshness_formula() {
    let ttl = 1_000;
    assert_eq!(freshness(10, 10, 0), 0.0);
    assert_eq!(freshness(10, 20, ttl), 1.0);
    assert_eq!(freshness(1_010, 10, ttl), 0.0);
    assert_eq!(freshness(260, 10, ttl), (1.0 - 250.0 / 1000.0_f64) as f32);
    assert_eq!(recency(0, 10), 1.0);
    assert_eq!(recency(10, 10), 0.0);
    assert_eq!(recency(3, 10), 1.0 - 3.0_f32 / 10.0_f32);
}

#[test]
fn freshness_is_positive_exactly_when_younger_than_ttl() {
    let ttl = 1_800_000_000_000i64;
    for age in [-5, 0, 1, ttl / 2, ttl - 1, ttl, ttl + 1] {
        assert_eq!(freshness(ttl, ttl - age, ttl) > 0.0, age < ttl, "age {age}");
    }
}

#[test]
fn names_and_their_order_follow_replicas_joining_between_lookups() {
    // Every lookup between the joins reads names on this thread: a name
    // that joined since its last lookup must appear, in byte order. Names
    // "ra", "raa", "raaa", ... each fall into the same gap between the
    // last one and "s", so the order labels are rewritten on the way.
    let e = Env::new();
    e.put("t", "m", "vllm", "s", &[(1, 100)]);
    let mut expected = vec!["s".to_string()];
    for k in 1..=45 {
        let name = format!("r{}", "a".repeat(k));
        e.put("t", "m", "vllm", &name, &[(1, 100)]);
        expected.push(name);
        expected.sort();
        let r = e.exact("t", "m", "vllm", 1);
        assert_eq!(ids(&r), expected, "after {k} joins");
    }
}

#[test]
fn names_past_the_published_table_are_read_through_the_catalog() {
    // Lookups read names from a table the catalog republishes on each new
    // replica, up to 4,096 ids; past that they read the catalog itself.
    let e = Env::new();
    for r in 0..4100 {
        e.put("t", "m", "vllm", &format!("r{r:05}"), &[(r, 100)]);
    }
    assert_eq!(ids(&e.exact("t", "m", "vllm", 4099)), ["r04099"]);
    e.put("t", "m", "vllm", "a-last-joiner", &[(4099, 100)]);
    assert_eq!(
        ids(&e.exact("t", "m", "vllm", 4099)),
        ["a-last-joiner", "r04099"]
    );
}

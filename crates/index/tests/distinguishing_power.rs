//! Index behaviour tests: distinguishing power.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;

#[test]
fn distinguishing_power_single_replica() {
    assert_eq!(distinguishing_power(1, 1), 1.0);
    assert_eq!(distinguishing_power(0, 0), 1.0);
}

#[test]
fn distinguishing_power_all_matched_yields_zero() {
    assert_eq!(distinguishing_power(3, 3), 0.0);
}

#[test]
fn distinguishing_power_one_of_three() {
    assert_eq!(distinguishing_power(1, 3), 1.0 - 1.0 / 3.0);
}

#[test]
fn distinguishing_power_two_of_three() {
    assert_eq!(distinguishing_power(2, 3), 1.0 - 2.0 / 3.0);
}

#[test]
fn distinguishing_power_clamps_matching_over_total() {
    assert_eq!(distinguishing_power(5, 3), 0.0);
}

#[test]
fn distinguishing_power_negative_inputs_clamped_to_one() {
    assert_eq!(distinguishing_power(-1, 3), 1.0);
    assert_eq!(distinguishing_power(1, -3), 1.0);
}

fn three(e: &Env) {
    for r in ["r1", "r2", "r3"] {
        e.put("t", "m", "vllm", r, &[(100, 16)]);
    }
}

#[test]
fn lookup_exact_zero_distinguishing_when_all_replicas_hold_prefix() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 64)]);
    e.put("t", "m", "vllm", "r2", &[(1, 64)]);
    let r = e.exact("t", "m", "vllm", 1);
    assert_eq!(r.strategy, Strategy::PrefixMatch);
    assert!(r.scores.iter().all(|s| s.score == 0.0));
    assert_eq!(ids(&r), vec!["r1", "r2"]);
}

#[test]
fn lookup_exact_non_zero_distinguishing_when_one_of_three_holds_prefix() {
    let e = Env::new();
    three(&e);
    e.put("t", "m", "vllm", "r2", &[(1, 64)]);
    let r = e.exact("t", "m", "vllm", 1);
    assert_eq!(r.scores[0].score, 64.0 * (1.0 - 1.0 / 3.0) as f32);
}

#[test]
fn lookup_exact_partial_diffusion_two_of_three() {
    let e = Env::new();
    three(&e);
    e.put("t", "m", "vllm", "r1", &[(1, 64)]);
    e.put("t", "m", "vllm", "r3", &[(1, 64)]);
    let r = e.exact("t", "m", "vllm", 1);
    assert_eq!(ids(&r), vec!["r1", "r3"]);
    for s in &r.scores {
        assert_eq!(s.score, 64.0 * (1.0 - 2.0 / 3.0) as f32);
    }
}

#[test]
fn lookup_exact_single_replica_preserves_baseline_score() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 64)]);
    assert_eq!(e.exact("t", "m", "vllm", 1).scores[0].score, 64.0);
}

#[test]
fn lookup_chain_depth_aware_distinguishing_power() {
    // Pinned worked example: depths 256/128/64, factors 2/3, 1/3, 0.
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[1, 2, 3, 4], &[64; 4]);
    e.put_chain("t", "m", "vllm", "b", &[1, 2], &[64; 2]);
    e.put_chain("t", "m", "vllm", "c", &[1], &[64]);
    let r = e.chain("t", "m", "vllm", &[1, 2, 3, 4], &[64; 4]);
    assert_eq!(ids(&r), vec!["a", "b", "c"]);
    assert!(approx(r.scores[0].score, 170.666_67));
    assert!(approx(r.scores[1].score, 42.666_67));
    assert_eq!(r.scores[2].score, 0.0);
    assert_eq!(r.scores[0].score, 256.0 * (1.0 - 1.0 / 3.0) as f32);
    assert_eq!(r.scores[1].score, 128.0 * (1.0 - 2.0 / 3.0) as f32);
}

#[test]
fn lookup_chain_shared_head_zero_distinguishing() {
    let e = Env::new();
    for r in ["a", "b", "c"] {
        e.put_chain("t", "m", "vllm", r, &[1, 2], &[16, 16]);
    }
    let r = e.chain("t", "m", "vllm", &[1, 2], &[16, 16]);
    assert_eq!(r.scores.len(), 3);
    assert!(
        r.scores
            .iter()
            .all(|s| s.score == 0.0 && s.matched_tokens == 32)
    );
}

#[test]
fn lookup_chain_single_replica_preserves_baseline_score() {
    let e = Env::new();
    e.put_chain("t", "m", "vllm", "a", &[1, 2], &[16, 16]);
    let r = e.chain("t", "m", "vllm", &[1, 2, 3], &[16, 16, 16]);
    assert_eq!(r.scores[0].score, 32.0);
    assert_eq!(r.scores[0].matched_tokens, 32);
}

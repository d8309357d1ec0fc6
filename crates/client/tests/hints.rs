//! Real answers parse into the right typed hint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{NO_AFFINITY, Running, chain_entry, hot_update, update};
use inferencecache_client::{
    Candidate, Hint, NoHintReason, PrefixEntry, RoundRobin, RouteInput, RouteQuery, Tier,
};

fn query(input: RouteInput) -> RouteQuery {
    RouteQuery::new("t", "m", input)
}

fn prompt() -> Vec<u32> {
    (0..80).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_state_is_a_prefix_match_for_every_input_form() {
    let s = Running::start_contract().await;
    s.policy(NO_AFFINITY).await;
    let client = common::sdk(&s).await;
    let ack = client
        .report_state(vec![update("r1", vec![chain_entry(&prompt())])])
        .await
        .unwrap();
    assert!(ack.accepted, "{ack:?}");

    let answer = client
        .lookup_route(&query(RouteInput::TokenIds(prompt())))
        .await;
    let Hint::PrefixMatch(candidates) = &answer.hint else {
        panic!("{:?}", answer.hint);
    };
    assert_eq!(candidates.len(), 1);
    let best: &Candidate = answer.hint.best().unwrap();
    assert_eq!(best.replica_id, "r1");
    assert_eq!(best.matched_tokens, 80);
    assert_eq!(best.tier, Tier::T1);
    assert!(best.score > 0.0 && best.hit_probability > 0.0);
    assert_eq!(answer.hint.reason_code(), "PREFIX_MATCH");
    assert!(answer.server_latency_us >= 0);
    assert!(answer.latency > std::time::Duration::ZERO);

    // The same chain computed client-side: tokens never leave the gateway.
    let chained = client
        .lookup_route(&query(RouteInput::chain_from_tokens(&prompt(), 16)))
        .await;
    // Scores decay with freshness, so compare what routing uses.
    let top = chained.hint.best().unwrap();
    assert_eq!(chained.hint.reason_code(), "PREFIX_MATCH");
    assert_eq!((top.replica_id.as_str(), top.matched_tokens), ("r1", 80));

    // A longer prompt sharing the first 64 tokens matches 64 of them.
    let mut longer: Vec<u32> = (0..64).collect();
    longer.extend(1000..1100);
    let partial = client
        .lookup_route(&query(RouteInput::TokenIds(longer)))
        .await;
    assert_eq!(partial.hint.best().unwrap().matched_tokens, 64);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn legacy_prefix_hashes_match_exactly() {
    let s = Running::start_contract().await;
    let client = common::sdk(&s).await;
    let entry = PrefixEntry {
        prefix_hash: vec![9; 8],
        token_count: 128,
        ..Default::default()
    };
    client
        .report_state(vec![update("r2", vec![entry])])
        .await
        .unwrap();
    let answer = client
        .lookup_route(&query(RouteInput::PrefixHash {
            hash: vec![9; 8],
            token_count: 128,
        }))
        .await;
    assert!(
        matches!(answer.hint, Hint::PrefixMatch(_)),
        "{:?}",
        answer.hint
    );
    assert_eq!(answer.hint.best().unwrap().matched_tokens, 128);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_novel_prompt_for_a_hot_replica_is_tenant_hot() {
    let s = Running::start_contract().await;
    s.policy(NO_AFFINITY).await;
    let client = common::sdk(&s).await;
    client
        .report_state(vec![hot_update("hot", vec![chain_entry(&prompt())])])
        .await
        .unwrap();
    let answer = client
        .lookup_route(&query(RouteInput::PrefixHash {
            hash: vec![50; 8],
            token_count: 128,
        }))
        .await;
    let Hint::TenantHot(c) = &answer.hint else {
        panic!("{:?}", answer.hint);
    };
    assert_eq!(c[0].replica_id, "hot");
    assert_eq!(c[0].matched_tokens, 0);
    assert_eq!(c[0].tier, Tier::Unspecified);
    assert_eq!(answer.hint.reason_code(), "TENANT_HOT");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_novel_prompt_in_a_known_domain_is_a_stable_affinity_hint() {
    let s = Running::start_contract().await;
    let client = common::sdk(&s).await;
    client
        .report_state(vec![
            update("a", vec![chain_entry(&prompt())]),
            update("b", vec![chain_entry(&(500..580).collect::<Vec<_>>())]),
        ])
        .await
        .unwrap();
    let novel = query(RouteInput::TokenIds((9000..9064).collect()));
    let first = client.lookup_route(&novel).await;
    let Hint::Affinity(c) = &first.hint else {
        panic!("{:?}", first.hint);
    };
    assert_eq!(c.len(), 1);
    assert_eq!((c[0].score, c[0].matched_tokens), (0.0, 0));
    assert_eq!(first.hint.reason_code(), "AFFINITY_HINT");
    let again = client.lookup_route(&novel).await;
    assert_eq!(
        again.hint.best().map(|c| &c.replica_id),
        first.hint.best().map(|c| &c.replica_id),
        "the assignment is stable"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misconfigured_keys_are_diagnosed_and_cold_start_is_no_hint() {
    let s = Running::start_contract().await;
    let client = common::sdk(&s).await;
    // Cold start: an empty index never blames the caller.
    let cold = client
        .lookup_route(&query(RouteInput::TokenIds(prompt())))
        .await;
    assert_eq!(cold.hint, Hint::NoHint(NoHintReason::NoHint));
    client
        .report_state(vec![update("r1", vec![chain_entry(&prompt())])])
        .await
        .unwrap();
    let mut q = query(RouteInput::TokenIds(prompt()));
    q.tenant_id = "nobody".into();
    let answer = client.lookup_route(&q).await;
    assert_eq!(answer.hint, Hint::NoHint(NoHintReason::UnknownTenant));
    assert!(matches!(&answer.hint, Hint::NoHint(r) if r.is_misconfiguration()));
    q.tenant_id = "t".into();
    q.model_id = "other".into();
    assert_eq!(
        client.lookup_route(&q).await.hint,
        Hint::NoHint(NoHintReason::UnknownModel)
    );
    q.model_id = "m".into();
    q.hash_scheme = "sglang".into();
    assert_eq!(
        client.lookup_route(&q).await.hint,
        Hint::NoHint(NoHintReason::UnknownHashScheme)
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_follows_real_hints_and_rotates_without_them() {
    let s = Running::start_contract().await;
    s.policy(NO_AFFINITY).await;
    let client = common::sdk(&s).await;
    client
        .report_state(vec![update("r2", vec![chain_entry(&prompt())])])
        .await
        .unwrap();
    let replicas: Vec<String> = ["r1", "r2", "r3"].map(String::from).to_vec();
    let rr = RoundRobin::new();
    let hit = client
        .lookup_route(&query(RouteInput::TokenIds(prompt())))
        .await;
    assert_eq!(rr.pick(&hit.hint, &replicas), "r2");
    let miss = client
        .lookup_route(&query(RouteInput::TokenIds((7000..7064).collect())))
        .await;
    assert!(!miss.hint.is_hint(), "{:?}", miss.hint);
    let picks: Vec<&str> = (0..3).map(|_| rr.pick(&miss.hint, &replicas)).collect();
    assert_eq!(picks, ["r1", "r2", "r3"]);
    // A hint naming a replica this gateway does not have is ignored.
    assert_eq!(rr.pick(&hit.hint, &["x".to_string()]), "x");
    s.stop().await;
}

//! The default estimated-TTFT ranking end to end over real gRPC, and the two
//! ways back to the reference's ranking (`--ranking contract`, CachePolicy v8
//! `routing.ranking`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Running, chain_req, h, report};
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::*;
use tonic::transport::Channel;

type Client = InferenceCacheClient<Channel>;

fn chain_entry(n: u8) -> PrefixEntry {
    PrefixEntry {
        block_hashes: (1..=n).map(h).collect(),
        block_token_counts: vec![64; n as usize],
        ..Default::default()
    }
}

fn update(replica: &str, prefixes: Vec<PrefixEntry>, stats: bool) -> CacheStateUpdate {
    CacheStateUpdate {
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes,
        stats: stats.then(|| ReplicaStats {
            replica_id: replica.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn lookup(c: &mut Client, r: LookupRouteRequest) -> LookupRouteResponse {
    c.lookup_route(r).await.unwrap().into_inner()
}

/// "holder" holds blocks 1-2; "idle-1".."idle-3" only report stats.
async fn fleet(c: &mut Client) {
    let mut updates = vec![update("holder", vec![chain_entry(2)], true)];
    for r in ["idle-1", "idle-2", "idle-3"] {
        updates.push(update(r, vec![], true));
    }
    report(c, updates).await;
}

/// Picks of 30 distinct cold prompts.
async fn miss_picks(c: &mut Client) -> std::collections::BTreeSet<String> {
    let mut picks = std::collections::BTreeSet::new();
    for k in 0..30u8 {
        let r = lookup(c, chain_req(100 + k..=100 + k)).await;
        assert_eq!(r.reason_code, "AFFINITY_HINT");
        picks.insert(r.replica_scores[0].replica_id.clone());
    }
    picks
}

#[tokio::test]
async fn default_ranking_spreads_misses_over_the_whole_fleet_and_follows_up_tentatively() {
    // The index's time is the test's.
    let (s, clock) = common::start_on_manual_clock().await;
    // The bounded-load rule counts hints over minutes (120 s half-life): 30
    // misses fired into 4 replicas within a second would trip it wherever
    // the seeds cluster, so it is off here (its own tests are in
    // crates/index/tests/routing.rs); everything else is the defaults.
    let r = reqwest::Client::new()
        .post(s.control_url("/policy"))
        .body(r#"{"version":8,"policies":[{"namespace":"t","routing":{"loadBound":0}}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let mut c = s.client().await;
    fleet(&mut c).await;
    let picks = miss_picks(&mut c).await;
    assert!(
        picks.len() >= 3,
        "stats-only replicas get misses: {picks:?}"
    );
    // Let the delivered-hint window drain (each miss queued ~8 ms of work).
    clock.advance(std::time::Duration::from_millis(500));
    // A prefix match is still a prefix match.
    let r = lookup(&mut c, chain_req(1..=3)).await;
    assert_eq!(r.reason_code, "PREFIX_MATCH");
    assert_eq!(r.replica_scores[0].replica_id, "holder");
    assert_eq!(r.replica_scores[0].matched_tokens, 128);
    assert!(r.replica_scores[0].score > 0.0 && r.replica_scores[0].score <= 1.0);
    // Approximate mode: the delivered miss's chain is a tentative holding,
    // so the same prompt again goes to the same replica as a PREFIX_MATCH
    // although no KV event arrived.
    let first = lookup(&mut c, chain_req(200..=203)).await;
    assert_eq!(first.reason_code, "AFFINITY_HINT");
    // The follow-up comes after the first prefill (~18 ms of queued work).
    clock.advance(std::time::Duration::from_millis(100));
    let again = lookup(&mut c, chain_req(200..=204)).await;
    assert_eq!(again.reason_code, "PREFIX_MATCH");
    assert_eq!(
        again.replica_scores[0].replica_id,
        first.replica_scores[0].replica_id
    );
    assert_eq!(again.replica_scores[0].matched_tokens, 256);
    // Counted separately in /snapshot and the metrics.
    let snap: serde_json::Value = serde_json::from_str(
        &reqwest::get(s.control_url("/snapshot"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    assert!(snap["tentativeEntries"].as_i64().unwrap() >= 4, "{snap}");
    let m = s.metrics_text().await;
    assert!(m.contains("inferencecache_tentative_holdings "), "{m}");
    assert!(m.contains("inferencecache_lookup_route_rankings_total{ranking=\"ttft\"}"));
    s.stop().await;
}

#[tokio::test]
async fn ranking_contract_flag_restores_the_reference_affinity_set() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    fleet(&mut c).await;
    // The reference picks among replicas serving the scope: only "holder".
    let picks = miss_picks(&mut c).await;
    assert_eq!(picks.into_iter().collect::<Vec<_>>(), ["holder"]);
    let snap = reqwest::get(s.control_url("/snapshot"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!snap.contains("tentative"), "no approximate mode: {snap}");
    s.stop().await;
}

#[tokio::test]
async fn policy_v8_routing_ranking_contract_restores_it_per_tenant() {
    let s = Running::start().await;
    let r = reqwest::Client::new()
        .post(s.control_url("/policy"))
        .body(r#"{"version":8,"policies":[{"namespace":"t","minimumMatchedTokens":64,"routing":{"ranking":"contract"}}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let mut c = s.client().await;
    fleet(&mut c).await;
    let picks = miss_picks(&mut c).await;
    assert_eq!(picks.into_iter().collect::<Vec<_>>(), ["holder"]);
    // And back: a v8 body choosing ttft.
    let r = reqwest::Client::new()
        .post(s.control_url("/policy"))
        .body(r#"{"version":8,"policies":[{"namespace":"t","routing":{"ranking":"ttft"}}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    assert!(miss_picks(&mut c).await.len() >= 3);
    s.stop().await;
}

//! Shadow lookups (`x-inferencecache-shadow: true`) over real gRPC: the
//! answer a LookupRoute gets, with no delivery recorded, so probes and
//! dashboards that never send the request leave no queued work and no
//! tentative holding behind (issue 33: a test's never-sent probes claimed
//! blocks on the wrong replica).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{chain_req, h, report};
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::*;
use std::time::Duration;
use tonic::transport::Channel;

type Client = InferenceCacheClient<Channel>;

fn update(replica: &str, blocks: u8) -> CacheStateUpdate {
    CacheStateUpdate {
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes: (blocks > 0)
            .then(|| PrefixEntry {
                block_hashes: (1..=blocks).map(h).collect(),
                block_token_counts: vec![64; usize::from(blocks)],
                ..Default::default()
            })
            .into_iter()
            .collect(),
        stats: Some(ReplicaStats {
            replica_id: replica.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn lookup(c: &mut Client, r: LookupRouteRequest, shadow: bool) -> LookupRouteResponse {
    let mut req = tonic::Request::new(r);
    if shadow {
        req.metadata_mut()
            .insert("x-inferencecache-shadow", "true".parse().unwrap());
    }
    let mut a = c.lookup_route(req).await.unwrap().into_inner();
    a.lookup_latency_us = 0;
    a
}

fn top(a: &LookupRouteResponse) -> (&str, &str, i32) {
    let s = &a.replica_scores[0];
    (
        a.reason_code.as_str(),
        s.replica_id.as_str(),
        s.matched_tokens,
    )
}

fn delivered(metrics: &str) -> &str {
    metrics
        .lines()
        .find(|l| l.starts_with("inferencecache_delivered_hints_total "))
        .unwrap_or_else(|| panic!("no delivered-hints counter: {metrics}"))
}

#[tokio::test]
async fn a_shadow_lookup_answers_as_a_lookup_and_delivers_nothing() {
    // The index's time is the test's.
    let (s, clock) = common::start_on_manual_clock().await;
    let mut c = s.client().await;
    report(
        &mut c,
        vec![
            update("holder", 2),
            update("idle-1", 0),
            update("idle-2", 0),
        ],
    )
    .await;

    // A cold prompt, asked three times in shadow: one pick, and no
    // tentative holding for its follow-up.
    let cold: Vec<_> = [
        lookup(&mut c, chain_req(200..=203), true).await,
        lookup(&mut c, chain_req(200..=203), true).await,
        lookup(&mut c, chain_req(200..=203), true).await,
    ]
    .into();
    assert_eq!(cold[0].reason_code, "AFFINITY_HINT", "{cold:?}");
    assert!(cold.iter().all(|a| a == &cold[0]), "{cold:?}");
    clock.advance(Duration::from_millis(100));
    let follow = lookup(&mut c, chain_req(200..=204), true).await;
    assert_eq!(follow.reason_code, "AFFINITY_HINT", "{follow:?}");
    // A prefix match in shadow: the holder's claim, nothing delivered.
    let held = lookup(&mut c, chain_req(1..=3), true).await;
    assert_eq!(top(&held), ("PREFIX_MATCH", "holder", 128));
    let m = s.metrics_text().await;
    assert_eq!(delivered(&m), "inferencecache_delivered_hints_total 0");
    let snap: serde_json::Value = serde_json::from_str(
        &reqwest::get(s.control_url("/snapshot"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
    )
    .unwrap();
    // Left out of the snapshot while there are none.
    assert_eq!(snap["tentativeEntries"].as_i64().unwrap_or(0), 0, "{snap}");

    // The same cold prompt as a lookup: the answer the shadow got, now
    // delivered; its follow-up, asked in shadow, sees the tentative holding.
    let first = lookup(&mut c, chain_req(200..=203), false).await;
    assert_eq!(first, cold[0]);
    clock.advance(Duration::from_millis(100));
    let again = lookup(&mut c, chain_req(200..=204), true).await;
    assert_eq!(
        top(&again),
        (
            "PREFIX_MATCH",
            first.replica_scores[0].replica_id.as_str(),
            256
        )
    );
    let m = s.metrics_text().await;
    assert_eq!(delivered(&m), "inferencecache_delivered_hints_total 1");
    s.stop().await;
}

//! LookupRoute end to end over real gRPC: reason codes, precedence, floors,
//! affinity, deadlines, dual input, adapters, tiers, LFU credit
//! (`server.md` §3 and the server part of §13), under `--ranking contract`
//! (the reference's ranking; the default ranking is tested in `ranking.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Running, report};
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::*;
use inferencecache_server::ServerConfig;
use tonic::transport::Channel;

type Client = InferenceCacheClient<Channel>;

fn h(b: u8) -> Vec<u8> {
    vec![b; 8]
}

fn entry(hash: Vec<u8>, tokens: i32) -> PrefixEntry {
    PrefixEntry {
        prefix_hash: hash,
        token_count: tokens,
        ..Default::default()
    }
}

fn update(replica: &str, prefixes: Vec<PrefixEntry>) -> CacheStateUpdate {
    CacheStateUpdate {
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes,
        ..Default::default()
    }
}

fn req() -> LookupRouteRequest {
    LookupRouteRequest {
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        ..Default::default()
    }
}

fn exact(hash: Vec<u8>, tokens: i32) -> LookupRouteRequest {
    LookupRouteRequest {
        prefix_hash: hash,
        prefix_token_count: tokens,
        ..req()
    }
}

async fn lookup(c: &mut Client, r: LookupRouteRequest) -> LookupRouteResponse {
    c.lookup_route(r)
        .await
        .expect("LookupRoute never errors")
        .into_inner()
}

async fn policy(s: &Running, body: &str) {
    let r = reqwest::Client::new()
        .post(s.control_url("/policy"))
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "{}", r.text().await.unwrap());
}

const NO_AFFINITY: &str = r#"{"version":7,"policies":[{"namespace":"t","affinityRouting":false,"minimumMatchedTokens":64}]}"#;

#[tokio::test]
async fn report_then_lookup_is_a_prefix_match() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    report(&mut c, vec![update("r1", vec![entry(h(1), 128)])]).await;
    let r = lookup(&mut c, exact(h(1), 128)).await;
    assert_eq!(r.reason_code, "PREFIX_MATCH");
    assert_eq!(r.replica_scores.len(), 1);
    let top = &r.replica_scores[0];
    assert_eq!(top.replica_id, "r1");
    assert_eq!(top.matched_tokens, 128);
    assert_eq!(
        top.tier,
        CacheTier::T1 as i32,
        "UNSPECIFIED is stored as T1"
    );
    assert!(top.score > 127.0 && top.estimated_cache_hit_prob > 0.99);
    s.stop().await;
}

#[tokio::test]
async fn chain_lookup_reports_the_longest_leading_run_per_replica() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    let chain = |n: usize| PrefixEntry {
        block_hashes: (1..=n as u8).map(h).collect(),
        block_token_counts: vec![64; n],
        ..Default::default()
    };
    report(
        &mut c,
        vec![
            update("deep", vec![chain(4)]),
            update("shallow", vec![chain(2)]),
        ],
    )
    .await;
    let r = lookup(
        &mut c,
        LookupRouteRequest {
            block_hashes: (1..=6).map(|i| h(i).into()).collect(),
            block_token_counts: vec![64; 6],
            ..req()
        },
    )
    .await;
    assert_eq!(r.reason_code, "PREFIX_MATCH");
    let got: Vec<(&str, i32)> = r
        .replica_scores
        .iter()
        .map(|s| (s.replica_id.as_str(), s.matched_tokens))
        .collect();
    assert_eq!(got, vec![("deep", 256), ("shallow", 128)]);
    s.stop().await;
}

#[tokio::test]
async fn unknown_tenant_model_and_scheme_are_diagnosed_and_cold_start_is_no_hint() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    // Cold start: empty index → NO_HINT, never UNKNOWN_*.
    assert_eq!(
        lookup(&mut c, exact(h(9), 128)).await.reason_code,
        "NO_HINT"
    );
    report(&mut c, vec![update("r1", vec![entry(h(1), 128)])]).await;
    let other = |t: &str, m: &str, sch: &str| LookupRouteRequest {
        tenant_id: t.into(),
        model_id: m.into(),
        hash_scheme: sch.into(),
        ..exact(h(9), 128)
    };
    assert_eq!(
        lookup(&mut c, other("t2", "m", "vllm")).await.reason_code,
        "UNKNOWN_TENANT"
    );
    assert_eq!(
        lookup(&mut c, other("t", "m2", "vllm")).await.reason_code,
        "UNKNOWN_MODEL"
    );
    assert_eq!(
        lookup(&mut c, other("t", "m", "sglang")).await.reason_code,
        "UNKNOWN_HASH_SCHEME"
    );
    assert_eq!(
        lookup(&mut c, other("t", "m", "")).await.reason_code,
        "NO_HINT"
    );
    s.stop().await;
}

#[tokio::test]
async fn a_novel_prefix_in_a_known_domain_gets_a_stable_affinity_hint() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    report(
        &mut c,
        vec![
            update("r1", vec![entry(h(1), 128)]),
            update("r2", vec![entry(h(2), 128)]),
        ],
    )
    .await;
    let first = lookup(&mut c, exact(h(77), 128)).await;
    assert_eq!(first.reason_code, "AFFINITY_HINT");
    assert_eq!(first.replica_scores.len(), 1);
    let pick = &first.replica_scores[0];
    assert_eq!(
        (
            pick.score,
            pick.matched_tokens,
            pick.estimated_cache_hit_prob,
            pick.tier
        ),
        (0.0, 0, 0.0, 0)
    );
    for _ in 0..10 {
        let again = lookup(&mut c, exact(h(77), 128)).await;
        assert_eq!(
            again.replica_scores[0].replica_id, pick.replica_id,
            "stable"
        );
    }
    // Affinity disabled by policy → a plain miss.
    policy(&s, NO_AFFINITY).await;
    assert_eq!(
        lookup(&mut c, exact(h(77), 128)).await.reason_code,
        "NO_HINT"
    );
    s.stop().await;
}

#[tokio::test]
async fn affinity_pick_matches_the_cross_check_vector() {
    // Seed of the two_block_chain chain → u64 13380606229280301753; mod 2 = 1.
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    report(
        &mut c,
        vec![
            update("a", vec![entry(h(1), 128)]),
            update("b", vec![entry(h(2), 128)]),
        ],
    )
    .await;
    let chain = inferencecache_fingerprint::chain(&(1..=32).collect::<Vec<u32>>(), 16);
    let r = lookup(
        &mut c,
        LookupRouteRequest {
            block_hashes: chain
                .block_hashes
                .iter()
                .map(|b| b.to_vec().into())
                .collect(),
            block_token_counts: chain.block_token_counts.clone(),
            ..req()
        },
    )
    .await;
    assert_eq!(r.reason_code, "AFFINITY_HINT");
    assert_eq!(
        r.replica_scores[0].replica_id, "b",
        "index 1 of the byte-sorted set [a, b]"
    );
    s.stop().await;
}

#[tokio::test]
async fn matched_tokens_floor_defaults_to_64() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    policy(
        &s,
        r#"{"version":3,"policies":[{"namespace":"t","affinityRouting":false}]}"#,
    )
    .await;
    report(
        &mut c,
        vec![update("r1", vec![entry(h(1), 32), entry(h(2), 64)])],
    )
    .await;
    assert_eq!(
        lookup(&mut c, exact(h(1), 32)).await.reason_code,
        "NO_HINT",
        "32 < 64"
    );
    assert_eq!(
        lookup(&mut c, exact(h(2), 64)).await.reason_code,
        "PREFIX_MATCH",
        "64 >= 64"
    );
    // An explicit 0 (v4+) disables the floor.
    policy(&s, r#"{"version":7,"policies":[{"namespace":"t","affinityRouting":false,"minimumMatchedTokens":0}]}"#).await;
    assert_eq!(
        lookup(&mut c, exact(h(1), 32)).await.reason_code,
        "PREFIX_MATCH"
    );
    s.stop().await;
}

#[tokio::test]
async fn routing_floor_downgrades_a_prefix_every_replica_holds() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    policy(&s, NO_AFFINITY).await;
    report(
        &mut c,
        vec![
            update("r1", vec![entry(h(1), 128)]),
            update("r2", vec![entry(h(1), 128)]),
        ],
    )
    .await;
    // Both hold it: distinguishing power 0 → score 0 < 0.1.
    assert_eq!(
        lookup(&mut c, exact(h(1), 128)).await.reason_code,
        "NO_HINT"
    );
    // Floor 0 opts out.
    policy(&s, r#"{"version":7,"policies":[{"namespace":"t","affinityRouting":false,"routingFloorScore":0}]}"#).await;
    let r = lookup(&mut c, exact(h(1), 128)).await;
    assert_eq!(r.reason_code, "PREFIX_MATCH");
    assert!(r.replica_scores.iter().all(|s| s.score == 0.0));
    s.stop().await;
}

#[tokio::test]
async fn require_chain_refuses_requests_without_a_chain() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    policy(
        &s,
        r#"{"version":7,"policies":[{"namespace":"t","strategy":{"requireChain":true}}]}"#,
    )
    .await;
    let r = lookup(&mut c, exact(h(1), 128)).await;
    assert_eq!(r.reason_code, "POLICY_REQUIRES_CHAIN");
    assert!(r.adapter_id.is_empty());
    let ok = lookup(
        &mut c,
        LookupRouteRequest {
            block_hashes: vec![h(1).into()],
            block_token_counts: vec![128],
            ..req()
        },
    )
    .await;
    assert_ne!(ok.reason_code, "POLICY_REQUIRES_CHAIN");
    s.stop().await;
}

#[tokio::test]
async fn min_prefix_gate_is_no_hint_without_affinity_and_affinity_with_it() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    report(&mut c, vec![update("r1", vec![entry(h(1), 128)])]).await;
    policy(&s, r#"{"version":7,"policies":[{"namespace":"t","minimumPrefixTokens":256,"affinityRouting":false}]}"#).await;
    assert_eq!(
        lookup(&mut c, exact(h(1), 128)).await.reason_code,
        "NO_HINT"
    );
    policy(
        &s,
        r#"{"version":7,"policies":[{"namespace":"t","minimumPrefixTokens":256}]}"#,
    )
    .await;
    let r = lookup(&mut c, exact(h(1), 128)).await;
    assert_eq!(
        r.reason_code, "AFFINITY_HINT",
        "PREFIX_MATCH demoted below the gate, then affinity"
    );
    s.stop().await;
}

#[tokio::test]
async fn tenant_hot_answers_novel_prefixes_for_hot_replicas() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    policy(&s, NO_AFFINITY).await;
    let mut u = update("hot", vec![entry(h(1), 128)]);
    u.stats = Some(ReplicaStats {
        hit_rate: 0.8,
        ..Default::default()
    });
    report(&mut c, vec![u]).await;
    let r = lookup(&mut c, exact(h(50), 128)).await;
    assert_eq!(r.reason_code, "TENANT_HOT");
    assert_eq!(r.replica_scores[0].replica_id, "hot");
    assert_eq!(r.replica_scores[0].matched_tokens, 0);
    // Disabled by policy → NO_HINT.
    policy(&s, r#"{"version":7,"policies":[{"namespace":"t","affinityRouting":false,"strategy":{"enableTenantHot":false}}]}"#).await;
    assert_eq!(
        lookup(&mut c, exact(h(50), 128)).await.reason_code,
        "NO_HINT"
    );
    s.stop().await;
}

#[tokio::test]
async fn caller_deadline_already_breached_is_timeout_or_deadline_status() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    let mut request = tonic::Request::new(exact(h(1), 128));
    request.set_timeout(std::time::Duration::from_nanos(1));
    match c.lookup_route(request).await {
        Ok(r) => assert_eq!(r.into_inner().reason_code, "TIMEOUT"),
        // A transport may refuse to start an already-expired call; either
        // way the gateway proceeds without a hint.
        Err(st) => assert!(
            matches!(
                st.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
            "{st:?}"
        ),
    }
    s.stop().await;
}

#[tokio::test]
async fn token_ids_are_fingerprinted_like_an_explicit_chain() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    policy(&s, NO_AFFINITY).await;
    let tokens: Vec<u32> = (0..80).collect();
    let chain = inferencecache_fingerprint::chain(&tokens, 16);
    report(
        &mut c,
        vec![update(
            "r1",
            vec![PrefixEntry {
                block_hashes: chain.block_hashes.iter().map(|b| b.to_vec()).collect(),
                block_token_counts: chain.block_token_counts.clone(),
                ..Default::default()
            }],
        )],
    )
    .await;
    let r = lookup(
        &mut c,
        LookupRouteRequest {
            token_ids: tokens,
            ..req()
        },
    )
    .await;
    assert_eq!(r.reason_code, "PREFIX_MATCH");
    assert_eq!(r.replica_scores[0].matched_tokens, 80);
    assert!(r.token_ids.is_empty(), "token_ids are not echoed");
    // Shorter than one block: fail open.
    let short = lookup(
        &mut c,
        LookupRouteRequest {
            token_ids: vec![1, 2, 3],
            ..req()
        },
    )
    .await;
    assert_eq!(short.reason_code, "NO_HINT");
    s.stop().await;
}

#[tokio::test]
async fn adapter_partitions_do_not_alias_and_are_echoed() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    policy(&s, NO_AFFINITY).await;
    let mut u = update("r1", vec![entry(h(1), 128)]);
    u.adapter_id = "lora-a".into();
    report(&mut c, vec![u]).await;
    let hit = lookup(
        &mut c,
        LookupRouteRequest {
            adapter_id: "lora-a".into(),
            ..exact(h(1), 128)
        },
    )
    .await;
    assert_eq!(hit.reason_code, "PREFIX_MATCH");
    assert_eq!(hit.adapter_id, "lora-a");
    let miss = lookup(
        &mut c,
        LookupRouteRequest {
            adapter_id: "lora-b".into(),
            ..exact(h(1), 128)
        },
    )
    .await;
    assert_eq!(
        miss.reason_code, "NO_HINT",
        "an unseen adapter is a novel miss"
    );
    assert_eq!(miss.adapter_id, "lora-b");
    assert_eq!(
        lookup(&mut c, exact(h(1), 128)).await.reason_code,
        "NO_HINT"
    );
    s.stop().await;
}

#[tokio::test]
async fn tiers_travel_end_to_end() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    let mut e = entry(h(1), 128);
    e.tier = CacheTier::T2 as i32;
    report(&mut c, vec![update("r1", vec![e])]).await;
    let r = lookup(&mut c, exact(h(1), 128)).await;
    assert_eq!(r.replica_scores[0].tier, CacheTier::T2 as i32);
    s.stop().await;
}

#[tokio::test]
async fn evicted_prefix_stops_matching() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    policy(&s, NO_AFFINITY).await;
    report(&mut c, vec![update("r1", vec![entry(h(1), 128)])]).await;
    c.publish_event(CacheEvent {
        r#type: cache_event::Type::PrefixEvicted as i32,
        replica_id: "r1".into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        prefix_hash: h(1),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_ne!(
        lookup(&mut c, exact(h(1), 128)).await.reason_code,
        "PREFIX_MATCH"
    );
    s.stop().await;
}

#[tokio::test]
async fn probe_tenant_is_unreachable_through_the_public_contract() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    let probe = "inferencecache.io/probe";
    let mut u = update("r1", vec![entry(h(1), 128)]);
    u.tenant_id = probe.into();
    report(&mut c, vec![u]).await;
    let st = common::cache_state(&mut c, "m", probe).await;
    assert!(st.replicas.is_empty());
    assert_eq!(st.summary.unwrap().total_prefixes, 0);
    let r = lookup(
        &mut c,
        LookupRouteRequest {
            tenant_id: probe.into(),
            ..exact(h(1), 128)
        },
    )
    .await;
    assert_eq!(
        (r.reason_code.as_str(), r.lookup_latency_us),
        ("NO_HINT", 0)
    );
    s.stop().await;
}

#[tokio::test]
async fn get_cache_state_aggregates_stats_prefixes_and_lfu_hot_prefixes() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    policy(
        &s,
        r#"{"version":7,"policies":[{"namespace":"t","eviction":"lfu"}]}"#,
    )
    .await;
    let mut u = update("r1", vec![entry(h(1), 128), entry(h(2), 128)]);
    u.stats = Some(ReplicaStats {
        replica_id: "ignored".into(),
        cache_memory_bytes: 1024,
        hit_rate: 0.5,
        pressure: 0.25,
        client_version: "lmcache-0.3".into(),
        t2_hit_tokens: 3,
        t2_query_tokens: 4,
        load: Some(EngineLoad {
            running_requests: 2,
            waiting_requests: 1,
            kv_cache_usage: f32::INFINITY,
            kv_cache_capacity_tokens: 8192,
        }),
    });
    report(&mut c, vec![u, update("r2", vec![entry(h(3), 128)])]).await;
    assert_eq!(
        lookup(&mut c, exact(h(1), 128)).await.reason_code,
        "PREFIX_MATCH"
    );
    let st = common::cache_state(&mut c, "m", "t").await;
    let summary = st.summary.unwrap();
    assert_eq!(summary.total_prefixes, 3);
    assert_eq!(summary.hot_prefixes, 1, "one delivered LFU hit");
    assert_eq!(st.replicas.len(), 1, "only r1 reported stats");
    let r1 = &st.replicas[0];
    assert_eq!(
        r1.replica_id, "r1",
        "top-level replica id, not the nested one"
    );
    assert_eq!(
        (r1.cache_memory_bytes, r1.t2_hit_tokens, r1.t2_query_tokens),
        (1024, 3, 4)
    );
    assert_eq!(r1.client_version, "lmcache-0.3");
    let load = r1.load.unwrap();
    assert_eq!((load.running_requests, load.waiting_requests), (2, 1));
    assert_eq!(load.kv_cache_usage, 0.0, "non-finite usage is stored as 0");
    assert_eq!(load.kv_cache_capacity_tokens, 8192);
    s.stop().await;
}

#[tokio::test]
async fn lookup_metrics_carry_reason_and_hint_used() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    report(&mut c, vec![update("r1", vec![entry(h(1), 128)])]).await;
    lookup(&mut c, exact(h(1), 128)).await;
    lookup(
        &mut c,
        LookupRouteRequest {
            tenant_id: "nobody".into(),
            ..exact(h(1), 128)
        },
    )
    .await;
    let body = s.metrics_text().await;
    assert!(body.contains(r#"inferencecache_lookup_route_calls_total{model="m",reason_code="PREFIX_MATCH",hint_used="true"} 1"#), "{body}");
    assert!(body.contains(r#"inferencecache_lookup_route_calls_total{model="m",reason_code="UNKNOWN_TENANT",hint_used="false"} 1"#), "{body}");
    assert!(
        body.contains(r#"inferencecache_index_entries{model="m"} 1"#),
        "{body}"
    );
    s.stop().await;
}

#[tokio::test]
async fn policy_budget_breached_during_resolution_is_timeout() {
    // One-token blocks: the largest accepted token list (1 Mi tokens) is
    // 1 Mi blocks to fingerprint, about 10 ms in a release build and far
    // more in a debug one, so the 1 ms budget is gone before the index
    // whatever the build (at 16-token blocks a release build fingerprints
    // the same list in under 1 ms).
    let mut config = ServerConfig::ephemeral();
    config.index.ranking = inferencecache_server::core::RankingMode::Contract;
    config.engine_block_size = 1;
    let s = Running::start_with(config).await;
    let mut c = s.client().await;
    policy(
        &s,
        r#"{"version":7,"policies":[{"namespace":"t","lookupTimeoutMs":1}]}"#,
    )
    .await;
    let r = lookup(
        &mut c,
        LookupRouteRequest {
            token_ids: vec![7; 1 << 20],
            adapter_id: "a".into(),
            ..req()
        },
    )
    .await;
    assert_eq!(r.reason_code, "TIMEOUT");
    assert!(r.replica_scores.is_empty());
    assert!(r.adapter_id.is_empty(), "envelopes do not echo the adapter");
    assert!(r.lookup_latency_us >= 1_000, "{}", r.lookup_latency_us);
    // Without the budget the same request is answered.
    policy(&s, r#"{"version":7}"#).await;
    let r = lookup(
        &mut c,
        LookupRouteRequest {
            token_ids: vec![7; 1 << 20],
            ..req()
        },
    )
    .await;
    assert_ne!(r.reason_code, "TIMEOUT");
    s.stop().await;
}

#[tokio::test]
async fn oversized_token_ids_fail_open() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    report(&mut c, vec![update("r1", vec![entry(h(1), 128)])]).await;
    let r = lookup(
        &mut c,
        LookupRouteRequest {
            token_ids: vec![1; (1 << 20) + 1],
            ..req()
        },
    )
    .await;
    assert_eq!(
        r.reason_code, "NO_HINT",
        "more than 1 Mi tokens fails open, before affinity"
    );
    s.stop().await;
}

#[tokio::test]
async fn largest_contract_request_reaches_the_handler() {
    let s = Running::start_contract().await;
    let mut c = s.client().await.max_encoding_message_size(16 << 20);
    // 1 Mi token ids of 5 varint bytes each: over gRPC's 4 MiB default.
    let r = lookup(
        &mut c,
        LookupRouteRequest {
            token_ids: vec![u32::MAX; 1 << 20],
            ..req()
        },
    )
    .await;
    assert_eq!(r.reason_code, "NO_HINT");
    s.stop().await;
}

#[tokio::test]
async fn slow_index_lookup_over_the_budget_is_timeout() {
    let s = Running::start_contract().await;
    let mut c = s.client().await;
    // One replica holds a 20,000-block chain, reported block by block with
    // no parent, so every block is a run of its own: the walk probes the
    // block table 20,000 times, far longer than a 1 ms budget in any build
    // (one 20,000-block run is walked in tens of microseconds). The budget
    // covers the index lookup alone, not the request's decoding.
    let n = 20_000usize;
    let hashes: Vec<Vec<u8>> = (0..n)
        .map(|i| (i as u64 + 1).to_be_bytes().to_vec())
        .collect();
    let blocks = hashes
        .iter()
        .map(|h| PrefixEntry {
            block_hashes: vec![h.clone()],
            block_token_counts: vec![16],
            ..Default::default()
        })
        .collect();
    report(&mut c, vec![update("r1", blocks)]).await;
    let chain = LookupRouteRequest {
        block_hashes: hashes.into_iter().map(Into::into).collect(),
        block_token_counts: vec![16; n],
        ..req()
    };
    assert_eq!(
        lookup(&mut c, chain.clone()).await.reason_code,
        "PREFIX_MATCH"
    );
    policy(
        &s,
        r#"{"version":7,"policies":[{"namespace":"t","lookupTimeoutMs":1}]}"#,
    )
    .await;
    let r = lookup(&mut c, chain).await;
    assert_eq!(
        r.reason_code, "TIMEOUT",
        "latency {} us",
        r.lookup_latency_us
    );
    assert!(r.replica_scores.is_empty());
    s.stop().await;
}

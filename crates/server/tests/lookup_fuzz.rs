//! Property test of the request → response path: arbitrary requests (and
//! policies, and index contents) never panic and always produce a valid,
//! well-formed answer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use inferencecache_proto::v1alpha1::*;
use inferencecache_server::core::{Core, IndexSettings};
use inferencecache_server::metrics::Metrics;
use inferencecache_server::policy::{PolicyStore, decode_policy_json_lenient};
use inferencecache_server::tokenize::Tokenizers;
use proptest::prelude::*;
use std::sync::Arc;

const REASONS: [&str; 9] = [
    "PREFIX_MATCH",
    "TENANT_HOT",
    "AFFINITY_HINT",
    "NO_HINT",
    "TIMEOUT",
    "POLICY_REQUIRES_CHAIN",
    "UNKNOWN_TENANT",
    "UNKNOWN_MODEL",
    "UNKNOWN_HASH_SCHEME",
];

fn small_str() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("t".to_owned()),
        Just("m".to_owned()),
        "[a-z]{1,3}"
    ]
}

fn hash() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        (0u8..4).prop_map(|b| vec![b; 8]),
        proptest::collection::vec(any::<u8>(), 0..12)
    ]
}

fn request() -> impl Strategy<Value = LookupRouteRequest> {
    (
        (
            small_str(),
            small_str(),
            prop_oneof![Just("vllm".to_owned()), small_str()],
            small_str(),
        ),
        (hash(), any::<i32>()),
        (
            proptest::collection::vec(hash(), 0..6),
            proptest::collection::vec(prop_oneof![any::<i32>(), 1i32..64], 0..6),
        ),
        proptest::collection::vec(any::<u32>(), 0..80),
        prop_oneof![Just(String::new()), ".{0,20}"],
        proptest::option::of((any::<i32>(), any::<i32>())),
    )
        .prop_map(
            |((model, tenant, scheme, adapter), (ph, pc), (bh, bc), toks, text, slo)| {
                LookupRouteRequest {
                    model_id: model,
                    tenant_id: tenant,
                    prefix_hash: ph,
                    prefix_token_count: pc,
                    hash_scheme: scheme,
                    slo: slo.map(|(ttft_ms, tbt_ms)| Slo { ttft_ms, tbt_ms }),
                    block_hashes: bh.into_iter().map(Into::into).collect(),
                    block_token_counts: bc,
                    token_ids: toks,
                    prompt_text: text,
                    // Any salt, including odd bytes.
                    cache_salt: adapter.chars().rev().collect(),
                    adapter_id: adapter,
                }
            },
        )
}

fn policy() -> impl Strategy<Value = String> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), -5i32..300, -5i32..300, -1.0f32..2.0, 0i32..3)
        .prop_map(|(aff, chain, req, hot, minp, minm, floor, timeout)| {
            format!(
                r#"{{"version":7,"policies":[{{"namespace":"t","affinityRouting":{aff},"minimumPrefixTokens":{minp},"minimumMatchedTokens":{minm},"routingFloorScore":{floor},"lookupTimeoutMs":{timeout},"eviction":"lfu","strategy":{{"enableChainMatching":{chain},"requireChain":{req},"enableTenantHot":{hot}}}}}]}}"#
            )
        })
}

fn update() -> impl Strategy<Value = CacheStateUpdate> {
    (
        small_str(),
        hash(),
        proptest::collection::vec(hash(), 0..4),
        -2i32..5,
        any::<f32>(),
    )
        .prop_map(|(replica, ph, chain, tier, hit)| CacheStateUpdate {
            replica_id: replica,
            model_id: "m".into(),
            tenant_id: "t".into(),
            hash_scheme: "vllm".into(),
            prefixes: vec![PrefixEntry {
                prefix_hash: ph,
                token_count: 64,
                block_token_counts: vec![16; chain.len()],
                block_hashes: chain,
                tier,
                adapter_id: String::new(),
                no_match_end: false,
            }],
            stats: Some(ReplicaStats {
                hit_rate: hit,
                pressure: hit,
                ..Default::default()
            }),
            ..Default::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn any_request_gets_a_valid_answer(
        updates in proptest::collection::vec(update(), 0..6),
        pol in proptest::option::of(policy()),
        reqs in proptest::collection::vec(request(), 1..8),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let policies = PolicyStore::new();
        if let Some(p) = pol {
            policies.replace(decode_policy_json_lenient(p.as_bytes()).unwrap());
        }
        let core = Core::new(IndexSettings::default(), 16, policies, Arc::new(Metrics::new()), Tokenizers::none());
        for u in updates {
            core.ingest(&inferencecache_server::convert::update_from_proto(u));
        }
        for req in reqs {
            let resp = rt.block_on(inferencecache_server::convert::lookup_route(&core.pipeline, &req, None));
            prop_assert!(REASONS.contains(&resp.reason_code.as_str()), "{}", resp.reason_code);
            prop_assert!(resp.lookup_latency_us >= 0);
            let scores = &resp.replica_scores;
            match resp.reason_code.as_str() {
                "PREFIX_MATCH" | "TENANT_HOT" => prop_assert!(!scores.is_empty()),
                "AFFINITY_HINT" => prop_assert_eq!(scores.len(), 1),
                _ => prop_assert!(scores.is_empty(), "{} with scores", resp.reason_code),
            }
            for pair in scores.windows(2) {
                prop_assert!(
                    pair[0].score > pair[1].score
                        || (pair[0].score == pair[1].score && pair[0].replica_id < pair[1].replica_id),
                    "sorted by score desc, replica asc"
                );
            }
            for s in scores {
                prop_assert!(s.score.is_finite() && s.score >= 0.0);
                prop_assert!((0.0..=1.0).contains(&s.estimated_cache_hit_prob));
            }
        }
    }
}

//! `inferencecache serve` + a sidecar in front of one real vLLM engine with
//! a small KV cache (160 blocks of 32 tokens), called as a gateway calls it
//! (LookupRoute by token_ids, then the request to the replica it names):
//! a hint made while a request hinted earlier will evict blocks the index
//! still lists must claim what the engine then reuses, never more (issue
//! 33's "after the hint" over-claims; the server's eviction foresight,
//! `crates/server/src/foresight`). The gateway's own foresight has the same
//! test over its path (`gateway_real_eviction.rs`).
//!
//! The cache is laid out so the next allocation's victims are known: a
//! system prompt's blocks sit at the front of vLLM's free queue, tail first,
//! when a fresh prompt (P) is hinted and sent and, while the engine
//! prefills it, a repeat of the system prompt (D) is looked up. The index
//! still holds the whole system prompt then (the engine publishes P's
//! evictions when its step ends), so without foresight D is claimed at
//! 1,280 tokens and the engine reuses 352 (run it with
//! INFERENCECACHE_NO_EVICTION_FORESIGHT=true to see it fail). Without the
//! vLLM venv the test skips, unless INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/engine.rs"]
mod engine;
#[path = "common/real_chain.rs"]
mod real_chain;

use inferencecache_proto::v1alpha1::GetCacheStateRequest;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use real_chain::{Chain, TENANT, cat, hint_for, qwen_chain, replica, tokens};
use serde_json::json;
use std::time::{Duration, Instant};

const BLOCK: usize = 32;
/// `--num-gpu-blocks-override`: 159 usable blocks (vLLM keeps one null block).
const BLOCKS: u32 = 160;

/// Polls GetCacheState (which delivers no hint, unlike a LookupRoute probe)
/// until the server holds `want` prefixes and engine 0's load report says
/// its capacity.
async fn wait_prefixes(chain: &Chain, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut c = InferenceCacheClient::connect(format!("http://{}", chain.grpc()))
            .await
            .unwrap();
        let st = c
            .get_cache_state(GetCacheStateRequest {
                model_id: chain.model_id(0),
                tenant_id: TENANT.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let held = st.summary.map_or(0, |s| s.total_prefixes);
        let capacity = st
            .replicas
            .iter()
            .find_map(|r| r.load.map(|l| l.kv_cache_capacity_tokens))
            .unwrap_or(0);
        if held == want && capacity > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server holds {held} prefixes (want {want}), capacity {capacity}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_hint_claims_blocks_a_request_hinted_earlier_evicts() {
    let Some(chain) = qwen_chain(1, &[], &[], |c| c.num_blocks = Some(BLOCKS)).await else {
        return;
    };
    let system: Vec<u32> = tokens(1, 40 * BLOCK);
    let ask = |seed: u64| cat(&system, &tokens(seed, BLOCK + 1));

    // A: the system prompt + a question (41 full blocks + 1 token). Then B,
    // a fresh prompt taking every blank block left (117 full blocks + 1
    // token). Free queue now: B's partial block, A's question block, then
    // the system prompt tail first, then B's blocks.
    let a = chain.judge("A", &ask(100), "", 0).await;
    assert_eq!(a.reused, 0);
    wait_prefixes(&chain, 41).await;
    let b = chain.judge("B", &tokens(2, 117 * BLOCK + 1), "", 0).await;
    assert_eq!(b.reused, 0);
    wait_prefixes(&chain, 41 + 117).await;

    // P: a fresh 30-block (+1 token) prompt, looked up (the hint names r0)
    // and sent, streamed; its headers mean the engine has it. Its 31 new
    // blocks are the partial block, A's question block and the system
    // prompt's blocks 39..=11.
    let p = tokens(3, 30 * BLOCK + 1);
    let hint = chain.lookup(chain.request(0, &p, "")).await;
    assert_eq!(
        hint.replica_scores.first().map(|s| s.replica_id.as_str()),
        Some("r0"),
        "{hint:?}"
    );
    let mut p_resp = reqwest::Client::new()
        .post(format!("{}/v1/completions", chain.engines[0].url))
        .json(
            &json!({"model": chain.model_id(0), "prompt": p, "max_tokens": 4,
                      "temperature": 0, "stream": true}),
        )
        .timeout(Duration::from_secs(300))
        .send()
        .await
        .unwrap();
    assert!(p_resp.status().is_success());

    // D repeats the system prompt while the engine holds P: it can reuse
    // blocks 0..=10 only.
    let d = ask(200);
    let answer = chain.lookup(chain.request(0, &d, "")).await;
    let (reason, d_claim) = hint_for(&answer, &replica(0));
    let (_, d_cached) = chain.complete(0, &d, json!({})).await;
    while p_resp.chunk().await.unwrap().is_some() {}
    eprintln!("D: {reason} claimed {d_claim}, the engine reused {d_cached}");
    assert_eq!(
        u64::try_from(d_claim).unwrap(),
        d_cached,
        "the server claimed {d_claim} tokens ({reason}), the engine reused {d_cached}"
    );
    assert!(
        d_claim < 40 * BLOCK as i32,
        "the evicted tail was withheld: {d_claim}"
    );
    assert!(d_claim > 0, "the surviving head was still claimed");

    // Once P's evictions are indexed, the index and the engine agree.
    let again = chain.judge("again", &ask(300), "", 0).await;
    assert_eq!(u64::try_from(again.hinted).unwrap(), again.reused);
}

/// A gateway fails a lookup open (its deadline passed) and sends the
/// request to the other engine: the server's model of the replica it named
/// must not keep a request there that never starts. Here that request, P,
/// would evict the tail of a system prompt replica 0 holds, so while the
/// model thinks it waits, a repeat of the system prompt (D) is claimed
/// short of what the engine reuses. P's blocks stored on replica 1 take it
/// back from replica 0's model (and count it on replica 1), so D's claim
/// is exact. The sidecars report load every 10 s (the reference's scrape
/// interval), so a load report does not prune P first, as it would within
/// 1-2 s at the default 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_elsewhere_leaves_no_phantom_on_the_hinted_replica() {
    let Some(chain) = qwen_chain(2, &[], &["--stats-interval", "10s"], |c| {
        c.num_blocks = Some(BLOCKS)
    })
    .await
    else {
        return;
    };
    let system: Vec<u32> = tokens(1, 40 * BLOCK);
    let ask = |seed: u64| cat(&system, &tokens(seed, BLOCK + 1));
    let fresh = tokens(2, 117 * BLOCK + 1);

    // Replica 0 as in the test above: the system prompt's tail at the front
    // of its free queue, behind 2 blank blocks.
    let a = chain.complete(0, &ask(100), json!({})).await;
    assert_eq!(a.1, 0);
    wait_prefixes(&chain, 41).await;
    let b = chain.complete(0, &fresh, json!({})).await;
    assert_eq!(b.1, 0);
    wait_prefixes(&chain, 41 + 117).await;

    // P: B's first 8 blocks + 30 fresh ones (+1 token): hinted to replica
    // 0, which holds its head; there its 31 new blocks would take the
    // system prompt's blocks 39..=11. The caller fails open and sends it to
    // replica 1, which stores all 38.
    let p = cat(&fresh[..8 * BLOCK], &tokens(3, 30 * BLOCK + 1));
    let hint = chain.lookup(chain.request(0, &p, "")).await;
    assert_eq!(
        hint.replica_scores.first().map(|s| s.replica_id.as_str()),
        Some("r0"),
        "{hint:?}"
    );
    let delivered = Instant::now();
    let (_, p_cached) = chain.complete(1, &p, json!({})).await;
    assert_eq!(p_cached, 0);
    wait_prefixes(&chain, 41 + 117 + 38).await;

    // D repeats the system prompt on replica 0, which has run nothing since.
    let d = ask(200);
    let answer = chain.lookup(chain.request(0, &d, "")).await;
    let since = delivered.elapsed();
    let (reason, d_claim) = hint_for(&answer, &replica(0));
    let (_, d_cached) = chain.complete(0, &d, json!({})).await;
    eprintln!(
        "D ({since:?} after P's hint): {reason} claimed {d_claim}, the engine reused {d_cached}"
    );
    assert_eq!(
        d_cached,
        40 * BLOCK as u64,
        "replica 0 kept the system prompt"
    );
    assert_eq!(
        u64::try_from(d_claim).unwrap(),
        d_cached,
        "the server claimed {d_claim} tokens ({reason}), the engine reused {d_cached}"
    );
    let retired = chain
        .server_metrics()
        .lines()
        .find_map(|l| {
            l.strip_prefix("inferencecache_foresight_moved_total ")?
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(0.0);
    assert_eq!(retired, 1.0, "the move is counted");
}

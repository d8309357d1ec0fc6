//! `inferencecache gateway` in front of one real vLLM engine with a small KV
//! cache (160 blocks of 32 tokens, `testkit::vllm`), where the requests
//! already sent to the engine evict blocks the index still lists: the
//! gateway's claim (`x-inferencecache-reusable-tokens`) must equal the
//! `cached_tokens` the engine then reports, never more (issue 33's "after
//! the hint" over-claims; the gateway's eviction foresight).
//!
//! The cache is laid out so the next allocation's victims are known: a
//! system prompt's blocks sit at the front of vLLM's free queue, tail first,
//! when a fresh prompt (P) is sent and, while the engine prefills it, a
//! repeat of the system prompt (D). The index still holds the whole system
//! prompt at D's lookup (the engine publishes P's evictions only when its
//! step ends), so without foresight D is claimed at 1,280 tokens and the
//! engine reuses 352. Without the vLLM venv the test skips, unless
//! INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/engine.rs"]
mod engine;

use engine::Proc;
use inferencecache_testkit::vllm::{self, Engine, EngineConfig, ModelKind, usage_of};
use serde_json::{Value, json};
use std::time::Duration;

const BLOCK: usize = 32;
/// `--num-gpu-blocks-override`: 159 usable blocks (vLLM keeps one null block).
const BLOCKS: u32 = 160;

/// `n` token ids of their own (`seed` keeps prompts apart).
fn ids(seed: u64, n: usize) -> Vec<u64> {
    (0..n as u64)
        .map(|i| 1000 + (seed * 7919 + i * 104_729 + (i * i) % 97) % 29_000)
        .collect()
}

fn body(prompt: &[u64], stream: bool) -> Value {
    json!({"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": stream})
}

fn claim(r: &reqwest::Response) -> u64 {
    r.headers()
        .get("x-inferencecache-reusable-tokens")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// One non-streamed completion: (the gateway's claim, the engine's
/// cached tokens).
async fn complete(base: &str, prompt: &[u64]) -> (u64, u64) {
    let r = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&body(prompt, false))
        .timeout(Duration::from_secs(300))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let c = claim(&r);
    let v: Value = r.json().await.unwrap();
    (c, usage_of(&v).1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_claim_outlives_the_blocks_requests_sent_earlier_evict() {
    let Some(venv) = vllm::venv() else { return };
    let model = vllm::model(&venv, ModelKind::Qwen3);
    let mut config = EngineConfig::new(&model, "tiny", 0);
    config.num_blocks = Some(BLOCKS);
    let engines = Engine::start_all(&venv, vec![config]).await;
    let gw = Proc::start(&[
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--engine",
        &engines[0].url,
    ]);
    let base = format!("http://{}", gw.addr("addr"));
    let system = ids(1, 40 * BLOCK);
    let ask = |seed: u64| {
        let mut p = system.clone();
        p.extend(ids(seed, BLOCK + 1));
        p
    };

    // A: the system prompt + a question (41 full blocks + 1 token: 42
    // blocks). Then B, a fresh prompt taking every blank block left (117
    // full blocks + 1 token). Free queue now: B's partial block, A's
    // question block, then the system prompt tail first (39, 38, ...,
    // 0), then B's blocks.
    let (_, a_cached) = complete(&base, &ask(100)).await;
    assert_eq!(a_cached, 0);
    let (_, b_cached) = complete(&base, &ids(2, 117 * BLOCK + 1)).await;
    assert_eq!(b_cached, 0);

    // P: a fresh 30-block (+1 token) prompt, streamed; its headers mean the
    // gateway sent it on. Its 31 new blocks are the partial block, A's
    // question block and the system prompt's blocks 39..=11.
    let p = ids(3, 30 * BLOCK + 1);
    let mut p_resp = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&body(&p, true))
        .timeout(Duration::from_secs(300))
        .send()
        .await
        .unwrap();
    assert!(p_resp.status().is_success());
    assert_eq!(claim(&p_resp), 0);

    // D repeats the system prompt while the engine holds P: it can reuse
    // blocks 0..=10 only.
    let (d_claim, d_cached) = complete(&base, &ask(200)).await;
    while p_resp.chunk().await.unwrap().is_some() {}
    assert_eq!(
        d_claim, d_cached,
        "the gateway claimed {d_claim} tokens, the engine reused {d_cached}"
    );
    assert!(
        d_claim < 40 * BLOCK as u64,
        "the evicted tail was withheld: {d_claim}"
    );
    assert!(d_claim > 0, "the surviving head was still claimed");

    // The same again once P is done and its evictions are indexed: the
    // index and the gateway agree, and the engine reuses exactly that.
    let (again_claim, again_cached) = complete(&base, &ask(300)).await;
    assert_eq!(again_claim, again_cached);
    drop(gw);
    drop(engines);
}

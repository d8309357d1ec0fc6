//! A gateway started after an engine's prefix-cache reset (one real vLLM
//! engine, `testkit::vllm`): its in-process index replays the engine's
//! KV-event history from the first event, so for a while it holds blocks
//! that the history's last event, the reset's `AllBlocksCleared`, drops.
//! No decision of the fresh gateway may claim them: the claims of an engine
//! wait until its history has reached the index (docs/gateway.md). Before
//! that, the benchmark saw gateways started seconds after a reset claim
//! 1,568-1,600 tokens the engine reused none of.
//!
//! The history: a prompt D, then fresh prompts that fill the 160-block
//! cache and make the engine evict, D repeated between them so it stays
//! cached, then the reset (and a tiny request: the engine publishes the
//! reset's `AllBlocksCleared` only at its next step). Replayed straight
//! from the engine it reached the index 63 ms after the subscriber started,
//! before the gateway's first decision (session 46: 0 stale claims with the
//! wait off). The benchmark's stale openings came from a whole run's
//! history on a loaded host; here the replay goes through a relay that
//! passes the engine's answers on at ~50 KB/s ([`slow_relay`]), so it
//! takes seconds and the gateway decides while it runs. The live events
//! come from the engine directly.
//!
//! First with the wait off (`--catch-up-timeout 1ms`, the behaviour before
//! session 46): its decisions must claim D (else this test could not tell
//! the wait from its absence). Then a fresh gateway with the wait: none may.
//! Each polls the gateway's dry run for D from its start until a probe
//! sent after the start is claimed (live events are applied after the
//! replay); the second then sends D through. Without the vLLM venv the
//! test skips, unless INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/engine.rs"]
mod engine;

use engine::Proc;
use inferencecache_testkit::vllm::{self, Engine, EngineConfig, ModelKind, usage_of};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const BLOCK: usize = 32;
/// A cache the history overflows many times.
const BLOCKS: u32 = 160;
/// Fresh prompts in the history (each stores 4 blocks).
const FILLERS: u64 = 120;

/// `n` token ids of their own (`seed` keeps prompts apart).
fn ids(seed: u64, n: usize) -> Vec<u64> {
    (0..n as u64)
        .map(|i| 1000 + (seed * 7919 + i * 104_729 + (i * i) % 97) % 29_000)
        .collect()
}

fn body(prompt: &[u64]) -> Value {
    json!({"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0})
}

/// The gateway's dry-run decision for `prompt`: (reusable tokens, reason).
async fn decision(http: &reqwest::Client, base: &str, prompt: &[u64]) -> (u64, String) {
    let v: Value = http
        .post(format!("{base}/inferencecache/route/completions"))
        .json(&body(prompt))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    (
        v["reusable_tokens"].as_u64().unwrap(),
        v["reason"].as_str().unwrap_or_default().to_owned(),
    )
}

/// Bytes of the engine's answer passed on at a time, and the pause after
/// each: ~50 KB/s, a few seconds for this history's replay.
const RELAY_CHUNK: usize = 512;
const RELAY_PAUSE: Duration = Duration::from_millis(10);

/// A TCP relay to `target` (the engine's replay endpoint): the requests go
/// through as they come, the engine's answers at [`RELAY_CHUNK`] bytes per
/// [`RELAY_PAUSE`] (under the subscriber's 5 s silence timeout).
async fn slow_relay(target: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(engine) = TcpStream::connect(target).await else {
                continue;
            };
            let (mut from_client, mut to_client) = client.into_split();
            let (mut from_engine, mut to_engine) = engine.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut from_client, &mut to_engine).await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; RELAY_CHUNK];
                while let Ok(n) = from_engine.read(&mut buf).await {
                    if n == 0 || to_client.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(RELAY_PAUSE).await;
                }
            });
        }
    });
    addr
}

/// What a fresh gateway's dry runs for D said until its probe was claimed.
#[derive(Debug)]
struct Opening {
    polls: u32,
    /// (ms after start, tokens) of each decision that claimed D.
    stale: Vec<(u128, u64)>,
    reasons: Vec<String>,
    /// Until the probe was claimed.
    took: Duration,
}

impl Opening {
    fn show(&self, what: &str) {
        eprintln!(
            "{what}: {} dry runs in {} ms until the probe was claimed, {} claimed D (first at {:?} ms), reasons {:?}",
            self.polls,
            self.took.as_millis(),
            self.stale.len(),
            self.stale.first().map(|s| s.0),
            self.reasons
        );
    }
}

/// Starts a gateway on `engine` whose replay goes through `replay` (a
/// [`slow_relay`]), with `extra` flags, and polls D until a probe (prompt
/// `probe_seed`) stored after its start is claimed.
async fn opening(
    engine: &Engine,
    replay: SocketAddr,
    extra: &[&str],
    d: &[u64],
    probe_seed: u64,
) -> (Proc, Opening) {
    let spec = format!(
        "{},events={},replay=tcp://{replay}",
        engine.url,
        engine.events_endpoint()
    );
    let mut args = vec!["gateway", "--listen", "127.0.0.1:0", "--engine", &spec];
    args.extend_from_slice(extra);
    let gw = Proc::start(&args);
    let base = format!("http://{}", gw.addr("addr"));
    let http = reqwest::Client::new();
    // A probe stored after the start: its events come live, behind the
    // replay, so once it is claimed the history is in the index.
    let probe = ids(probe_seed, 4 * BLOCK + 1);
    let sent = {
        let (url, p) = (engine.url.clone(), probe.clone());
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(format!("{url}/v1/completions"))
                .json(&body(&p))
                .send()
                .await
                .unwrap()
                .error_for_status()
                .unwrap();
        })
    };
    let started = Instant::now();
    let (mut polls, mut stale, mut reasons) = (0u32, Vec::new(), Vec::new());
    loop {
        let (claim, reason) = decision(&http, &base, d).await;
        polls += 1;
        if claim > 0 {
            stale.push((started.elapsed().as_millis(), claim));
        }
        if !reasons.contains(&reason) {
            reasons.push(reason);
        }
        if decision(&http, &base, &probe).await.0 > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the probe was never claimed; gateway log: {:?}",
            gw.logs()
        );
    }
    let took = started.elapsed();
    sent.await.unwrap();
    (
        gw,
        Opening {
            polls,
            stale,
            reasons,
            took,
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_gateway_claims_no_block_the_engine_dropped_before_it_started() {
    let Some(venv) = vllm::venv() else { return };
    let model = vllm::model(&venv, ModelKind::Qwen3);
    let mut config = EngineConfig::new(&model, "tiny", 0);
    config.num_blocks = Some(BLOCKS);
    let engines = Engine::start_all(&venv, vec![config]).await;
    let engine = &engines[0];

    // The history: D, then fillers that make the engine evict, D again
    // after each (it stays at the back of the free queue), then the reset.
    let d = ids(1, 10 * BLOCK + 1);
    assert_eq!(engine.complete(json!(d), json!({})).await.1, 0);
    for seed in 0..FILLERS {
        engine
            .complete(json!(ids(1000 + seed, 4 * BLOCK + 1)), json!({}))
            .await;
        let (_, cached) = engine.complete(json!(d), json!({})).await;
        assert_eq!(cached, 10 * BLOCK as u64, "D stayed cached");
    }
    engine.reset_prefix_cache().await;
    // vLLM publishes KV events once per scheduler step and an idle engine
    // does not step: one tiny request puts the reset's AllBlocksCleared
    // into the history (as bench/real-vllm does after every reset).
    engine.complete(json!(ids(3, 8)), json!({})).await;

    let replay = slow_relay(SocketAddr::from(([127, 0, 0, 1], engine.replay_port))).await;

    // The wait off: the gateway decides while the replay still holds D.
    let (gw, off) = opening(engine, replay, &["--catch-up-timeout", "1ms"], &d, 2).await;
    drop(gw);
    off.show("wait off");
    assert!(
        !off.stale.is_empty(),
        "with the wait off no decision claimed D during the replay, so this test cannot tell the wait from its absence: {off:?}"
    );

    // The wait on: no decision claims what the history drops.
    let (gw, on) = opening(engine, replay, &[], &d, 4).await;
    on.show("wait on");
    assert!(
        on.stale.is_empty(),
        "{} of {} decisions claimed blocks the reset dropped (ms after start, tokens): {:?}",
        on.stale.len(),
        on.polls,
        on.stale
    );
    let base = format!("http://{}", gw.addr("addr"));
    let http = reqwest::Client::new();

    // The request itself: no claim, and indeed nothing reused.
    let r = http
        .post(format!("{base}/v1/completions"))
        .json(&body(&d))
        .timeout(Duration::from_secs(300))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let claim: u64 = r
        .headers()
        .get("x-inferencecache-reusable-tokens")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!((claim, usage_of(&v).1), (0, 0));
    drop(gw);
    drop(engines);
}

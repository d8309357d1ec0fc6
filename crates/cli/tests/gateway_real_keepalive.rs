//! `inferencecache gateway` and an engine that closes a kept-alive
//! connection as a request arrives on it: the request is sent again on a
//! fresh connection, never answered with a 502, and the resend is counted
//! (`inferencecache_gateway_stale_connection_retries`).
//!
//! A real vLLM engine (tiny random Qwen3, `testkit::vllm`) answers every
//! request. The race (the engine's keep-alive timer closing a connection
//! the gateway has just written a request to) is forced two ways:
//! deterministically, by a TCP relay between the gateway and the engine that
//! closes a connection which already carried a request when the next one
//! arrives on it, as the engine's timer does; and for real, with the
//! engine's keep-alive at 1 s (`VLLM_HTTP_TIMEOUT_KEEP_ALIVE`), the
//! gateway keeping idle connections longer (`--engine-idle-timeout 60s`)
//! and requests spaced across the 1 s boundary. Without the vLLM venv the
//! test skips, unless INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/engine.rs"]
mod engine;

use engine::{Proc, metric};
use inferencecache_testkit::vllm::{self, Engine, EngineConfig, ModelKind};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A relay in front of the engine. When `armed`, the next forwarded
/// completion that arrives on a connection which already carried one is
/// not passed on: the connection is closed under it, as an engine's
/// keep-alive timer closes it. `closed` counts those.
struct Relay {
    url: String,
    armed: Arc<AtomicBool>,
    closed: Arc<AtomicU64>,
    /// Connections accepted (every one the gateway opened to the engine).
    conns: Arc<AtomicU64>,
}

async fn relay(engine: &str) -> Relay {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let target = engine.trim_start_matches("http://").to_owned();
    let armed = Arc::new(AtomicBool::new(false));
    let closed = Arc::new(AtomicU64::new(0));
    let conns = Arc::new(AtomicU64::new(0));
    let (a, c, n) = (Arc::clone(&armed), Arc::clone(&closed), Arc::clone(&conns));
    tokio::spawn(async move {
        loop {
            let (client, _) = l.accept().await.unwrap();
            n.fetch_add(1, Ordering::SeqCst);
            let Ok(upstream) = TcpStream::connect(&target).await else {
                continue;
            };
            let (a, c) = (Arc::clone(&a), Arc::clone(&c));
            tokio::spawn(async move {
                let (mut cr, mut cw) = client.into_split();
                let (mut ur, mut uw) = upstream.into_split();
                let back = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut ur, &mut cw).await;
                    let _ = cw.shutdown().await;
                });
                let mut buf = vec![0u8; 64 << 10];
                let mut completions = 0u32;
                loop {
                    let n = cr.read(&mut buf).await.unwrap_or(0);
                    if n == 0 {
                        break;
                    }
                    if buf[..n].starts_with(b"POST /v1/completions") {
                        completions += 1;
                        if completions > 1 && a.swap(false, Ordering::SeqCst) {
                            c.fetch_add(1, Ordering::SeqCst);
                            back.abort();
                            return; // both halves dropped: closed unanswered
                        }
                    }
                    if uw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = uw.shutdown().await;
                let _ = back.await;
            });
        }
    });
    Relay {
        url,
        armed,
        closed,
        conns,
    }
}

fn completion(i: usize, stream: bool) -> Value {
    json!({"model": "tiny", "prompt": format!("Request {i} of the keep-alive test."),
           "max_tokens": 2, "temperature": 0, "stream": stream})
}

/// One request through the gateway: (status, body).
async fn send(http: &reqwest::Client, base: &str, body: &Value) -> (u16, String) {
    let r = http
        .post(format!("{base}/v1/completions"))
        .json(body)
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

fn retries(metrics: &str) -> f64 {
    metric(
        metrics,
        "inferencecache_gateway_stale_connection_retries_total",
    )
}

fn gateway(engine_url: &str) -> (Proc, String) {
    let gw = Proc::start(&[
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--engine",
        engine_url,
        "--engine-idle-timeout",
        "60s",
        "--health-interval",
        "30s",
    ]);
    let base = format!("http://{}", gw.addr("addr"));
    (gw, base)
}

async fn metrics_of(base: &str) -> String {
    reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_closed_under_a_request_is_resent_not_a_502() {
    let Some(venv) = vllm::venv() else { return };
    let model = vllm::model(&venv, ModelKind::Qwen3);
    let mut config = EngineConfig::new(&model, "tiny", 0);
    config
        .env
        .push(("VLLM_HTTP_TIMEOUT_KEEP_ALIVE".into(), "1".into()));
    let engines = Engine::start_all(&venv, vec![config]).await;
    let http = reqwest::Client::new();

    // 1. Forced: the relay closes a pooled connection under the request.
    let relay = relay(&engines[0].url).await;
    let (gw, base) = gateway(&relay.url);
    for (i, stream) in [(0u64, false), (1, true)] {
        // Requests in a row (well inside the engine's 1 s keep-alive) reuse
        // the gateway's pooled connection; once armed, the first one that
        // goes out on a reused connection has it closed under it. A
        // connection goes back to the pool as its answer ends, which may be
        // just after the client has it: a few requests, bounded.
        relay.armed.store(true, Ordering::SeqCst);
        let mut sent = 0;
        while relay.closed.load(Ordering::SeqCst) == i {
            assert!(
                sent < 20,
                "no request went out on a reused connection (stream: {stream})"
            );
            let (s, b) = send(&http, &base, &completion(100 * i as usize + sent, stream)).await;
            assert_eq!(s, 200, "a closed pooled connection surfaced: {b}");
            assert!(b.contains("choices"), "{b}");
            sent += 1;
        }
        eprintln!(
            "relay (stream: {stream}): closed after {sent} request(s); {} connection(s) so far",
            relay.conns.load(Ordering::SeqCst)
        );
    }
    assert!((retries(&metrics_of(&base).await) - 2.0).abs() < f64::EPSILON);
    drop(gw);

    // 2. The engine's own timer: requests spaced across its 1 s keep-alive,
    // on connections the gateway keeps for 60 s. None may fail.
    let (gw, base) = gateway(&engines[0].url);
    let (s, b) = send(&http, &base, &completion(1000, false)).await;
    assert_eq!(s, 200, "{b}");
    let mut failed = Vec::new();
    for (k, gap_us) in (0..24u64)
        .map(|k| (k, 985_000 + k * 1_250))
        .collect::<Vec<_>>()
    {
        tokio::time::sleep(Duration::from_micros(gap_us)).await;
        let (s, b) = send(&http, &base, &completion(1001 + k as usize, false)).await;
        if s != 200 {
            failed.push((gap_us, s, b));
        }
    }
    let m = metrics_of(&base).await;
    eprintln!(
        "keep-alive boundary: 24 requests spaced 985-1014 ms, {} resent on a fresh connection",
        retries(&m)
    );
    assert!(
        failed.is_empty(),
        "requests failed at the keep-alive boundary: {failed:?}"
    );
    drop(gw);
}

//! A gateway's requests in flight in every server replica's load (issue 36,
//! item 4), on a real nats-server, real `inferencecache serve` replicas and
//! a real `inferencecache gateway --server` process: the gateway reports
//! its engines' in-flight counts to the replica it asks (`ReportCallerLoad`),
//! that replica shares them on the bus, and the other replica's pick for a
//! new prompt avoids the engine the gateway keeps busy, then comes back
//! when the requests finish.
//!
//! The engines are small HTTP stand-ins that hold every completion until the
//! test releases it (what is measured is the gateway's count, not an
//! engine's work). Without nats-server the test skips with a printed reason,
//! unless INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bus_harness;
mod common;

use bus_harness::*;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

const SCOPE: (&str, &str) = ("team-shared", "m");
const ENGINES: [&str; 2] = ["engine-x", "engine-y"];

async fn pick(r: &Replica, family: u64) -> String {
    let a = r
        .client()
        .await
        .lookup_route(cold_lookup(SCOPE, family))
        .await
        .unwrap()
        .into_inner();
    a.replica_scores[0].replica_id.clone()
}

/// An HTTP/1.1 stand-in for an engine: `/v1/models` lists model `m`,
/// `/health` is 200, and every POST is held until `release` turns true,
/// then answered with a one-token completion. `held` counts requests held.
async fn stand_in(release: watch::Receiver<bool>, held: Arc<AtomicU32>) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            let (mut release, held) = (release.clone(), Arc::clone(&held));
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Head, then the body by Content-Length.
                let head_end = loop {
                    let Ok(n) = s.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < head_end + len {
                    let Ok(n) = s.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = if head.starts_with("get /v1/models") {
                    r#"{"object":"list","data":[{"id":"m","object":"model","root":"/nonexistent","parent":null}]}"#.to_owned()
                } else if head.starts_with("post ") {
                    held.fetch_add(1, Ordering::SeqCst);
                    while !*release.borrow() {
                        if release.changed().await.is_err() {
                            return;
                        }
                    }
                    held.fetch_sub(1, Ordering::SeqCst);
                    r#"{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":"x","finish_reason":"length"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}"#.to_owned()
                } else {
                    String::new()
                };
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}")
}

/// `inferencecache gateway`, killed on drop.
struct Gateway(Child);

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Both engines report idle through A (restarting their queues and hint
/// counts everywhere); every replica applied it.
async fn all_idle(
    replicas: &[&Replica],
    ca: &mut inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient<
        tonic::transport::Channel,
    >,
    engines: &[&str],
) {
    let seq = replicas[1]
        .metric("inferencecache_bus_applied_sequence")
        .unwrap_or(0.0);
    let reports: Vec<_> = engines
        .iter()
        .map(|e| idle_load_report(e, SCOPE, 100))
        .collect();
    ca.report_cache_state(futures::stream::iter(reports))
        .await
        .unwrap();
    wait_converged(
        replicas,
        seq + engines.len() as f64,
        Duration::from_secs(20),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_gateways_requests_in_flight_move_the_other_replicas_picks() {
    let Some(bin) = nats_bin() else { return };
    let nats = Nats::start(&bin);
    let share = |name: &str, interval: &str| {
        let mut a = bus_args(&nats, name);
        a.extend(["--bus-load-interval", interval].map(String::from));
        a
    };
    let a = Replica::start_ranked(&share("replica-a", "10ms"), "ttft");
    let b = Replica::start_ranked(&share("replica-b", "10ms"), "ttft");
    // C shares no load: the idle fleet's pick, the seed rule, as reference.
    let c = Replica::start_ranked(&share("replica-c", "0s"), "ttft");
    let all = [&a, &b, &c];
    for r in all {
        r.wait_ready(Duration::from_secs(30));
    }
    let mut ca = a.client().await;
    all_idle(&all, &mut ca, &ENGINES).await;
    let (busy, other) = (ENGINES[0], ENGINES[1]);

    // New prompts the idle fleet sends to the engine the gateway will keep
    // busy (C's pick, each after an idle report so C's own deliveries do
    // not count).
    let mut probes = Vec::new();
    for f in 200..300u64 {
        if pick(&c, f).await == busy {
            probes.push(f);
            if probes.len() == 4 {
                break;
            }
        }
        all_idle(&all, &mut ca, &ENGINES).await;
    }
    assert_eq!(probes.len(), 4, "the seed never picked {busy}");

    // A gateway asking A, with that engine behind it.
    let (release_tx, release) = watch::channel(false);
    let held = Arc::new(AtomicU32::new(0));
    let url = stand_in(release, Arc::clone(&held)).await;
    let port = free_port();
    let _gw = Gateway(
        Command::new(common::BIN)
            .args([
                "--log-level",
                "warn",
                "gateway",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--server",
                &a.grpc,
                "--tenant",
                SCOPE.0,
                "--block-size",
                "16",
                "--no-eviction-foresight",
                "--engine",
                &format!("{url},id={busy}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn gateway"),
    );
    let gw = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while http
        .get(format!("{gw}/health"))
        .send()
        .await
        .map_or(true, |r| !r.status().is_success())
    {
        assert!(
            std::time::Instant::now() < deadline,
            "gateway never healthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Four requests in flight on the busy engine.
    const N: u32 = 4;
    let mut sent = Vec::new();
    for i in 0..N {
        let (http, gw) = (http.clone(), gw.clone());
        sent.push(tokio::spawn(async move {
            http.post(format!("{gw}/v1/completions"))
                .json(&serde_json::json!({"model": "m", "prompt": format!("hello {i}"), "max_tokens": 1}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
    }
    wait_until(
        Duration::from_secs(20),
        "the engine holds every request",
        || held.load(Ordering::SeqCst) == N,
    );
    let applied = |r: &Replica| {
        r.metric("inferencecache_bus_load_caller_reports_applied_total")
            .unwrap_or(0.0)
    };
    let lag = wait_until(
        Duration::from_secs(10),
        "B applied the gateway's count",
        || applied(&b) >= 1.0,
    );
    eprintln!("B applied the gateway's count within {lag:?} of the engine holding them");

    // B counts them, past the count's own work (held until the gateway's
    // next count): those prompts go to the other engine. C, which shares
    // nothing, still sends them to the busy one.
    for &f in &probes[..2] {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            pick(&b, f).await,
            other,
            "B must see the gateway's requests"
        );
        assert_eq!(pick(&c, f).await, busy, "C shares nothing");
        all_idle(&[&a, &b, &c], &mut ca, &[other]).await;
    }

    // Released: the gateway reports zero, and B's picks come back.
    let before = applied(&b);
    release_tx.send(true).unwrap();
    for s in sent {
        assert_eq!(s.await.unwrap().unwrap(), 200);
    }
    let back = wait_until(Duration::from_secs(10), "B applied the zero count", || {
        applied(&b) > before
    });
    eprintln!("B applied the gateway's zero count {back:?} after the requests ended");
    all_idle(&[&a, &b, &c], &mut ca, &[other]).await;
    assert_eq!(pick(&b, probes[2]).await, busy, "B's pick comes back");
    assert_eq!(
        b.metric("inferencecache_bus_load_caller_reports_published_total"),
        Some(0.0),
        "B received no report itself"
    );
    assert_eq!(applied(&c), 0.0, "C applies none");
    // What moved B was the gateway's count, not hints A delivered for it
    // (without a tokenizer the gateway asks for none).
    assert_eq!(
        a.metric("inferencecache_bus_load_hints_published_total"),
        Some(0.0)
    );
}

//! The real `inferencecache subscribe` between a real engine-style publisher
//! (Python, pyzmq + msgspec structs mirroring vLLM's and SGLang's, with a
//! replay ROUTER) and the real `inferencecache serve`; a gateway's LookupRoute
//! with the same token_ids must then answer PREFIX_MATCH for the replica.
//! Faults are injected at each side and asserted through LookupRoute.
//!
//! `.ci/run` installs pyzmq and msgspec into .venv; locally a missing Python
//! skips with a printed reason, unless INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/engine.rs"]
mod engine;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{BIN, wait_for_log};
use engine::big;
use inferencecache_proto::v1alpha1::LookupRouteRequest;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use serde_json::json;

const REPLICA: &str = "engine-0";

fn free_port() -> u16 {
    inferencecache_testkit::free_port()
}

/// `inferencecache serve` on a fixed gRPC port (so a restart comes back there).
struct Serve(Child);

impl Serve {
    fn start(grpc_port: u16) -> Self {
        let mut child = Command::new(BIN)
            .args([
                "serve",
                "--grpc-bind-address",
                &format!("127.0.0.1:{grpc_port}"),
            ])
            .args([
                "--http-bind-address",
                "127.0.0.1:0",
                "--snapshot-bind-address",
                "127.0.0.1:0",
            ])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn serve");
        let unwrap: fn(std::io::Result<String>) -> String = |r| r.unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap())
            .lines()
            .map(unwrap);
        wait_for_log(&mut lines, "listening");
        // keep draining so the child never blocks on a full pipe
        std::thread::spawn(move || for _ in lines {});
        Self(child)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `inferencecache subscribe` for replica REPLICA.
struct Subscribe {
    child: Child,
    http: String,
}

impl Subscribe {
    fn start(p: &engine::Publisher, grpc_port: u16, extra: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args([
                "subscribe",
                "--replica-id",
                REPLICA,
                "--model-id",
                "m",
                "--tenant-id",
                "t",
            ])
            .args([
                "--engine-endpoint",
                &p.pub_endpoint,
                "--replay-endpoint",
                &p.replay_endpoint,
            ])
            .args([
                "--server",
                &format!("127.0.0.1:{grpc_port}"),
                "--window",
                "20ms",
            ])
            .args([
                "--http-bind-address",
                "127.0.0.1:0",
                "--engine-metrics-url",
                "",
            ])
            .args(["--replay-timeout", "2s"])
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn subscribe");
        let unwrap: fn(std::io::Result<String>) -> String = |r| r.unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap())
            .lines()
            .map(unwrap);
        let l = wait_for_log(&mut lines, "listening");
        let http = l["http_addr"].as_str().unwrap().to_owned();
        std::thread::spawn(move || for _ in lines {});
        Self { child, http }
    }

    fn metric(&self, prefix: &str) -> f64 {
        let (_, body) = common::http_get(&self.http, "/metrics");
        body.lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    /// SIGTERM, then the exit status.
    fn terminate(mut self) -> std::process::ExitStatus {
        let ok = Command::new("kill")
            .args(["-s", "TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        for _ in 0..200 {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("subscribe did not stop after SIGTERM");
    }
}

impl Drop for Subscribe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// LookupRoute over gRPC: (reason, matched tokens and tier for REPLICA).
fn lookup(
    grpc_port: u16,
    scheme: &str,
    adapter: &str,
    tokens: std::ops::Range<u32>,
) -> (String, Option<(i32, i32)>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let Ok(mut c) =
            InferenceCacheClient::connect(format!("http://127.0.0.1:{grpc_port}")).await
        else {
            return ("UNREACHABLE".to_owned(), None);
        };
        let r = c
            .lookup_route(LookupRouteRequest {
                model_id: "m".into(),
                tenant_id: "t".into(),
                hash_scheme: scheme.into(),
                adapter_id: adapter.into(),
                // One token past the range: the engine recomputes a
                // prompt's last token, so only then is all of it reusable.
                token_ids: tokens.chain(std::iter::once(7)).collect(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        let ours = r
            .replica_scores
            .iter()
            .find(|s| s.replica_id == REPLICA)
            .map(|s| (s.matched_tokens, s.tier));
        (r.reason_code, ours)
    })
}

/// Polls until the lookup shows `want` matched tokens (0: no PREFIX_MATCH
/// for the replica); returns the tier. Bounded, so a bug fails instead of
/// hanging.
#[track_caller]
fn expect(
    grpc_port: u16,
    scheme: &str,
    adapter: &str,
    tokens: std::ops::Range<u32>,
    want: i32,
) -> i32 {
    let mut last = (String::new(), None);
    for _ in 0..400 {
        last = lookup(grpc_port, scheme, adapter, tokens.clone());
        match (&last, want) {
            ((r, Some((m, tier))), w) if r == "PREFIX_MATCH" && *m == w => return *tier,
            ((r, ours), 0) if r != "PREFIX_MATCH" || ours.is_none() => return 0,
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("LookupRoute {tokens:?} never showed {want} matched tokens; last {last:?}");
}

#[test]
fn python_engine_to_real_server_with_faults() {
    let Some(py) = engine::python() else { return };
    let port = free_port();
    let mut engine = engine::Publisher::start(&py);
    // blocks cached before the sidecar starts: only the replay from 0 has them
    engine.store_form("map", 1, 4, None, 0, json!({}));

    let server = Serve::start(port);
    let sub = Subscribe::start(&engine, port, &["--lora-adapter-names", "1=sql-lora"]);

    // 1. vLLM >= 0.26 map form → PREFIX_MATCH with the right matched_tokens, T1
    assert_eq!(expect(port, "vllm", "", 0..64, 64), 1);
    // 2. older vLLM tuple form, chained on the map-form parent
    engine.store_form("tuple", 5, 2, Some(4), 64, json!({}));
    expect(port, "vllm", "", 0..96, 96);

    // 3. two messages dropped by the publisher: gap → replay → nothing lost
    engine.send(json!({"op": "drop", "count": 2}));
    engine.store_form("map", 7, 1, Some(6), 96, json!({}));
    engine.store_form("map", 8, 1, Some(7), 112, json!({}));
    engine.store_form("map", 9, 1, Some(8), 128, json!({}));
    expect(port, "vllm", "", 0..144, 144);
    assert!(sub.metric("inferencecache_subscriber_gaps_total") >= 1.0);

    // 4. malformed msgpack: counted and skipped; the stream goes on
    engine.send(json!({"op": "raw", "hex": "c1c1ff00"}));
    engine.store_form("map", 100, 4, None, 1000, json!({}));
    expect(port, "vllm", "", 1000..1064, 64);
    assert!(sub.metric("inferencecache_subscriber_decode_errors_total{kind=\"batch\"}") >= 1.0);

    // 5. unknown parent: never keyed as a fresh root
    engine.store_form("map", 200, 4, Some(199), 2000, json!({}));
    // 6. LoRA: a mapped id is indexed under its name, an unmapped one dropped
    engine.store_form("map", 300, 4, None, 3000, json!({"lora_id": 1}));
    engine.store_form("map", 400, 4, None, 4000, json!({"lora_id": 7}));
    expect(port, "vllm", "sql-lora", 3000..3064, 64);
    expect(port, "vllm", "", 2000..2064, 0);
    expect(port, "vllm", "", 4000..4064, 0);
    expect(port, "vllm", "sql-lora", 4000..4064, 0);
    assert!(
        sub.metric("inferencecache_subscriber_dropped_blocks_total{reason=\"unmapped_lora\"}")
            >= 4.0
    );
    assert!(
        sub.metric("inferencecache_subscriber_dropped_blocks_total{reason=\"unknown_parent\"}")
            >= 4.0
    );

    // 7. offloaded to CPU, then gone from the GPU: T2, not evicted
    engine.store_form("map", 100, 4, None, 1000, json!({"medium": "CPU"}));
    engine.send(json!({"op": "remove", "form": "map", "hashes": (100..104).map(big).collect::<Vec<_>>(), "medium": "GPU"}));
    let mut tier = 0;
    for _ in 0..100 {
        tier = expect(port, "vllm", "", 1000..1064, 64);
        if tier == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(tier, 2, "GPU → CPU downgrade reported as T2");
    // and gone from every medium: evicted
    engine.send(json!({"op": "remove", "form": "map", "hashes": (100..104).map(big).collect::<Vec<_>>(), "medium": "CPU"}));
    expect(port, "vllm", "", 1000..1064, 0);

    // 8. server restarted mid-stream: the full state comes back by resync
    drop(server);
    let server = Serve::start(port);
    expect(port, "vllm", "", 0..144, 144);
    expect(port, "vllm", "sql-lora", 3000..3064, 64);
    assert!(sub.metric("inferencecache_subscriber_resyncs_total") >= 2.0);

    // 9. engine restarted (sequence back to 0): the old state is cleared
    engine.send(json!({"op": "restart"}));
    // The store is sent again every 500 ms until it lands: what the new PUB
    // sends before the sidecar's subscription reaches it is dropped (slow
    // joiner), and a repeated store is idempotent.
    let landed = || matches!(lookup(port, "vllm", "", 5000..5064), (r, Some((64, _))) if r == "PREFIX_MATCH");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    'sent: loop {
        engine.store_form("tuple", 500, 4, None, 5000, json!({}));
        let resend = std::time::Instant::now() + Duration::from_millis(500);
        while std::time::Instant::now() < resend {
            if landed() {
                break 'sent;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the restarted engine's store never landed"
        );
    }
    expect(port, "vllm", "", 0..144, 0);
    assert!(sub.metric("inferencecache_subscriber_engine_restarts_total") >= 1.0);

    // readiness, then a graceful stop on SIGTERM
    let (status, _) = common::http_get(&sub.http, "/readyz");
    assert!(status.contains("200"), "{status}");
    assert!(sub.terminate().success());
    drop(server);
}

#[test]
fn server_down_at_start_then_up_and_sglang_tuples() {
    let Some(py) = engine::python() else { return };
    let port = free_port();
    let mut engine = engine::Publisher::start(&py);
    let sub = Subscribe::start(&engine, port, &["--hash-scheme", "sglang"]);
    engine.store_form("sglang", 1, 4, None, 0, json!({}));
    engine.store_form("sglang", 5, 1, Some(4), 64, json!({"medium": "CPU_TIER1"}));
    // nothing to reach yet: not ready, and the state waits in the sidecar
    for _ in 0..100 {
        if sub.metric("inferencecache_subscriber_tracked_blocks") == 5.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(sub.metric("inferencecache_subscriber_tracked_blocks"), 5.0);
    let (status, body) = common::http_get(&sub.http, "/readyz");
    assert!(
        status.contains("503") && body.contains("server unreachable"),
        "{status} {body}"
    );

    let _server = Serve::start(port);
    // the hierarchical-cache block is T2: the matched run's tier is the coldest
    assert_eq!(expect(port, "sglang", "", 0..80, 80), 2);
    assert_eq!(expect(port, "sglang", "", 0..64, 64), 1);
    // a different hash scheme never cross-matches
    expect(port, "vllm", "", 0..64, 0);
}

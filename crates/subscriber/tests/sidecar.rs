//! The whole sidecar against real parts: a ZMQ engine publisher (PUB + replay
//! ROUTER, zeromq crate) and the real server in-process on loopback. Each test
//! asserts what a gateway sees through LookupRoute.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/engine.rs"]
mod engine;
#[path = "common/in_process.rs"]
mod in_process;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use inferencecache_proto::v1alpha1::LookupRouteRequest;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_server::config::ListenAddr;
use inferencecache_server::{Server, ServerConfig};
use inferencecache_subscriber::forward::LocalServer;
use inferencecache_subscriber::mapping::MappingConfig;
use inferencecache_subscriber::sidecar::{self, SidecarConfig};
use rmpv::Value;
use tokio_util::sync::CancellationToken;

use common::*;
use engine::FakeEngine;

const TOPIC: &str = "kv-events";
const REPLICA: &str = "replica-a";
const MODEL: &str = "m";
const TENANT: &str = "t";

/// A vLLM-like engine publishing map-form batches.
struct Engine(FakeEngine);

impl Engine {
    async fn start() -> Self {
        Self(FakeEngine::start(TOPIC, true).await)
    }

    /// Publishes one batch; `delivered: false` drops it on the wire (it stays
    /// replayable), like a message lost to the high-water mark.
    async fn publish(&mut self, events: Vec<Value>, delivered: bool) -> u64 {
        self.publish_raw(Bytes::from(vllm_batch(1.0, events)), delivered)
            .await
    }
}

impl std::ops::Deref for Engine {
    type Target = FakeEngine;
    fn deref(&self) -> &FakeEngine {
        &self.0
    }
}

impl std::ops::DerefMut for Engine {
    fn deref_mut(&mut self) -> &mut FakeEngine {
        &mut self.0
    }
}

/// A real server on a fixed gRPC address (so it can be restarted there).
struct Srv {
    grpc: SocketAddr,
    control: SocketAddr,
    /// Its ingest, for a sidecar in this process.
    local: Arc<dyn LocalServer>,
    cancel: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), inferencecache_server::ServeError>>,
}

fn free_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], inferencecache_testkit::free_port()))
}

impl Srv {
    async fn start(grpc: SocketAddr) -> Self {
        let mut config = ServerConfig::ephemeral();
        config.grpc_addr = ListenAddr(grpc);
        let server = Server::bind(&config).await.expect("bind");
        let control = server.control_addr();
        let cancel = CancellationToken::new();
        let local = in_process::local_server(&server, &cancel);
        let task = tokio::spawn(server.serve(cancel.clone()));
        Self {
            grpc,
            control,
            local,
            cancel,
            task,
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }

    async fn client(&self) -> InferenceCacheClient<tonic::transport::Channel> {
        InferenceCacheClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }
}

struct Sidecar {
    cancel: CancellationToken,
    running: sidecar::Running,
}

fn config(engine: &Engine, server: SocketAddr, mapping: MappingConfig) -> SidecarConfig {
    engine.sidecar_config(server, REPLICA, mapping)
}

/// As [`config`], reporting to `srv`'s ingest in process or over gRPC.
fn config_to(engine: &Engine, srv: &Srv, in_process: bool) -> SidecarConfig {
    if !in_process {
        return config(engine, srv.grpc, MappingConfig::default());
    }
    // Nothing listens at the gRPC address given: only the in-process path
    // can reach the server.
    let mut c = config(engine, free_port(), MappingConfig::default());
    c.forward.local = Some(Arc::clone(&srv.local));
    c
}

impl Sidecar {
    async fn start(config: SidecarConfig) -> Self {
        let cancel = CancellationToken::new();
        let running = sidecar::start(config, cancel.clone()).await.unwrap();
        Self { cancel, running }
    }

    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.running.wait())
            .await
            .expect("sidecar stops")
            .expect("clean stop");
    }

    fn metric(&self, name: &str) -> f64 {
        let text = self.running.metrics.encode();
        text.lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// (reason, matched tokens and tier of our replica).
async fn lookup(
    srv: &Srv,
    tokens: std::ops::Range<u32>,
    adapter: &str,
) -> (String, Option<(i32, i32)>) {
    let mut c = srv.client().await;
    let r = c
        .lookup_route(LookupRouteRequest {
            model_id: MODEL.into(),
            tenant_id: TENANT.into(),
            hash_scheme: "vllm".into(),
            // One token past the range: the engine recomputes a prompt's
            // last token, so only then is all of it reusable.
            token_ids: tokens.chain(std::iter::once(7)).collect(),
            adapter_id: adapter.into(),
            ..LookupRouteRequest::default()
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
}

/// Waits (bounded) until the lookup shows `want` matched tokens for our
/// replica (0 = no PREFIX_MATCH for it); returns the tier.
async fn wait_for(srv: &Srv, tokens: std::ops::Range<u32>, adapter: &str, want: i32) -> i32 {
    let mut last = (String::new(), None);
    for _ in 0..300 {
        last = lookup(srv, tokens.clone(), adapter).await;
        match (&last, want) {
            ((reason, Some((m, tier))), w) if reason == "PREFIX_MATCH" && *m == w => return *tier,
            ((reason, _), 0) if reason != "PREFIX_MATCH" => return 0,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let snap = reqwest::get(format!("http://{}/snapshot", srv.control))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    panic!("snapshot {snap}\nlookup never showed {want} matched tokens; last: {last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_blocks_become_prefix_matches_and_evictions_remove_them() {
    stores_and_evictions(false).await;
}

/// The gateway's embedded subscribers report to the server in process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_stored_blocks_become_prefix_matches_and_evictions_remove_them() {
    stores_and_evictions(true).await;
}

async fn stores_and_evictions(in_process: bool) {
    let srv = Srv::start(free_port()).await;
    let mut engine = Engine::start().await;
    let sc = Sidecar::start(config_to(&engine, &srv, in_process)).await;

    // before the sidecar connected: only the replay from 0 delivers it
    engine
        .publish(vec![vllm_stored_run(100, 4, None, 0)], true)
        .await;
    assert_eq!(wait_for(&srv, 0..64, "", 64).await, 1, "T1");
    // a longer chain on the same parent
    engine
        .publish(vec![vllm_stored_run(104, 2, Some(103), 64)], true)
        .await;
    wait_for(&srv, 0..96, "", 96).await;
    // the last two blocks evicted from the GPU and nowhere else
    engine
        .publish(vec![vllm_removed(&[104, 105], "GPU")], true)
        .await;
    wait_for(&srv, 0..96, "", 64).await;
    // the readiness endpoint sees the engine and the server
    let http = sc.running.http_addr.unwrap();
    let ready = reqwest::get(format!("http://{http}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 200);
    let body = reqwest::get(format!("http://{http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        body.contains("inferencecache_subscriber_blocks_total{op=\"stored\"} 6"),
        "{body}"
    );
    assert!(
        body.contains("inferencecache_subscriber_server_connected 1"),
        "{body}"
    );
    sc.stop().await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_down_at_start_then_up() {
    let grpc = free_port();
    let mut engine = Engine::start().await;
    let sc = Sidecar::start(config(&engine, grpc, MappingConfig::default())).await;
    engine
        .publish(vec![vllm_stored_run(1, 4, None, 0)], true)
        .await;
    // wait until the block is tracked while the server is still down
    for _ in 0..200 {
        if sc.metric("inferencecache_subscriber_tracked_blocks") == 4.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(sc.metric("inferencecache_subscriber_tracked_blocks"), 4.0);
    assert_eq!(sc.metric("inferencecache_subscriber_server_connected"), 0.0);

    let srv = Srv::start(grpc).await;
    wait_for(&srv, 0..64, "", 64).await;
    assert!(sc.metric("inferencecache_subscriber_rpc_errors_total") >= 1.0);
    assert_eq!(sc.metric("inferencecache_subscriber_server_connected"), 1.0);
    // (a server restarted mid-stream is tested with the real binaries in
    // crates/cli/tests/subscribe_e2e.rs: in-process, a stopped server's
    // connection tasks outlive it, which no real restart does)
    sc.stop().await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_restart_clears_the_old_state() {
    restart_clears(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_engine_restart_clears_the_old_state() {
    restart_clears(true).await;
}

async fn restart_clears(in_process: bool) {
    let srv = Srv::start(free_port()).await;
    let mut engine = Engine::start().await;
    let sc = Sidecar::start(config_to(&engine, &srv, in_process)).await;
    for i in 0..3 {
        engine
            .publish(
                vec![vllm_stored_run(10 + i, 1, None, 1000 * i as u32)],
                true,
            )
            .await;
    }
    engine
        .publish(vec![vllm_stored_run(1, 4, None, 0)], true)
        .await;
    wait_for(&srv, 0..64, "", 64).await;

    // new process: seq restarts at 0 with other content
    engine.restart();
    engine
        .publish(vec![vllm_stored_run(500, 4, None, 5000)], true)
        .await;
    wait_for(&srv, 5000..5064, "", 64).await;
    wait_for(&srv, 0..64, "", 0).await;
    assert!(sc.metric("inferencecache_subscriber_engine_restarts_total") >= 1.0);
    sc.stop().await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_messages_are_replayed_and_bad_input_is_counted() {
    let grpc = free_port();
    let srv = Srv::start(grpc).await;
    let mut engine = Engine::start().await;
    let sc = Sidecar::start(config(&engine, grpc, MappingConfig::default())).await;
    engine
        .publish(vec![vllm_stored_run(1, 4, None, 0)], true)
        .await;
    wait_for(&srv, 0..64, "", 64).await;
    // the next two batches are lost on the wire: the gap triggers a replay
    engine
        .publish(vec![vllm_stored_run(5, 1, Some(4), 64)], false)
        .await;
    engine
        .publish(vec![vllm_stored_run(6, 1, Some(5), 80)], false)
        .await;
    engine
        .publish(vec![vllm_stored_run(7, 1, Some(6), 96)], true)
        .await;
    wait_for(&srv, 0..112, "", 112).await;
    assert!(sc.metric("inferencecache_subscriber_gaps_total") >= 1.0);

    // malformed msgpack: counted, skipped, later batches still apply
    engine
        .publish_raw(Bytes::from_static(b"\xc1\xff not msgpack"), true)
        .await;
    // unknown parent: never keyed as a root
    engine
        .publish(vec![vllm_stored_run(900, 4, Some(899), 7000)], true)
        .await;
    // an unmapped LoRA id: dropped (fail closed)
    let mut lora = vllm_stored_run(950, 4, None, 8000);
    if let Value::Map(m) = &mut lora {
        for (k, v) in m.iter_mut() {
            if k.as_str() == Some("lora_id") {
                *v = u(7);
            }
        }
    }
    engine.publish(vec![lora], true).await;
    engine
        .publish(vec![vllm_stored_run(960, 4, None, 9000)], true)
        .await;
    wait_for(&srv, 9000..9064, "", 64).await;
    wait_for(&srv, 7000..7064, "", 0).await;
    wait_for(&srv, 8000..8064, "", 0).await;
    assert!(sc.metric("inferencecache_subscriber_decode_errors_total{kind=\"batch\"}") >= 1.0);
    assert!(
        sc.metric("inferencecache_subscriber_dropped_blocks_total{reason=\"unmapped_lora\"}")
            >= 4.0
    );
    assert!(
        sc.metric("inferencecache_subscriber_dropped_blocks_total{reason=\"unknown_parent\"}")
            >= 4.0
    );
    sc.stop().await;
    srv.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_to_cpu_offload_downgrades_to_t2() {
    let grpc = free_port();
    let srv = Srv::start(grpc).await;
    let mut engine = Engine::start().await;
    let sc = Sidecar::start(config(&engine, grpc, MappingConfig::default())).await;
    engine
        .publish(vec![vllm_stored_run(1, 4, None, 0)], true)
        .await;
    assert_eq!(wait_for(&srv, 0..64, "", 64).await, 1);
    // offloaded to CPU (same hashes, medium CPU), then dropped from the GPU
    let mut cpu = vllm_stored_run(1, 4, None, 0);
    if let Value::Map(m) = &mut cpu {
        for (k, v) in m.iter_mut() {
            if k.as_str() == Some("medium") {
                *v = s("CPU");
            }
        }
    }
    engine
        .publish(vec![cpu, vllm_removed(&[1, 2, 3, 4], "GPU")], true)
        .await;
    let mut tier = 0;
    for _ in 0..200 {
        tier = wait_for(&srv, 0..64, "", 64).await;
        if tier == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(tier, 2, "T2 after the GPU copy went away");
    sc.stop().await;
    srv.stop().await;
}

/// An engine `/metrics` endpoint (vLLM profile) whose counters move.
async fn engine_metrics() -> SocketAddr {
    use std::sync::atomic::{AtomicU64, Ordering};
    let scrapes = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let n = scrapes.fetch_add(1, Ordering::Relaxed);
            async move {
                // hit rate between consecutive scrapes: 60 / 100
                format!(
                    "# TYPE vllm:num_requests_running gauge\n\
                     vllm:num_requests_running{{model_name=\"m\"}} 3\n\
                     vllm:num_requests_waiting{{model_name=\"m\"}} 5\n\
                     vllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.5\n\
                     vllm:prefix_cache_hits_total{{model_name=\"m\"}} {}\n\
                     vllm:prefix_cache_queries_total{{model_name=\"m\"}} {}\n\
                     vllm:external_prefix_cache_hits_total{{model_name=\"m\"}} 750\n\
                     vllm:external_prefix_cache_queries_total{{model_name=\"m\"}} 1000\n\
                     vllm:version_info{{version=\"0.33.0\"}} 1\n\
                     vllm:cache_config_info{{block_size=\"32\",num_gpu_blocks=\"256\"}} 1\n",
                    60 * n,
                    100 * n
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_metrics_become_replica_stats() {
    use inferencecache_proto::v1alpha1::GetCacheStateRequest;
    use inferencecache_subscriber::stats::{CacheTierGauge, Profile, ProfileConfig, StatsConfig};
    let grpc = free_port();
    let srv = Srv::start(grpc).await;
    let engine = Engine::start().await;
    let metrics = engine_metrics().await;
    let mut cfg = config(&engine, grpc, MappingConfig::default());
    cfg.stats = Some(StatsConfig {
        url: format!("http://{metrics}/metrics"),
        interval: Duration::from_millis(50),
        timeout: Duration::from_secs(2),
        profile: ProfileConfig {
            profile: Profile::Vllm,
            model_name: Some("m".into()),
            max_concurrency_ceiling: 16.0,
            cache_size_bytes: 1 << 30,
            cache_tier: CacheTierGauge::Auto,
        },
        client_version: None,
        down_grace: None,
    });
    let sc = Sidecar::start(cfg).await;
    let mut c = srv.client().await;
    let mut last = None;
    for _ in 0..200 {
        let r = c
            .get_cache_state(GetCacheStateRequest {
                model_id: MODEL.into(),
                tenant_id: TENANT.into(),
            })
            .await
            .unwrap()
            .into_inner();
        if let Some(s) = r.replicas.into_iter().find(|s| s.hit_rate > 0.0) {
            last = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let s = last.expect("stats reached the server");
    assert!((s.hit_rate - 0.6).abs() < 1e-6, "{s:?}");
    assert!((s.pressure - 0.5).abs() < 1e-6, "{s:?}");
    assert_eq!(s.cache_memory_bytes, 1 << 29);
    assert_eq!((s.t2_hit_tokens, s.t2_query_tokens), (750, 1000));
    assert_eq!(s.client_version, "vllm/0.33.0");
    let load = s.load.expect("the engine's load is reported");
    assert_eq!((load.running_requests, load.waiting_requests), (3, 5));
    assert_eq!(load.kv_cache_usage, 0.5);
    assert_eq!(load.kv_cache_capacity_tokens, 256 * 32);
    assert!(sc.metric("inferencecache_subscriber_engine_scrapes_total{result=\"ok\"}") >= 2.0);
    sc.stop().await;
    srv.stop().await;
}

/// An engine `/metrics` that answers while `alive` (else 503).
async fn switchable_metrics(alive: Arc<std::sync::atomic::AtomicBool>) -> SocketAddr {
    use axum::http::StatusCode;
    use std::sync::atomic::Ordering;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let up = alive.load(Ordering::Relaxed);
            async move {
                if up {
                    (
                        StatusCode::OK,
                        "vllm:num_requests_running{model_name=\"m\"} 1\n\
                         vllm:num_requests_waiting{model_name=\"m\"} 0\n\
                         vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25\n"
                            .to_owned(),
                    )
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "hung\n".to_owned())
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn stats_config(
    metrics: SocketAddr,
    grace: Duration,
) -> inferencecache_subscriber::stats::StatsConfig {
    use inferencecache_subscriber::stats::{CacheTierGauge, Profile, ProfileConfig, StatsConfig};
    StatsConfig {
        url: format!("http://{metrics}/metrics"),
        interval: Duration::from_millis(50),
        timeout: Duration::from_secs(1),
        profile: ProfileConfig {
            profile: Profile::Vllm,
            model_name: None,
            max_concurrency_ceiling: 16.0,
            cache_size_bytes: 0,
            cache_tier: CacheTierGauge::Auto,
        },
        client_version: None,
        down_grace: Some(grace),
    }
}

/// Issue 33, item 4: an engine whose metrics stop answering (hung: its
/// event stream stays connected) is withdrawn after the grace, its events
/// are still tracked meanwhile, and the first good scrape brings them all
/// back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_engine_metrics_withdraw_the_replica_until_they_answer() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let grpc = free_port();
    let srv = Srv::start(grpc).await;
    let mut engine = Engine::start().await;
    let alive = Arc::new(AtomicBool::new(true));
    let metrics = switchable_metrics(Arc::clone(&alive)).await;
    let grace = Duration::from_millis(400);
    let mut cfg = config(&engine, grpc, MappingConfig::default());
    cfg.stats = Some(stats_config(metrics, grace));
    let sc = Sidecar::start(cfg).await;
    engine
        .publish(vec![vllm_stored_run(100, 4, None, 0)], true)
        .await;
    wait_for(&srv, 0..64, "", 64).await;
    while sc.metric("inferencecache_subscriber_engine_scrapes_total{result=\"ok\"}") < 1.0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    alive.store(false, Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    wait_for(&srv, 0..64, "", 0).await;
    let took = t0.elapsed();
    assert!(took >= grace, "withdrawn before the grace: {took:?}");
    assert!(took < grace * 4, "withdrawn late: {took:?}");
    let http = sc.running.http_addr.unwrap();
    let ready = reqwest::get(format!("http://{http}/readyz")).await.unwrap();
    assert_eq!(ready.status(), 503);
    assert!(
        ready
            .text()
            .await
            .unwrap()
            .contains("engine metrics unreachable")
    );
    assert_eq!(
        sc.metric("inferencecache_subscriber_engine_metrics_down"),
        1.0
    );
    // Stored while withdrawn: tracked, not reported.
    engine
        .publish(vec![vllm_stored_run(104, 2, Some(103), 64)], true)
        .await;
    while sc.metric("inferencecache_subscriber_blocks_total{op=\"stored\"}") < 6.0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(lookup(&srv, 0..96, "").await.1, None);

    alive.store(true, Ordering::Relaxed);
    wait_for(&srv, 0..96, "", 96).await;
    assert_eq!(
        sc.metric("inferencecache_subscriber_engine_metrics_withdrawals_total"),
        1.0
    );
    assert_eq!(
        sc.metric("inferencecache_subscriber_engine_metrics_down"),
        0.0
    );
    sc.stop().await;
    srv.stop().await;
}

/// A metrics endpoint that never answered is a wrong URL, not a dead
/// engine: the replica keeps its hints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_that_never_answered_withdraw_nothing() {
    use std::sync::atomic::AtomicBool;
    let grpc = free_port();
    let srv = Srv::start(grpc).await;
    let mut engine = Engine::start().await;
    let metrics = switchable_metrics(Arc::new(AtomicBool::new(false))).await;
    let mut cfg = config(&engine, grpc, MappingConfig::default());
    cfg.stats = Some(stats_config(metrics, Duration::from_millis(100)));
    let sc = Sidecar::start(cfg).await;
    engine
        .publish(vec![vllm_stored_run(100, 4, None, 0)], true)
        .await;
    wait_for(&srv, 0..64, "", 64).await;
    // Ten failed scrapes: five times the grace.
    while sc.metric("inferencecache_subscriber_engine_scrapes_total{result=\"error\"}") < 10.0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(lookup(&srv, 0..64, "").await.1.map(|m| m.0), Some(64));
    assert_eq!(
        sc.metric("inferencecache_subscriber_engine_metrics_withdrawals_total"),
        0.0
    );
    sc.stop().await;
    srv.stop().await;
}

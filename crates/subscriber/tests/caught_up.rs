//! The caught-up signal (`ForwardConfig::caught_up`): set once the engine's
//! event history (the first replay) is in the server, acknowledged, so a
//! router that waits for it never sees blocks the history itself drops.
//! Real parts: the ZMQ engine publisher (PUB + replay ROUTER) and the real
//! server in-process on loopback.
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
use inferencecache_subscriber::sequence::CaughtUpSignal;
use inferencecache_subscriber::sidecar;
use rmpv::Value;
use tokio_util::sync::CancellationToken;

use common::*;
use engine::FakeEngine;

const REPLICA: &str = "replica-a";

async fn publish(engine: &mut FakeEngine, events: Vec<Value>) {
    engine
        .publish_raw(Bytes::from(vllm_batch(1.0, events)), false)
        .await;
}

/// Matched tokens of our replica for `tokens` (plus one last token).
async fn matched(grpc: SocketAddr, tokens: std::ops::Range<u32>) -> i32 {
    let mut c = InferenceCacheClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let r = c
        .lookup_route(LookupRouteRequest {
            model_id: "m".into(),
            tenant_id: "t".into(),
            hash_scheme: "vllm".into(),
            token_ids: tokens.chain(std::iter::once(7)).collect(),
            ..LookupRouteRequest::default()
        })
        .await
        .unwrap()
        .into_inner();
    r.replica_scores
        .iter()
        .find(|s| s.replica_id == REPLICA && r.reason_code == "PREFIX_MATCH")
        .map_or(0, |s| s.matched_tokens)
}

/// A real server: its gRPC address and its in-process ingest.
async fn server(cancel: &CancellationToken) -> (SocketAddr, Arc<dyn LocalServer>) {
    let mut config = ServerConfig::ephemeral();
    config.grpc_addr = ListenAddr(SocketAddr::from(([127, 0, 0, 1], 0)));
    let server = Server::bind(&config).await.expect("bind");
    let grpc = server.grpc_addr();
    let local = in_process::local_server(&server, cancel);
    tokio::spawn(server.serve(cancel.clone()));
    (grpc, local)
}

/// A sidecar following `engine` into the server at `grpc` (or, given
/// `local`, into its in-process ingest) with a caught-up signal, using the
/// engine's replay endpoint or not.
async fn start_signalled(
    engine: &FakeEngine,
    grpc: SocketAddr,
    local: Option<Arc<dyn LocalServer>>,
    cancel: &CancellationToken,
    replay: bool,
) -> (sidecar::Running, CaughtUpSignal) {
    let signal = CaughtUpSignal::new();
    let mut config = engine.sidecar_config(grpc, REPLICA, MappingConfig::default());
    if !replay {
        config.transport.replay_endpoint = None;
    }
    config.forward.caught_up = Some(signal.clone());
    config.forward.local = local;
    let sc = sidecar::start(config, cancel.child_token()).await.unwrap();
    (sc, signal)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_signal_comes_once_the_history_is_in_the_server() {
    signal_after_history(false).await;
}

/// The gateway's embedded subscribers: the same history, reported to the
/// server's ingest in process; the signal means the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_the_signal_comes_once_the_history_is_in_the_server() {
    signal_after_history(true).await;
}

async fn signal_after_history(in_process: bool) {
    let cancel = CancellationToken::new();
    let (grpc, local) = server(&cancel).await;
    // The replay is answered once the sidecar is connected to the server,
    // as a busy engine's is: the history then arrives as live deliveries.
    let mut engine =
        FakeEngine::start_answering_after("kv-events", true, Duration::from_millis(500)).await;
    // D (tokens 0..160), then a long churn (each batch evicts the last),
    // then a prefix-cache reset, then P (tokens 5000..5064).
    publish(&mut engine, vec![vllm_stored_run(1, 10, None, 0)]).await;
    for i in 0..300u64 {
        let base = 1_000 + 2 * i;
        let mut events = vec![vllm_stored_run(base, 2, None, 10_000 + 32 * i as u32)];
        if i > 0 {
            events.push(vllm_removed(&[base - 2, base - 1], "GPU"));
        }
        publish(&mut engine, events).await;
    }
    publish(
        &mut engine,
        vec![map(vec![("type", s("AllBlocksCleared"))])],
    )
    .await;
    publish(&mut engine, vec![vllm_stored_run(9_000, 4, None, 5_000)]).await;

    // In process, nothing listens at the gRPC address the sidecar is given:
    // only the in-process path can reach the server.
    let (to, local) = if in_process {
        let unused = inferencecache_testkit::free_port();
        (SocketAddr::from(([127, 0, 0, 1], unused)), Some(local))
    } else {
        (grpc, None)
    };
    let (sc, signal) = start_signalled(&engine, to, local, &cancel, true).await;
    tokio::time::timeout(Duration::from_secs(30), signal.wait())
        .await
        .expect("caught up");
    // Nothing left to wait for: the server has the history's end state.
    assert_eq!(matched(grpc, 0..160).await, 0, "D was dropped by the reset");
    assert_eq!(matched(grpc, 5_000..5_064).await, 64, "P is held");
    // The history went in windows, not one round trip per engine batch:
    // its 299 evicting batches waited for a report-stream `Ack` each, and
    // the gateway opened its 4-client passes still catching up (runs
    // G4-G5). Compacted, the reset drops everything stored before it.
    let sent = |rpc| sc.metrics.sent.get_or_create(&[("rpc", rpc)]).get();
    let (acks, evictions) = (sent("ReportCacheState_ack"), sent("PublishEvent"));
    eprintln!("history: {acks} report-stream acks, {evictions} PublishEvent calls");
    assert!(
        acks <= 10,
        "{acks} report-stream round trips for one history"
    );
    assert!(
        evictions <= 10,
        "{evictions} evictions sent for blocks a reset dropped"
    );
    cancel.cancel();
    let _ = sc.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_replay_still_ends_the_wait() {
    let cancel = CancellationToken::new();
    let (grpc, _) = server(&cancel).await;
    // The ROUTER never answers: the replay times out (2 s here), and the
    // engine is followed on live events from then on.
    let engine = FakeEngine::start("kv-events", false).await;
    let (sc, signal) = start_signalled(&engine, grpc, None, &cancel, true).await;
    tokio::time::timeout(Duration::from_secs(30), signal.wait())
        .await
        .expect("caught up after the replay timed out");
    cancel.cancel();
    let _ = sc.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_replay_endpoint_there_is_no_history_to_wait_for() {
    let cancel = CancellationToken::new();
    let (grpc, _) = server(&cancel).await;
    let engine = FakeEngine::start("kv-events", true).await;
    let (sc, signal) = start_signalled(&engine, grpc, None, &cancel, false).await;
    tokio::time::timeout(Duration::from_secs(10), signal.wait())
        .await
        .expect("caught up at once");
    cancel.cancel();
    let _ = sc.wait().await;
}

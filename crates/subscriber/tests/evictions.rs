//! The sidecar's eviction path against the real server in-process: evictions
//! are sent in the background of the event loop, so a backlog of them holds
//! back neither later reports nor a clear, and a queued eviction that a
//! re-store (or a clear) supersedes is never sent. Each test makes the
//! backlog long with one `PublishEvent` in flight at a time.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/engine.rs"]
mod engine;

use std::time::{Duration, Instant};

use bytes::Bytes;
use inferencecache_proto::v1alpha1::LookupRouteRequest;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_server::{Server, ServerConfig};
use inferencecache_subscriber::mapping::MappingConfig;
use inferencecache_subscriber::sidecar;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use common::*;
use engine::FakeEngine;

const TOPIC: &str = "kv-events";
const REPLICA: &str = "replica-e";
/// Chains stored, then all removed: 4,000 evictions, one call at a time.
const CHAINS: u64 = 1000;
const SENT_EVICTIONS: &str = "inferencecache_subscriber_sent_total{rpc=\"PublishEvent\"}";

struct Rig {
    engine: FakeEngine,
    client: InferenceCacheClient<Channel>,
    running: sidecar::Running,
    cancel: CancellationToken,
    server_cancel: CancellationToken,
}

impl Rig {
    async fn start() -> Self {
        // One call in flight makes the eviction backlog long.
        Self::start_with(|c| c.forward.max_in_flight = 1).await
    }

    async fn start_with(tweak: impl FnOnce(&mut sidecar::SidecarConfig)) -> Self {
        let server_cancel = CancellationToken::new();
        let server = Server::bind(&ServerConfig::ephemeral()).await.unwrap();
        let grpc = server.grpc_addr();
        tokio::spawn(server.serve(server_cancel.clone()));
        let engine = FakeEngine::start(TOPIC, true).await;
        let mut config = engine.sidecar_config(grpc, REPLICA, MappingConfig::default());
        tweak(&mut config);
        config.http_bind = None;
        let cancel = CancellationToken::new();
        let running = sidecar::start(config, cancel.clone()).await.unwrap();
        let client = InferenceCacheClient::connect(format!("http://{grpc}"))
            .await
            .unwrap();
        Self {
            engine,
            client,
            running,
            cancel,
            server_cancel,
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.running.wait())
            .await
            .expect("sidecar stops")
            .expect("clean stop");
        self.server_cancel.cancel();
    }

    fn metric(&self, name: &str) -> f64 {
        self.running
            .metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    async fn publish(&mut self, events: Vec<rmpv::Value>) {
        self.engine
            .publish_raw(Bytes::from(vllm_batch(1.0, events)), true)
            .await;
    }

    /// Whether LookupRoute matches all 64 tokens of chain `n` on our replica.
    async fn visible(&mut self, n: u64) -> bool {
        let r = self
            .client
            .lookup_route(LookupRouteRequest {
                model_id: "m".into(),
                tenant_id: "t".into(),
                hash_scheme: "vllm".into(),
                // One token past the chain: the engine recomputes a
                // prompt's last token, so only then are all 64 reusable.
                token_ids: tokens_of(n).chain(std::iter::once(7)).collect(),
                ..LookupRouteRequest::default()
            })
            .await
            .unwrap()
            .into_inner();
        r.reason_code == "PREFIX_MATCH"
            && r.replica_scores
                .iter()
                .any(|s| s.replica_id == REPLICA && s.matched_tokens == 64)
    }

    /// Polls (bounded) until chain `n`'s visibility is `want`.
    async fn wait(&mut self, n: u64, want: bool) {
        let start = Instant::now();
        while self.visible(n).await != want {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "chain {n} never became {}",
                if want { "visible" } else { "gone" }
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Stores chains `0..CHAINS`, waits until the last is visible, then
    /// removes all of them from the GPU in one batch.
    async fn fill_then_remove_all(&mut self) {
        for first in (0..CHAINS).step_by(250) {
            self.publish((first..first + 250).map(stored).collect())
                .await;
        }
        self.wait(CHAINS - 1, true).await;
        let all: Vec<u64> = (0..CHAINS * 4).map(|h| 1 + h).collect();
        self.publish(vec![vllm_removed(&all, "GPU")]).await;
    }

    /// Waits until the removals' window was flushed into the queue (within
    /// one window, a later store or clear would just compact them away).
    async fn wait_queued(&self) {
        let start = Instant::now();
        while self.metric("inferencecache_subscriber_eviction_backlog") == 0.0 {
            assert!(start.elapsed() < Duration::from_secs(30), "never queued");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

fn tokens_of(n: u64) -> std::ops::Range<u32> {
    let first = n as u32 * 64;
    first..first + 64
}

/// Chain `n`: a root of 4 blocks, engine hashes `1 + 4n ..`.
fn stored(n: u64) -> rmpv::Value {
    let hashes: Vec<u64> = (1 + 4 * n..1 + 4 * n + 4).collect();
    vllm_stored(&hashes, None, tokens_of(n), 16)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_is_not_held_back_by_other_keys_evictions() {
    let mut rig = Rig::start().await;
    rig.fill_then_remove_all().await;
    rig.wait_queued().await;
    let fresh = CHAINS + 7;
    rig.publish(vec![stored(fresh)]).await;
    rig.wait(fresh, true).await;
    // Reports used to wait for every eviction of their window and of the
    // windows before; now the 4,000 calls are still going.
    let sent = rig.metric(SENT_EVICTIONS);
    assert!(
        sent < (CHAINS * 4) as f64,
        "the new chain became visible only after all {sent} evictions were sent"
    );
    assert!(rig.metric("inferencecache_subscriber_eviction_backlog") > 0.0);
    rig.wait(CHAINS - 1, false).await;
    rig.wait(0, false).await;
    assert!(rig.visible(fresh).await);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_eviction_superseded_by_a_restore_is_not_sent() {
    let mut rig = Rig::start().await;
    rig.fill_then_remove_all().await;
    rig.wait_queued().await;
    // The engine recomputes and caches the last chain again while its
    // evictions are still queued: they are the last 4 of 4,000.
    let again = CHAINS - 1;
    rig.publish(vec![stored(again)]).await;
    rig.wait(0, false).await;
    let start = Instant::now();
    while rig.metric("inferencecache_subscriber_eviction_backlog") > 0.0 {
        assert!(start.elapsed() < Duration::from_secs(30), "backlog stuck");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Sent after the re-store's report, those evictions would have removed
    // the chain the replica holds again.
    assert!(rig.visible(again).await, "the re-stored chain is gone");
    assert!(!rig.visible(again - 1).await);
    assert_eq!(
        rig.metric("inferencecache_subscriber_evictions_superseded_total"),
        4.0
    );
    // The resync's ALL_CLEARED is a PublishEvent too.
    assert_eq!(rig.metric(SENT_EVICTIONS), (CHAINS * 4 - 4 + 1) as f64);
    rig.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_drops_the_queued_evictions() {
    let mut rig = Rig::start().await;
    rig.fill_then_remove_all().await;
    rig.wait_queued().await;
    // A new engine process: the sidecar clears the replica, which makes
    // every queued eviction moot.
    rig.engine.restart();
    let fresh = CHAINS + 11;
    rig.publish(vec![stored(fresh)]).await;
    rig.wait(fresh, true).await;
    rig.wait(CHAINS - 1, false).await;
    rig.wait(0, false).await;
    assert!(rig.metric("inferencecache_subscriber_engine_restarts_total") >= 1.0);
    let superseded = rig.metric("inferencecache_subscriber_evictions_superseded_total");
    let sent = rig.metric(SENT_EVICTIONS);
    assert!(superseded > 0.0, "no queued eviction was dropped");
    assert!(sent < (CHAINS * 4) as f64, "{sent} PublishEvents");
    assert_eq!(
        rig.metric("inferencecache_subscriber_eviction_backlog"),
        0.0
    );
    rig.stop().await;
}

/// Eviction-to-lookup latency with the default 100 ms report window: an
/// engine batch that removes blocks is flushed as it arrives, so a lookup
/// stops matching within an RPC, not after up to a window (the median was
/// half a window before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_reaches_lookups_without_waiting_for_the_window() {
    let defaults = inferencecache_subscriber::forward::ForwardConfig::default();
    let mut rig = Rig::start_with(|c| {
        c.forward.window = defaults.window;
        c.forward.max_in_flight = defaults.max_in_flight;
    })
    .await;
    const N: u64 = 40;
    rig.publish((0..N).map(stored).collect()).await;
    rig.wait(N - 1, true).await;
    let mut took = Vec::new();
    for n in 0..N {
        let hashes: Vec<u64> = (1 + 4 * n..1 + 4 * n + 4).collect();
        let t0 = Instant::now();
        rig.publish(vec![vllm_removed(&hashes, "GPU")]).await;
        while rig.visible(n).await {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "chain {n} never left"
            );
        }
        took.push(t0.elapsed());
    }
    took.sort();
    let (p50, p99) = (took[took.len() / 2], took[took.len() * 99 / 100]);
    eprintln!(
        "eviction to lookup, window {:?}: p50 {p50:?}, p99 {p99:?}, max {:?}",
        defaults.window,
        took[took.len() - 1]
    );
    assert!(
        p50 < defaults.window / 2,
        "p50 {p50:?}: evictions wait for the window"
    );
    // The sidecar's own figure (receive → ack) counts every eviction sent
    // (the last ones may still be in flight: a chain leaves at its first).
    let name = "inferencecache_subscriber_eviction_visible_seconds_count";
    let t0 = Instant::now();
    while rig.metric(name) < (4 * N) as f64 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{name} {} of {}",
            rig.metric(name),
            4 * N
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    rig.stop().await;
}

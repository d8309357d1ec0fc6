//! One rate's setup: the real server, the real sidecar and a loopback
//! publisher in this process, and a LookupRoute client.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_server::{ServeError, Server, ServerConfig};
use inferencecache_subscriber::forward::{ForwardConfig, Identity};
use inferencecache_subscriber::loopback::LoopbackEngine;
use inferencecache_subscriber::mapping::MappingConfig;
use inferencecache_subscriber::metrics::SidecarMetrics;
use inferencecache_subscriber::sidecar::{self, SidecarConfig};
use inferencecache_subscriber::{DecodeOptions, TransportConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use super::VisibilityBenchArgs;

const TOPIC: &str = "kv-events";
/// The sidecar's `--replica-id`.
pub(super) const REPLICA: &str = "bench";

pub(super) struct Rig {
    pub engine: LoopbackEngine,
    pub client: InferenceCacheClient<Channel>,
    pub metrics: Arc<SidecarMetrics>,
    cancel: CancellationToken,
    server_cancel: CancellationToken,
    running: sidecar::Running,
    server: JoinHandle<Result<(), ServeError>>,
}

impl Rig {
    /// Starts everything and returns once the sidecar is connected and
    /// subscribed.
    pub(super) async fn start(args: &VisibilityBenchArgs) -> anyhow::Result<Self> {
        let (cancel, server_cancel) = (CancellationToken::new(), CancellationToken::new());
        let server = Server::bind(&ServerConfig::ephemeral())
            .await
            .context("bind the server")?;
        let grpc = server.grpc_addr();
        let server = tokio::spawn(server.serve(server_cancel.clone()));
        let engine = LoopbackEngine::bind(TOPIC).await?;
        let config = SidecarConfig {
            transport: TransportConfig {
                engine_endpoint: engine.endpoint.clone(),
                replay_endpoint: None,
                topic: TOPIC.into(),
                ..TransportConfig::default()
            },
            first_rank: 0,
            ranks: 1,
            // No overflow evictions: every eviction is one the engine sent.
            mapping: MappingConfig {
                max_tracked_blocks: 4_000_000,
                ..MappingConfig::default()
            },
            decode: DecodeOptions::default(),
            forward: ForwardConfig {
                server: grpc.to_string(),
                identity: Identity {
                    replica_id: REPLICA.into(),
                    model_id: "m".into(),
                    tenant_id: "t".into(),
                    hash_scheme: "vllm".into(),
                },
                window: args.window,
                max_in_flight: args.max_in_flight,
                ..ForwardConfig::default()
            },
            stats: None,
            http_bind: None,
        };
        let running = sidecar::start(config, cancel.clone()).await?;
        let metrics = Arc::clone(&running.metrics);
        let ready = Instant::now();
        while !metrics.server_up() {
            anyhow::ensure!(
                ready.elapsed() < Duration::from_secs(10),
                "sidecar never connected"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // slow joiner: the SUB subscription must reach the PUB first
        tokio::time::sleep(Duration::from_millis(500)).await;
        let client = InferenceCacheClient::connect(format!("http://{grpc}")).await?;
        Ok(Self {
            engine,
            client,
            metrics,
            cancel,
            server_cancel,
            running,
            server,
        })
    }

    /// Sum of the sidecar's samples whose name (with labels) starts with
    /// `prefix`.
    pub(super) fn counter(&self, prefix: &str) -> u64 {
        self.metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Stops the sidecar (which sends what it still holds, bounded by its
    /// RPC timeout), then the server.
    pub(super) async fn stop(self) -> anyhow::Result<()> {
        self.cancel.cancel();
        self.running.wait().await?;
        self.server_cancel.cancel();
        let _ = self.server.await;
        Ok(())
    }
}

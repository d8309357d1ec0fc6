//! One machine, one command: the index and a KV-event subscriber per engine
//! inside the gateway process.
//!
//! The index is `inferencecache serve`'s own [`Server`], bound to loopback
//! ports (its gRPC listener serves `inferencecache lookup|state|watch` and
//! outside producers), its control listener serves the status page, and the
//! gateway asks its LookupRoute pipeline directly (no gRPC hop on the request
//! path). The subscribers (the sidecar of `inferencecache subscribe`,
//! started in-process with the same [`sidecar::start`]) report to the
//! server's ingest directly, not over loopback gRPC ([`LocalIngest`]: the
//! handling a decoded message gets, without a call encoded, framed and
//! answered per evicted block). The index
//! runs the contract ranking: the gateway wants every replica's matched
//! tokens and ranks load itself (`pick.rs`).

use crate::config::EmbeddedIndex;
use crate::discover::EventSources;
use crate::error::GatewayError;
use futures::future::BoxFuture;
use inferencecache_proto::v1alpha1::{Ack, CacheEvent, CacheStateUpdate};
use inferencecache_server::Server;
use inferencecache_server::config::{ListenAddr, ServerConfig};
use inferencecache_server::core::RankingMode;
use inferencecache_server::local_ingest::LocalIngest;
use inferencecache_server::route::LookupPipeline;
use inferencecache_subscriber::forward::{ForwardConfig, Identity, LocalServer};
use inferencecache_subscriber::mapping::MappingConfig;
use inferencecache_subscriber::sequence::CaughtUpSignal;
use inferencecache_subscriber::sidecar::{self, SidecarConfig};
use inferencecache_subscriber::{DecodeOptions, TransportConfig, TupleLayout};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

/// The in-process index, started.
#[derive(Debug)]
pub struct Embedded {
    /// The LookupRoute pipeline.
    pub pipeline: LookupPipeline,
    /// Where the subscribers report.
    pub ingest: IngestTo,
    /// The index's gRPC listener (CLI tools, outside producers).
    pub grpc_addr: SocketAddr,
    /// The status page and `/snapshot`.
    pub control_addr: SocketAddr,
    /// The index's own `/metrics`, `/readyz`.
    pub http_addr: SocketAddr,
}

/// What one subscriber needs to know about its engine.
#[derive(Debug, Clone)]
pub struct SubscriberSpec {
    /// Replica id.
    pub replica_id: String,
    /// The base model the engine serves (the index's model id).
    pub model: String,
    /// Where it publishes.
    pub sources: EventSources,
    /// Set once its event history is in the index.
    pub caught_up: CaughtUpSignal,
}

/// Starts the index; its tasks end when `cancel` fires.
pub async fn start_index(
    settings: &EmbeddedIndex,
    block_size: u32,
    tasks: &mut JoinSet<Result<(), GatewayError>>,
    cancel: &CancellationToken,
) -> Result<Embedded, GatewayError> {
    let mut config = ServerConfig::ephemeral();
    config.grpc_addr = ListenAddr(settings.grpc_addr);
    config.http_addr = ListenAddr(settings.http_addr);
    config.control_addr = ListenAddr(settings.control_addr);
    config.engine_block_size = block_size;
    config.index.ranking = RankingMode::Contract;
    let server = Server::bind(&config)
        .await
        .map_err(|e| GatewayError::Index(e.to_string()))?;
    let out = Embedded {
        pipeline: server.core().pipeline.clone(),
        ingest: IngestTo {
            grpc: server.grpc_addr(),
            local: (!settings.ingest_over_grpc).then(|| {
                Arc::new(EmbeddedIngest(server.local_ingest(cancel.clone())))
                    as Arc<dyn LocalServer>
            }),
        },
        grpc_addr: server.grpc_addr(),
        control_addr: server.control_addr(),
        http_addr: server.http_addr(),
    };
    let c = cancel.clone();
    tasks.spawn(async move {
        server
            .serve(c)
            .await
            .map_err(|e| GatewayError::Index(e.to_string()))
    });
    Ok(out)
}

/// Where the subscribers report: the server's ingest in this process, or
/// (`--index-ingest-over-grpc`) its gRPC listener.
#[derive(Debug, Clone)]
pub struct IngestTo {
    /// The index's gRPC listener.
    pub grpc: SocketAddr,
    /// Its ingest, unless the subscribers go over gRPC.
    pub local: Option<Arc<dyn LocalServer>>,
}

/// The embedded server's ingest as the subscribers' [`LocalServer`].
#[derive(Debug)]
struct EmbeddedIngest(LocalIngest);

impl LocalServer for EmbeddedIngest {
    fn report_cache_state(
        &self,
        updates: ReceiverStream<CacheStateUpdate>,
    ) -> BoxFuture<'static, Result<Ack, tonic::Status>> {
        let ingest = self.0.clone();
        Box::pin(async move { ingest.report_cache_state(updates).await })
    }

    fn publish_event(&self, event: CacheEvent) -> BoxFuture<'static, Result<Ack, tonic::Status>> {
        let ingest = self.0.clone();
        Box::pin(async move { ingest.publish_event(event).await })
    }
}

/// Starts one engine's subscriber, reporting to `ingest`.
pub async fn start_subscriber(
    spec: &SubscriberSpec,
    tenant: &str,
    hash_scheme: &str,
    ingest: &IngestTo,
    window: Duration,
    tasks: &mut JoinSet<Result<(), GatewayError>>,
    cancel: &CancellationToken,
) -> Result<(), GatewayError> {
    let config = SidecarConfig {
        transport: TransportConfig {
            engine_endpoint: spec.sources.endpoint.clone(),
            replay_endpoint: spec.sources.replay.clone(),
            topic: spec.sources.topic.clone(),
            ..TransportConfig::default()
        },
        first_rank: 0,
        ranks: spec.sources.ranks,
        mapping: MappingConfig::default(),
        decode: DecodeOptions {
            tuple_layout: if hash_scheme == "sglang" {
                TupleLayout::Sglang
            } else {
                TupleLayout::Vllm
            },
        },
        forward: ForwardConfig {
            server: ingest.grpc.to_string(),
            local: ingest.local.clone(),
            identity: Identity {
                replica_id: spec.replica_id.clone(),
                model_id: spec.model.clone(),
                tenant_id: tenant.to_owned(),
                hash_scheme: hash_scheme.to_owned(),
            },
            // Stores wait up to the window (the gateway counts what it
            // routed before the index hears of it: `pending`); removals
            // are flushed as they arrive.
            window,
            caught_up: Some(spec.caught_up.clone()),
            ..ForwardConfig::default()
        },
        stats: None,
        http_bind: None,
    };
    let running = sidecar::start(config, cancel.child_token())
        .await
        .map_err(|e| GatewayError::Subscriber {
            engine: spec.replica_id.clone(),
            message: e.to_string(),
        })?;
    let engine = spec.replica_id.clone();
    tasks.spawn(async move {
        running.wait().await.map_err(|e| GatewayError::Subscriber {
            engine,
            message: e.to_string(),
        })
    });
    Ok(())
}

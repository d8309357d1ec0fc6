//! What the forwarder's two RPCs go through: a gRPC client, or a server in
//! this process.
//!
//! The gateway runs the index in its own process; over loopback gRPC its
//! subscribers' reports and evictions cost a third of its CPU under load
//! (issue 34). [`LocalServer`] is the server's own ingest, handed the
//! messages unencoded. The forwarder keeps every rule it has for a remote
//! server (one long-lived report stream acknowledged when it ends,
//! evictions pipelined, the `Ack` as the only proof of ingestion), so
//! ordering, resync and the caught-up signal mean the same either way.

use std::fmt;
use std::sync::Arc;

use futures::future::BoxFuture;
use inferencecache_proto::v1alpha1::{Ack, CacheEvent, CacheStateUpdate};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::token::ServerClient;

/// A policy server in this process: `ReportCacheState` and `PublishEvent`
/// as its gRPC handlers do them after decoding.
pub trait LocalServer: fmt::Debug + Send + Sync + 'static {
    /// One report stream, acknowledged once `updates` ends and everything
    /// on it is ingested.
    fn report_cache_state(
        &self,
        updates: ReceiverStream<CacheStateUpdate>,
    ) -> BoxFuture<'static, Result<Ack, tonic::Status>>;

    /// One eviction or clear, acknowledged once applied.
    fn publish_event(&self, event: CacheEvent) -> BoxFuture<'static, Result<Ack, tonic::Status>>;
}

/// Where the forwarder sends.
#[derive(Clone)]
pub(super) enum ServerLink {
    Grpc(ServerClient),
    Local(Arc<dyn LocalServer>),
}

impl ServerLink {
    pub(super) fn report_cache_state(
        &self,
        updates: mpsc::Receiver<CacheStateUpdate>,
    ) -> BoxFuture<'static, Result<Ack, tonic::Status>> {
        let updates = ReceiverStream::new(updates);
        match self {
            Self::Grpc(client) => {
                let mut client = client.clone();
                Box::pin(async move {
                    client
                        .report_cache_state(updates)
                        .await
                        .map(tonic::Response::into_inner)
                })
            }
            Self::Local(server) => server.report_cache_state(updates),
        }
    }

    pub(super) fn publish_event(
        &self,
        event: CacheEvent,
    ) -> BoxFuture<'static, Result<Ack, tonic::Status>> {
        match self {
            Self::Grpc(client) => {
                let mut client = client.clone();
                Box::pin(async move {
                    client
                        .publish_event(event)
                        .await
                        .map(tonic::Response::into_inner)
                })
            }
            Self::Local(server) => server.publish_event(event),
        }
    }
}

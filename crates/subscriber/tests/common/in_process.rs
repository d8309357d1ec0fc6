//! The real server's in-process ingest as the forwarder's `LocalServer`
//! (what the gateway's embedded subscribers report to).

use std::sync::Arc;

use futures::future::BoxFuture;
use inferencecache_proto::v1alpha1::{Ack, CacheEvent, CacheStateUpdate};
use inferencecache_server::Server;
use inferencecache_server::local_ingest::LocalIngest;
use inferencecache_subscriber::forward::LocalServer;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
struct Local(LocalIngest);

impl LocalServer for Local {
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

/// `server`'s ingest for a forwarder in this process.
pub(crate) fn local_server(server: &Server, stop: &CancellationToken) -> Arc<dyn LocalServer> {
    Arc::new(Local(server.local_ingest(stop.clone())))
}

//! The ingest edge for producers inside the server's own process (the
//! gateway's embedded KV-event subscribers).
//!
//! Over loopback gRPC every evicted block was a `PublishEvent` encoded,
//! framed, written, read, decoded and answered, and every report went the
//! same way on the report stream: a third of an embedded gateway's CPU
//! under load (issue 34, session 46's profile). Here the producer hands the
//! messages it would have encoded to the very functions the gRPC handlers
//! call once they have decoded theirs ([`InferenceCacheService::ingest_reports`],
//! [`InferenceCacheService::ingest_event`]), so limits, producer liveness,
//! block-size learning, the per-replica report windows, the ingest lanes,
//! eviction foresight and the bus relay behave exactly as for a remote
//! producer, and a report stream's `Ack` still means "everything sent on it
//! is in the index". No producer credentials are checked: the caller is
//! this process.

use crate::service::InferenceCacheService;
use futures::Stream;
use inferencecache_proto::v1alpha1::{Ack, CacheEvent, CacheStateUpdate};
use tonic::Status;

/// `ReportCacheState` and `PublishEvent` without the wire. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LocalIngest {
    service: InferenceCacheService,
}

impl LocalIngest {
    pub(crate) fn new(service: InferenceCacheService) -> Self {
        Self { service }
    }

    /// One report stream: every update is ingested as it arrives; the `Ack`
    /// comes when `updates` ends (what a gRPC producer gets when it closes
    /// its stream). An error ends it early, as it ends a gRPC stream
    /// (shutdown: UNAVAILABLE).
    pub async fn report_cache_state<S>(&self, updates: S) -> Result<Ack, Status>
    where
        S: Stream<Item = CacheStateUpdate> + Unpin,
    {
        let stream = futures::StreamExt::map(updates, Ok);
        self.service.ingest_reports(stream, None).await
    }

    /// One event (an eviction or a clear), acknowledged once applied.
    pub async fn publish_event(&self, event: CacheEvent) -> Result<Ack, Status> {
        self.service.ingest_event(event, None).await
    }
}

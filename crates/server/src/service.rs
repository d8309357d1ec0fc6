//! The `InferenceCache` gRPC service. Handlers stay thin: they convert proto to
//! domain values at the edge and delegate. Until the index lands, every RPC
//! answers with the reference's fail-open behaviour.

use crate::metrics::Metrics;
use crate::reason;
use futures::Stream;
use inferencecache_proto::v1alpha1::inference_cache_server::InferenceCache;
use inferencecache_proto::v1alpha1::{
    Ack, CacheEvent, CacheStateUpdate, CacheSummary, GetCacheStateRequest, GetCacheStateResponse,
    LookupPdRouteRequest, LookupPdRouteResponse, LookupRouteRequest, LookupRouteResponse, Metric,
    RenderTemplateRequest, RenderTemplateResponse, StreamEventsRequest, StreamMetricsRequest,
};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;
use tonic::{Request, Response, Status, Streaming};

/// Tenant reserved for the server's own `/probe` self-test; the public
/// contract can neither read nor write it.
pub const PROBE_TENANT: &str = "inferencecache.io/probe";

/// A boxed server stream.
type ServerStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// The service implementation.
#[derive(Debug, Clone)]
pub struct InferenceCacheService {
    metrics: Arc<Metrics>,
}

impl InferenceCacheService {
    /// Creates the service over shared metrics.
    pub fn new(metrics: Arc<Metrics>) -> Self {
        Self { metrics }
    }
}

fn micros_since(start: Instant) -> i64 {
    i64::try_from(start.elapsed().as_micros()).unwrap_or(i64::MAX)
}

#[tonic::async_trait]
impl InferenceCache for InferenceCacheService {
    async fn render_template(
        &self,
        _request: Request<RenderTemplateRequest>,
    ) -> Result<Response<RenderTemplateResponse>, Status> {
        Ok(Response::new(RenderTemplateResponse {
            reason_code: reason::OK.into(),
            ..Default::default()
        }))
    }

    async fn lookup_route(
        &self,
        request: Request<LookupRouteRequest>,
    ) -> Result<Response<LookupRouteResponse>, Status> {
        let start = Instant::now();
        let req = request.get_ref();
        if req.tenant_id == PROBE_TENANT {
            self.metrics
                .observe_lookup(&req.model_id, reason::NO_HINT, false, 0.0);
            return Ok(Response::new(LookupRouteResponse {
                reason_code: reason::NO_HINT.into(),
                ..Default::default()
            }));
        }
        let response = LookupRouteResponse {
            reason_code: reason::NO_HINT.into(),
            lookup_latency_us: micros_since(start),
            ..Default::default()
        };
        self.metrics.observe_lookup(
            &req.model_id,
            reason::NO_HINT,
            false,
            start.elapsed().as_secs_f64(),
        );
        Ok(Response::new(response))
    }

    async fn lookup_pd_route(
        &self,
        _request: Request<LookupPdRouteRequest>,
    ) -> Result<Response<LookupPdRouteResponse>, Status> {
        Ok(Response::new(LookupPdRouteResponse {
            reason_code: reason::NO_HINT.into(),
            ..Default::default()
        }))
    }

    async fn get_cache_state(
        &self,
        _request: Request<GetCacheStateRequest>,
    ) -> Result<Response<GetCacheStateResponse>, Status> {
        Ok(Response::new(GetCacheStateResponse {
            replicas: Vec::new(),
            summary: Some(CacheSummary::default()),
        }))
    }

    async fn report_cache_state(
        &self,
        request: Request<Streaming<CacheStateUpdate>>,
    ) -> Result<Response<Ack>, Status> {
        let mut stream = request.into_inner();
        // Each message is consumed as it arrives; a broken stream returns its
        // error (no Ack), a clean end of stream acknowledges everything.
        while stream.message().await?.is_some() {}
        Ok(Response::new(Ack {
            accepted: true,
            reason_code: String::new(),
        }))
    }

    async fn publish_event(&self, _request: Request<CacheEvent>) -> Result<Response<Ack>, Status> {
        Ok(Response::new(Ack {
            accepted: true,
            reason_code: String::new(),
        }))
    }

    type StreamCacheEventsStream = ServerStream<CacheEvent>;

    async fn stream_cache_events(
        &self,
        _request: Request<StreamEventsRequest>,
    ) -> Result<Response<Self::StreamCacheEventsStream>, Status> {
        Ok(Response::new(Box::pin(futures::stream::empty())))
    }

    type StreamMetricsStream = ServerStream<Metric>;

    async fn stream_metrics(
        &self,
        _request: Request<StreamMetricsRequest>,
    ) -> Result<Response<Self::StreamMetricsStream>, Status> {
        Ok(Response::new(Box::pin(futures::stream::empty())))
    }
}

//! The `InferenceCache` gRPC service. Handlers are thin: proto in, domain call
//! on [`Core`], proto out.

use crate::convert::{self, event_from_proto, update_from_proto};
use crate::core::Core;
use crate::events::EventFilter;
use crate::grpc_error::GrpcError;
use crate::metrics::Metrics;
use crate::reserved_tenant::is_reserved;
use crate::route::parse_grpc_timeout;
use futures::{FutureExt, Stream, StreamExt};
use inferencecache_proto::v1alpha1::inference_cache_server::InferenceCache;
use inferencecache_proto::v1alpha1::{
    Ack, CacheEvent, CacheStateUpdate, GetCacheStateRequest, GetCacheStateResponse,
    LookupPdRouteRequest, LookupPdRouteResponse, LookupRouteRequest, LookupRouteResponse, Metric,
    RenderTemplateRequest, RenderTemplateResponse, StreamEventsRequest, StreamMetricsRequest,
};
use prometheus_client::metrics::gauge::Gauge;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

/// Most `ReportCacheState` messages applied as one index batch.
const REPORT_WINDOW: usize = 64;

/// A boxed server stream.
type ServerStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

pub use crate::config::DEFAULT_METRICS_INTERVAL;

/// The service implementation.
#[derive(Debug, Clone)]
pub struct InferenceCacheService {
    core: Core,
    stop: CancellationToken,
    metrics_interval: Duration,
    /// Producer/consumer checks; `None` = `--producer-auth none` without
    /// `--consumer-auth` (nothing checked).
    producers: Option<Arc<crate::producer::Gate>>,
    /// Bus mode: report and publish go to the stream, not the index.
    relay: Option<crate::replicate::BusRelay>,
}

impl InferenceCacheService {
    /// Creates the service; open streams end when `stop` fires.
    pub fn new(core: Core, stop: CancellationToken, metrics_interval: Duration) -> Self {
        Self {
            core,
            stop,
            metrics_interval,
            producers: None,
            relay: None,
        }
    }

    /// Adds producer authorization / consumer auth (issue 19).
    #[must_use]
    pub fn with_producers(mut self, gate: Option<Arc<crate::producer::Gate>>) -> Self {
        self.producers = gate;
        self
    }

    /// Bus mode: `ReportCacheState` and `PublishEvent` publish to the
    /// stream through `relay` (every replica applies it) instead of applying.
    #[must_use]
    pub fn with_relay(mut self, relay: Option<crate::replicate::BusRelay>) -> Self {
        self.relay = relay;
        self
    }

    /// With `--consumer-auth`, refuses a read RPC without a valid token.
    /// The review (a TokenReview call on a cache miss) is boxed: inline, its
    /// state would size every handler's future, auth on or off (issue 36).
    async fn consumer_check<T>(&self, request: &Request<T>) -> Result<(), GrpcError> {
        match &self.producers {
            Some(g) => Box::pin(g.consumer(request)).await,
            None => Ok(()),
        }
    }
}

impl InferenceCacheService {
    /// [`Self::lookup_wire`] answered without waiting, when nothing in it
    /// waits: no consumer auth (its review may call the API server) and no
    /// `prompt_text` (the tokenizer); `None` otherwise. `headers` are the
    /// call's (its `grpc-timeout` and [`SHADOW_HEADER`]).
    pub(crate) fn lookup_now(
        &self,
        req: &crate::lookup_wire::WireLookup,
        headers: &http::HeaderMap,
    ) -> Option<crate::lookup_wire::WireAnswer> {
        if self.producers.is_some() {
            return None;
        }
        let hashes = req.hash_slices();
        let mut route = req.route_request(&hashes);
        route.shadow = shadow(headers);
        let outcome = self
            .core
            .pipeline
            .route_now(&route, grpc_timeout(headers))?;
        Some(crate::lookup_wire::WireAnswer::new(
            outcome,
            req.adapter_id(),
        ))
    }

    /// LookupRoute as `grpc_lookup` serves it: the generated handler's
    /// logic over the in-place request and the directly encoded answer.
    pub(crate) async fn lookup_wire(
        &self,
        request: Request<crate::lookup_wire::WireLookup>,
    ) -> Result<crate::lookup_wire::WireAnswer, Status> {
        self.consumer_check(&request).await?;
        let caller_timeout = caller_timeout(&request);
        let req = request.get_ref();
        let hashes = req.hash_slices();
        let mut route = req.route_request(&hashes);
        route.shadow = shadow(request.metadata().as_ref());
        let outcome = self.core.pipeline.route(&route, caller_timeout).await;
        Ok(crate::lookup_wire::WireAnswer::new(
            outcome,
            req.adapter_id(),
        ))
    }
}

impl InferenceCacheService {
    /// `ReportCacheState` after decoding: what the gRPC edge and the
    /// in-process edge ([`crate::local_ingest::LocalIngest`]) both do with a
    /// producer's report stream. `caller` is the authenticated producer
    /// (`None` without producer auth, and in process).
    pub(crate) async fn ingest_reports<S>(
        &self,
        mut stream: S,
        caller: Option<&crate::producer::Caller>,
    ) -> Result<Ack, Status>
    where
        S: Stream<Item = Result<CacheStateUpdate, Status>> + Unpin,
    {
        let gate = self.producers.as_deref();
        // Limits first (INVALID_ARGUMENT ends the stream), then the
        // producer's tenant scope and rate (PERMISSION_DENIED skips the
        // update; the stream goes on for the entitled tenants and ends with
        // the first refusal instead of an Ack).
        let check = |u: &CacheStateUpdate| -> Result<(), GrpcError> {
            self.core.limits.check_update(u).inspect_err(|_| {
                self.core.metrics.limits.reject("invalid_argument");
            })?;
            if let (Some(g), Some(c)) = (gate, caller) {
                g.admit(
                    c,
                    &u.tenant_id,
                    crate::producer::ratelimit::update_blocks(u),
                )?;
            }
            Ok(())
        };
        if let Some(bus) = &self.relay {
            return bus.report_stream(stream, &self.stop, check).await;
        }
        let mut denied: Option<GrpcError> = None;
        // Each message is ingested as it arrives; a broken stream returns its
        // error without an Ack, but what it delivered stays ingested. A
        // producer's long-lived stream would otherwise outlive shutdown (its
        // connection task is not ours to abort), so it ends with UNAVAILABLE,
        // which tells the producer to reconnect and resync.
        //
        // Messages of the same replica that are already received when one
        // arrives form a window, applied as one index batch (quota and cap
        // enforced once per window: `Index::apply_batch`); the window never
        // waits for a message.
        let mut pending: Option<CacheStateUpdate> = None;
        let mut ended = false;
        loop {
            let first = match pending.take() {
                Some(u) => u,
                None if ended => break,
                None => {
                    let next = tokio::select! {
                        () = self.stop.cancelled() => {
                            return Err(GrpcError::ShuttingDown.into());
                        }
                        next = stream.next() => next.transpose()?,
                    };
                    let Some(update) = next else { break };
                    update
                }
            };
            let replica = first.replica_id.clone();
            let mut window = Vec::new();
            let mut broken: Option<Status> = None;
            let mut item = Some(first);
            while let Some(update) = item.take() {
                if !is_reserved(&update.tenant_id) {
                    match crate::producer::admit_update(check(&update), &mut denied) {
                        Ok(true) => {
                            if self.core.liveness.report(
                                &update.tenant_id,
                                &update.model_id,
                                &update.replica_id,
                                update.block_size > 0,
                            ) {
                                broken = Some(GrpcError::ProducerSilent.into());
                                break;
                            }
                            self.core.block_sizes.learn(&update);
                            window.push(update_from_proto(update));
                        }
                        Ok(false) => {}
                        Err(e) => {
                            broken = Some(e.into());
                            break;
                        }
                    }
                }
                if window.len() >= REPORT_WINDOW {
                    break;
                }
                match stream.next().now_or_never() {
                    Some(Some(Ok(u))) if u.replica_id == replica => item = Some(u),
                    Some(Some(Ok(u))) => pending = Some(u),
                    Some(Some(Err(s))) => broken = Some(s),
                    Some(None) => ended = true,
                    None => {}
                }
            }
            if !window.is_empty() && !self.core.ingest_batch_on_lane(window).await {
                return Err(replica_limit_status(&self.core));
            }
            if let Some(s) = broken {
                return Err(s);
            }
        }
        match denied {
            Some(e) => Err(e.into()),
            None => Ok(accepted()),
        }
    }

    /// `PublishEvent` after decoding (see [`Self::ingest_reports`]).
    pub(crate) async fn ingest_event(
        &self,
        event: CacheEvent,
        caller: Option<&crate::producer::Caller>,
    ) -> Result<Ack, Status> {
        if is_reserved(&event.tenant_id) {
            return Ok(accepted());
        }
        if let Err(e) = self.core.limits.check_event(&event) {
            self.core.metrics.limits.reject("invalid_argument");
            return Err(e.into());
        }
        if let (Some(g), Some(c)) = (self.producers.as_deref(), caller) {
            g.admit(c, &event.tenant_id, 1)?;
        }
        if let Some(bus) = &self.relay {
            return Ok(bus.publish_event(event)?.into_inner());
        }
        let kind = inferencecache_proto::v1alpha1::cache_event::Type::try_from(event.r#type)
            .map_or("UNKNOWN", |t| t.as_str_name());
        self.core
            .metrics
            .events
            .get_or_create(&Metrics::type_label(kind))
            .inc();
        if let Some(e) = event_from_proto(event) {
            self.core.apply_event_on_lane(e).await;
        }
        Ok(accepted())
    }
}

/// The caller's deadline (`grpc-timeout`), when it sent one.
pub(crate) fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    headers
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
}

/// The metadata key of a shadow lookup: with the value `true` (or `1`)
/// LookupRoute answers as usual but records no delivery
/// (`RouteRequest::shadow`): for probes, dashboards and shadow traffic that
/// ask where a prompt would go without sending it there. Our extension of
/// v1alpha1 (docs/api.md).
pub const SHADOW_HEADER: http::HeaderName =
    http::HeaderName::from_static("x-inferencecache-shadow");

/// True when `headers` mark a shadow lookup ([`SHADOW_HEADER`]). One
/// header lookup by a prebuilt name (no parse), on every LookupRoute.
pub(crate) fn shadow(headers: &http::HeaderMap) -> bool {
    headers
        .get(&SHADOW_HEADER)
        .is_some_and(|v| matches!(v.as_bytes(), b"true" | b"1"))
}

/// The caller's deadline of a request, when it sent one.
fn caller_timeout<T>(request: &Request<T>) -> Option<Duration> {
    grpc_timeout(request.metadata().as_ref())
}

/// RESOURCE_EXHAUSTED for an update from a new replica past the limit.
fn replica_limit_status(core: &Core) -> Status {
    GrpcError::ReplicaLimit {
        max: core.index.max_replicas(),
    }
    .into()
}

fn accepted() -> Ack {
    Ack {
        accepted: true,
        reason_code: String::new(),
    }
}

/// Keeps a subscriber gauge up while a stream lives.
struct SubscriberGuard(Gauge);

impl SubscriberGuard {
    fn new(metrics: &Metrics, kind: &str) -> Self {
        let g = metrics
            .stream_subscribers
            .get_or_create(&Metrics::type_label(kind))
            .clone();
        g.inc();
        Self(g)
    }
}

impl Drop for SubscriberGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[tonic::async_trait]
impl InferenceCache for InferenceCacheService {
    async fn render_template(
        &self,
        request: Request<RenderTemplateRequest>,
    ) -> Result<Response<RenderTemplateResponse>, Status> {
        self.consumer_check(&request).await?;
        let req = request.get_ref();
        let out = crate::templates::render_template(
            &self.core.templates,
            &self.core.metrics,
            &convert::render_request(req),
        );
        Ok(Response::new(convert::render_response(out)))
    }

    async fn lookup_route(
        &self,
        request: Request<LookupRouteRequest>,
    ) -> Result<Response<LookupRouteResponse>, Status> {
        self.consumer_check(&request).await?;
        let caller_timeout = caller_timeout(&request);
        let req = request.get_ref();
        let hashes = convert::hash_slices(req);
        let mut route = convert::route_request(req, &hashes);
        route.shadow = shadow(request.metadata().as_ref());
        let out = self.core.pipeline.route(&route, caller_timeout).await;
        Ok(Response::new(convert::route_response(out, req)))
    }

    async fn lookup_pd_route(
        &self,
        request: Request<LookupPdRouteRequest>,
    ) -> Result<Response<LookupPdRouteResponse>, Status> {
        self.consumer_check(&request).await?;
        let pick = self
            .core
            .pd_router()
            .route(&convert::pd_request(request.get_ref()));
        Ok(Response::new(convert::pd_response(pick)))
    }

    async fn get_cache_state(
        &self,
        request: Request<GetCacheStateRequest>,
    ) -> Result<Response<GetCacheStateResponse>, Status> {
        self.consumer_check(&request).await?;
        let req = request.get_ref();
        let state = self.core.cache_state(&req.tenant_id, &req.model_id);
        Ok(Response::new(convert::cache_state_response(&state)))
    }

    async fn report_caller_load(
        &self,
        request: Request<inferencecache_proto::v1alpha1::CallerLoadReport>,
    ) -> Result<Response<Ack>, Status> {
        // A caller moves the ranking's load: a producer's credentials.
        if let Some(g) = self.producers.as_deref() {
            g.producer(&request).await?;
        }
        crate::replicate::caller_load::report(
            &self.core,
            request.get_ref(),
            crate::replicate::load_share::unix_now_ns(),
        )?;
        Ok(Response::new(Ack {
            accepted: true,
            reason_code: String::new(),
        }))
    }

    async fn report_cache_state(
        &self,
        request: Request<Streaming<CacheStateUpdate>>,
    ) -> Result<Response<Ack>, Status> {
        let gate = self.producers.as_deref();
        let caller = match gate {
            Some(g) => g.producer(&request).await?,
            None => None,
        };
        let _slot = match (gate, &caller) {
            (Some(g), Some(c)) => Some(g.open_stream(c)?),
            _ => None,
        };
        self.ingest_reports(request.into_inner(), caller.as_ref())
            .await
            .map(Response::new)
    }

    async fn publish_event(&self, request: Request<CacheEvent>) -> Result<Response<Ack>, Status> {
        let caller = match self.producers.as_deref() {
            Some(g) => g.producer(&request).await?,
            None => None,
        };
        self.ingest_event(request.into_inner(), caller.as_ref())
            .await
            .map(Response::new)
    }

    type StreamCacheEventsStream = ServerStream<CacheEvent>;

    async fn stream_cache_events(
        &self,
        request: Request<StreamEventsRequest>,
    ) -> Result<Response<Self::StreamCacheEventsStream>, Status> {
        self.consumer_check(&request).await?;
        let req = request.into_inner();
        let filter = EventFilter {
            model_id: req.model_id,
            tenant_id: req.tenant_id,
            types: req.types,
        };
        let rx = self.core.events.subscribe();
        let guard = SubscriberGuard::new(&self.core.metrics, "events");
        let metrics = Arc::clone(&self.core.metrics);
        let stop = self.stop.clone();
        let stream = futures::stream::unfold(
            Some((rx, filter, stop, guard, metrics)),
            |state| async move {
                let (mut rx, filter, stop, guard, metrics) = state?;
                loop {
                    let next = tokio::select! {
                        () = stop.cancelled() => return None,
                        r = rx.recv() => r,
                    };
                    match next {
                        Ok(e) if filter.matches(&e) => {
                            let e = convert::feed_event_to_proto(&e);
                            return Some((Ok(e), Some((rx, filter, stop, guard, metrics))));
                        }
                        Ok(_) => {}
                        Err(RecvError::Closed) => return None,
                        Err(RecvError::Lagged(n)) => {
                            metrics
                                .stream_lagged
                                .get_or_create(&Metrics::type_label("events"))
                                .inc();
                            let status = GrpcError::SubscriberLagged { behind: n }.into();
                            return Some((Err(status), None));
                        }
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    type StreamMetricsStream = ServerStream<Metric>;

    async fn stream_metrics(
        &self,
        request: Request<StreamMetricsRequest>,
    ) -> Result<Response<Self::StreamMetricsStream>, Status> {
        let names = request.into_inner().names;
        let metrics = Arc::clone(&self.core.metrics);
        let guard = SubscriberGuard::new(&metrics, "metrics");
        let mut tick = tokio::time::interval(self.metrics_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stop = self.stop.clone();
        let batches = futures::stream::unfold(
            (tick, names, metrics, stop, guard),
            |(mut tick, names, metrics, stop, guard)| async move {
                tokio::select! {
                    () = stop.cancelled() => return None,
                    _ = tick.tick() => {}
                }
                let now_us = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
                let batch: Vec<Metric> = crate::sampler::samples(&metrics.families(), &names)
                    .into_iter()
                    .map(|m| convert::sample_to_proto(m, now_us))
                    .collect();
                Some((batch, (tick, names, metrics, stop, guard)))
            },
        );
        let stream = batches.flat_map(|batch| futures::stream::iter(batch.into_iter().map(Ok)));
        Ok(Response::new(Box::pin(stream)))
    }
}

//! LookupRoute's own route on the gRPC listener. The generated
//! `InferenceCacheServer` answers every method through prost messages,
//! behind tonic's router (an axum router: path match, boxed services and
//! responses per call). This layer sits in front of the router and takes
//! the one hot method: it serves it with `lookup_wire`'s codec (request
//! decoded in place, response encoded from the outcome) and hands every
//! other request to the router unchanged. Same limits (the decoding cap,
//! no compression, the message-size layer outside this one), same handler
//! logic (`InferenceCacheService::lookup_wire`: consumer auth, the caller's
//! deadline, the pipeline). Issue 36: the server's fixed cost per lookup.

use crate::lookup_wire::{LookupCodec, WireAnswer, WireLookup};
use crate::service::InferenceCacheService;
use futures::future::Either;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tower::{Layer, Service};

/// The method this route serves.
pub(crate) const LOOKUP_ROUTE_PATH: &str = "/inferencecache.v1alpha1.InferenceCache/LookupRoute";

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// Serves LookupRoute in front of the router (module docs).
#[derive(Debug, Clone)]
pub(crate) struct LookupRouteLayer {
    service: Arc<InferenceCacheService>,
    max_decoding_message_bytes: usize,
}

impl LookupRouteLayer {
    /// Serves `service`'s LookupRoute; a request message longer than
    /// `max_decoding_message_bytes` is refused by tonic (OUT_OF_RANGE), as
    /// the generated server's own check does.
    pub(crate) fn new(service: InferenceCacheService, max_decoding_message_bytes: usize) -> Self {
        Self {
            service: Arc::new(service),
            max_decoding_message_bytes,
        }
    }
}

impl<S> Layer<S> for LookupRouteLayer {
    type Service = LookupRoute<S>;

    fn layer(&self, inner: S) -> LookupRoute<S> {
        LookupRoute {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`LookupRouteLayer`].
#[derive(Debug, Clone)]
pub(crate) struct LookupRoute<S> {
    inner: S,
    layer: LookupRouteLayer,
}

impl<S> Service<http::Request<Body>> for LookupRoute<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>>,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Either<S::Future, BoxFuture<http::Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != LOOKUP_ROUTE_PATH {
            return Either::Left(self.inner.call(req));
        }
        let method = Lookup(Arc::clone(&self.layer.service));
        let max = self.layer.max_decoding_message_bytes;
        Either::Right(Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(LookupCodec)
                .apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(method, req).await)
        }))
    }
}

/// The unary method itself.
struct Lookup(Arc<InferenceCacheService>);

/// A lookup answered in the call itself, or one that waits (boxed).
type LookupFuture = Either<
    std::future::Ready<Result<tonic::Response<WireAnswer>, tonic::Status>>,
    BoxFuture<tonic::Response<WireAnswer>, tonic::Status>,
>;

impl tonic::server::UnaryService<WireLookup> for Lookup {
    type Response = WireAnswer;
    type Future = LookupFuture;

    fn call(&mut self, request: tonic::Request<WireLookup>) -> Self::Future {
        // Nothing to wait for (no consumer-auth review, no tokenizer): the
        // answer is ready when the call returns, with no future to box (a
        // boxed handler future was over glibc's thread cache: issue 36,
        // session 45).
        if let Some(answer) = self.0.lookup_now(&request) {
            return Either::Left(std::future::ready(answer));
        }
        let service = Arc::clone(&self.0);
        Either::Right(Box::pin(async move { service.lookup_wire(request).await }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Core;

    /// A lookup with nothing to wait for is answered in the call: the
    /// per-call future is the route's own box (tonic's unary future with
    /// the ready answer inline), one allocation where there were two. It is
    /// 1,880 bytes (2026-12-07), still over glibc's 1,032-byte thread cache:
    /// getting under it (serving the unary call without tonic's `Grpc`
    /// state) is open (issue 36); the bound keeps it from growing.
    #[test]
    fn a_lookup_without_waits_is_answered_in_the_call() {
        let core = Core::with_defaults();
        let service = InferenceCacheService::new(
            core,
            tokio_util::sync::CancellationToken::new(),
            std::time::Duration::from_secs(1),
        );
        let mut method = Lookup(Arc::new(service));
        let ready = tonic::server::UnaryService::call(
            &mut method,
            tonic::Request::new(WireLookup::default()),
        );
        assert!(matches!(ready, Either::Left(_)), "answered in the call");

        let mut route = LookupRouteLayer::new(Arc::unwrap_or_clone(method.0), 4 * 1024 * 1024)
            .layer(tower::service_fn(|_req: http::Request<Body>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
            }));
        let req = http::Request::builder()
            .uri(LOOKUP_ROUTE_PATH)
            .body(Body::empty())
            .unwrap();
        let Either::Right(boxed) = route.call(req) else {
            panic!("LookupRoute is served by the layer");
        };
        let size = std::mem::size_of_val(&*boxed);
        assert!(size <= 2048, "the route's future is {size} bytes");
    }

    /// The handler's future is boxed once per lookup. With the consumer-auth
    /// review and the tokenizer's wait inline it grew by their whole state;
    /// boxed, it is 1,192 bytes (2026-12-07). glibc's per-thread cache takes
    /// allocations up to 1,032 bytes: getting under it is open (issue 36);
    /// this bound keeps the cold paths from coming back inline.
    #[test]
    fn the_lookup_handlers_future_keeps_its_cold_paths_boxed() {
        let core = Core::with_defaults();
        let service = InferenceCacheService::new(
            core,
            tokio_util::sync::CancellationToken::new(),
            std::time::Duration::from_secs(1),
        );
        let future = service.lookup_wire(tonic::Request::new(WireLookup::default()));
        let size = std::mem::size_of_val(&future);
        assert!(size <= 1280, "the handler's future is {size} bytes");
    }
}

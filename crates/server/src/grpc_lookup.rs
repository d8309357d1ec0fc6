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

impl tonic::server::UnaryService<WireLookup> for Lookup {
    type Response = WireAnswer;
    type Future = BoxFuture<tonic::Response<WireAnswer>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<WireLookup>) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move { service.lookup_wire(request).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Core;

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

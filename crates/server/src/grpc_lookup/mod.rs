//! LookupRoute's own route on the gRPC listener. The generated
//! `InferenceCacheServer` answers every method through prost messages,
//! behind tonic's router (an axum router: path match, boxed services and
//! responses per call). This layer sits in front of the router and takes
//! the one hot method: it serves it with `lookup_wire`'s codec (request
//! decoded in place, response encoded from the outcome) and hands every
//! other request to the router unchanged. Same limits (the decoding cap,
//! no compression, the message-size check of `grpc_limits`, which the
//! router's requests get from the layer behind this one), same handler
//! logic (`InferenceCacheService::lookup_wire`: consumer auth, the caller's
//! deadline, the pipeline). Issue 36: the server's fixed cost per lookup.
//!
//! The call itself is `call.rs`: without tonic's `Grpc` state for the
//! request every unary client sends (one uncompressed message), through
//! tonic's general unary path ([`general`]) for anything else.

mod body;
mod call;

use crate::grpc_limits::MessageLimitLayer;
use crate::lookup_wire::{LookupCodec, WireLookup};
use crate::service::InferenceCacheService;
use call::LookupCall;
use futures::future::Either;
use std::sync::Arc;
use std::task::{Context, Poll};
use tonic::body::Body;
use tower::{Layer, Service};

/// The method this route serves.
pub(crate) const LOOKUP_ROUTE_PATH: &str = "/inferencecache.v1alpha1.InferenceCache/LookupRoute";

/// Serves LookupRoute in front of the router (module docs).
#[derive(Debug, Clone)]
pub(crate) struct LookupRouteLayer {
    service: Arc<InferenceCacheService>,
    /// The request-size limit every request body gets (the router's is
    /// behind this route, so LookupRoute's body is checked here).
    limit: MessageLimitLayer,
    max_decoding_message_bytes: usize,
}

impl LookupRouteLayer {
    /// Serves `service`'s LookupRoute with `limit`'s check on its bodies; a
    /// request message longer than `max_decoding_message_bytes` is refused
    /// by tonic (OUT_OF_RANGE), as the generated server's own check does.
    pub(crate) fn new(
        service: InferenceCacheService,
        limit: MessageLimitLayer,
        max_decoding_message_bytes: usize,
    ) -> Self {
        Self {
            service: Arc::new(service),
            limit,
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
    type Future = Either<S::Future, LookupCall<S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != LOOKUP_ROUTE_PATH {
            return Either::Left(self.inner.call(req));
        }
        // A compressed request is tonic's to refuse (UNIMPLEMENTED, with the
        // encodings it accepts); `identity` is no compression.
        let compressed = req
            .headers()
            .get("grpc-encoding")
            .is_some_and(|e| e.as_bytes() != b"identity");
        if compressed {
            let req = req.map(|body| self.layer.limit.limit(body));
            return Either::Right(LookupCall::waiting(general(&self.layer, req)));
        }
        Either::Right(LookupCall::new(self.layer.clone(), req))
    }
}

/// `req` (its body already limited) through tonic's general unary path,
/// with the same codec and handler: what the lean path hands on (module
/// docs).
fn general(route: &LookupRouteLayer, req: http::Request<Body>) -> call::Waiting {
    let method = Lookup(Arc::clone(&route.service));
    let max = route.max_decoding_message_bytes;
    Box::pin(async move {
        let mut grpc =
            tonic::server::Grpc::new(LookupCodec).apply_max_message_size_config(Some(max), None);
        grpc.unary(method, req).await
    })
}

/// The unary method on tonic's general path.
struct Lookup(Arc<InferenceCacheService>);

impl tonic::server::UnaryService<WireLookup> for Lookup {
    type Response = crate::lookup_wire::WireAnswer;
    type Future = call::Waiting<Result<tonic::Response<Self::Response>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<WireLookup>) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move { service.lookup_wire(request).await.map(tonic::Response::new) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::Core;
    use body::Replay;
    use bytes::Bytes;
    use http_body::Body as _;
    use inferencecache_proto::v1alpha1 as pb;
    use prost::Message;
    use std::pin::Pin;

    fn service() -> InferenceCacheService {
        InferenceCacheService::new(
            Core::with_defaults(),
            tokio_util::sync::CancellationToken::new(),
            std::time::Duration::from_secs(1),
        )
    }

    /// The size limit in front of the router: 63 bytes (tonic's own check
    /// at 64 is then the backstop it is in `grpc.rs`).
    fn limit() -> MessageLimitLayer {
        MessageLimitLayer::new(63, prometheus_client::metrics::counter::Counter::default())
    }

    fn route() -> LookupRoute<
        impl Service<
            http::Request<Body>,
            Response = http::Response<Body>,
            Error = std::convert::Infallible,
            Future: Send,
        > + Clone,
    > {
        LookupRouteLayer::new(service(), limit(), 64).layer(tower::service_fn(
            |_req: http::Request<Body>| async {
                Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
            },
        ))
    }

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut b = vec![flag];
        b.extend_from_slice(&(message.len() as u32).to_be_bytes());
        b.extend_from_slice(message);
        b
    }

    fn request(body: Body, headers: &[(&'static str, &'static str)]) -> http::Request<Body> {
        let mut req = http::Request::builder()
            .method("POST")
            .uri(LOOKUP_ROUTE_PATH)
            .header("content-type", "application/grpc")
            .header("te", "trailers");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        req.body(body).unwrap()
    }

    /// How a request body ends after its data: trailers or an error.
    type End = Result<http_body::Frame<Bytes>, tonic::Status>;

    /// A named request body: its data frames and how it ends.
    type Shape<'a> = (&'a str, Vec<&'a [u8]>, Option<End>);

    /// A body of `chunks` as separate frames, then `end` (trailers or an error).
    fn chunked(
        chunks: &[&[u8]],
        end: Option<Result<http_body::Frame<Bytes>, tonic::Status>>,
    ) -> Body {
        let mut frames: Vec<Result<http_body::Frame<Bytes>, tonic::Status>> = chunks
            .iter()
            .map(|c| Ok(http_body::Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        frames.extend(end);
        Body::new(Frames(frames.into()))
    }

    struct Frames(std::collections::VecDeque<Result<http_body::Frame<Bytes>, tonic::Status>>);

    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
            Poll::Ready(self.0.pop_front())
        }
    }

    /// What a client sees of a response: headers (but `date`), the data
    /// frames' bytes decoded as the answer (its latency zeroed: it is the
    /// clock's) or raw, and the trailers.
    #[derive(Debug, PartialEq)]
    struct Seen {
        version: http::Version,
        headers: Vec<(String, String)>,
        answer: Option<pb::LookupRouteResponse>,
        raw: Vec<u8>,
        trailers: Vec<(String, String)>,
    }

    fn pairs(h: &http::HeaderMap) -> Vec<(String, String)> {
        let mut v: Vec<_> = h
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        v.sort();
        v
    }

    async fn seen(res: http::Response<Body>) -> Seen {
        let (parts, mut body) = res.into_parts();
        let mut raw = Vec::new();
        let mut trailers = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            let frame = frame.unwrap();
            if let Some(d) = frame.data_ref() {
                raw.extend_from_slice(d);
            } else if let Some(t) = frame.trailers_ref() {
                trailers = pairs(t);
            }
        }
        let answer = (raw.len() >= 5)
            .then(|| pb::LookupRouteResponse::decode(&raw[5..]).ok())
            .flatten()
            .map(|mut a| {
                a.lookup_latency_us = 0;
                a
            });
        if answer.is_some() {
            // The compressed flag; the length follows the latency's.
            raw.truncate(1);
        }
        Seen {
            version: parts.version,
            headers: pairs(&parts.headers),
            answer,
            raw,
            trailers,
        }
    }

    /// Every request shape gets the same response from the lean call as
    /// from tonic's general unary path: a valid lookup (in one frame or
    /// cut across several), an invalid message, no message, two, a
    /// compressed flag, a length over the limit, a cut message, trailers
    /// sent by the client, a body error.
    #[tokio::test]
    async fn the_lean_call_answers_as_tonics_unary_path() {
        let lookup = pb::LookupRouteRequest {
            model_id: "m".into(),
            tenant_id: "t".into(),
            hash_scheme: "vllm".into(),
            block_hashes: vec![Bytes::from_static(&[1; 8]), Bytes::from_static(&[2; 8])],
            block_token_counts: vec![16, 16],
            adapter_id: "a".into(),
            ..Default::default()
        }
        .encode_to_vec();
        let valid = framed(0, &lookup);
        let mut two = valid.clone();
        two.extend_from_slice(&valid);
        let bodies: Vec<Shape<'_>> = vec![
            ("valid", vec![&valid], None),
            (
                "valid, cut in three",
                vec![&valid[..3], &valid[3..9], &valid[9..]],
                None,
            ),
            ("empty message", vec![&[0, 0, 0, 0, 0]], None),
            ("invalid", vec![&[0, 0, 0, 0, 2, 0xff, 0xff]], None),
            ("no message", vec![], None),
            ("two messages", vec![&two], None),
            ("compressed flag", vec![&[1, 0, 0, 0, 1, 8]], None),
            ("over the size limit", vec![&[0, 0, 0, 0, 64]], None),
            ("over both limits", vec![&[0, 0, 0, 0, 65, 1]], None),
            (
                "invalid, then a message over the size limit",
                vec![&[0, 0, 0, 0, 2, 0xff, 0xff], &[0, 0, 0, 0, 64]],
                None,
            ),
            (
                "valid, then a message over the size limit",
                vec![&valid, &[0, 0, 0, 0, 64]],
                None,
            ),
            ("cut short", vec![&valid[..valid.len() - 1]], None),
            (
                "trailers",
                vec![&valid],
                Some(Ok(http_body::Frame::trailers(http::HeaderMap::new()))),
            ),
            (
                "body error",
                vec![&valid[..4]],
                Some(Err(tonic::Status::resource_exhausted("too long"))),
            ),
        ];
        for (name, chunks, end) in bodies {
            let clone_end = |e: &Option<Result<http_body::Frame<Bytes>, tonic::Status>>| match e {
                None => None,
                Some(Ok(f)) => Some(Ok(http_body::Frame::trailers(
                    f.trailers_ref().unwrap().clone(),
                ))),
                Some(Err(s)) => Some(Err(s.clone())),
            };
            let lean = route()
                .call(request(
                    chunked(&chunks, clone_end(&end)),
                    &[("grpc-timeout", "5S")],
                ))
                .await
                .unwrap();
            let lean = seen(lean).await;
            let layer = LookupRouteLayer::new(service(), limit(), 64);
            let req = request(chunked(&chunks, end), &[("grpc-timeout", "5S")]);
            let tonic = general(&layer, req.map(|b| layer.limit.limit(b))).await;
            let tonic = seen(tonic).await;
            assert_eq!(lean, tonic, "{name}");
        }
    }

    /// A shadow lookup (`x-inferencecache-shadow: true`) gets the answer a
    /// lookup gets and records no delivery, on the lean call and on tonic's
    /// general path alike; without the header the same lookup delivers.
    #[tokio::test]
    async fn a_shadow_lookup_delivers_nothing_on_either_path() {
        let core = crate::replicate::core_holding(&["r0"]);
        let delivered = core.metrics.routing.delivered_hints.clone();
        let layer = LookupRouteLayer::new(
            InferenceCacheService::new(
                core,
                tokio_util::sync::CancellationToken::new(),
                std::time::Duration::from_secs(1),
            ),
            limit(),
            64,
        );
        let noop = tower::service_fn(|_req: http::Request<Body>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
        let lookup = framed(
            0,
            &pb::LookupRouteRequest {
                model_id: "m".into(),
                tenant_id: "t".into(),
                hash_scheme: "vllm".into(),
                block_hashes: vec![Bytes::from_static(&[1; 8]), Bytes::from_static(&[2; 8])],
                block_token_counts: vec![16, 16],
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let body = || Body::new(Replay::new(Bytes::from(lookup.clone()), None));
        let shadow = [("x-inferencecache-shadow", "true")];
        let answers = [
            seen(
                layer
                    .layer(noop)
                    .call(request(body(), &shadow))
                    .await
                    .unwrap(),
            )
            .await,
            seen(general(&layer, request(body(), &shadow)).await).await,
        ];
        for a in &answers {
            let answer = a.answer.as_ref().expect("an answer");
            // Under the default floor of matched tokens: r0 by affinity.
            assert_eq!(answer.reason_code, "AFFINITY_HINT", "{a:?}");
            assert_eq!(answer.replica_scores[0].replica_id, "r0", "{a:?}");
        }
        assert_eq!(answers[0], answers[1], "both paths answer alike");
        assert_eq!(delivered.get(), 0, "a shadow lookup delivers nothing");
        let plain = seen(general(&layer, request(body(), &[])).await).await;
        assert_eq!(plain.answer, answers[0].answer, "a lookup's answer");
        assert_eq!(delivered.get(), 1, "the same lookup without the header");
    }

    /// A compressed request is refused as tonic refuses it.
    #[tokio::test]
    async fn a_compressed_request_is_refused() {
        let body = Body::new(Replay::new(Bytes::from(framed(0, b"")), None));
        let res = route()
            .call(request(body, &[("grpc-encoding", "gzip")]))
            .await
            .unwrap();
        let seen = seen(res).await;
        assert!(
            seen.headers.contains(&("grpc-status".into(), "12".into())),
            "{seen:?}"
        );
    }

    /// A lookup is answered in the route's own future, no box per call:
    /// tonic's unary future was 1,880 bytes (session 45), boxed. The bound
    /// keeps the call's state from growing back.
    #[test]
    fn a_lookup_is_served_without_a_boxed_future() {
        let mut route = route();
        let req = request(Body::empty(), &[]);
        let Either::Right(call) = route.call(req) else {
            panic!("LookupRoute is served by the layer");
        };
        let size = std::mem::size_of_val(&call);
        assert!(size <= 512, "the call's future is {size} bytes");
    }

    /// The handler's future is boxed once per lookup. With the consumer-auth
    /// review and the tokenizer's wait inline it grew by their whole state;
    /// boxed, it is 1,192 bytes (2026-12-07). glibc's per-thread cache takes
    /// allocations up to 1,032 bytes: getting under it is open (issue 36);
    /// this bound keeps the cold paths from coming back inline.
    #[test]
    fn the_lookup_handlers_future_keeps_its_cold_paths_boxed() {
        let service = service();
        let future = service.lookup_wire(tonic::Request::new(WireLookup::default()));
        let size = std::mem::size_of_val(&future);
        assert!(size <= 1280, "the handler's future is {size} bytes");
    }
}

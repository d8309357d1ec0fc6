//! The gRPC router: the InferenceCache service, `grpc.health.v1.Health` and
//! server reflection (v1 and v1alpha: grpcurl 1.8.6 speaks only v1alpha).

use crate::error::ServeError;
use crate::grpc_limits::MessageLimitLayer;
use crate::grpc_lookup::LookupRouteLayer;
use crate::service::InferenceCacheService;
use inferencecache_proto::v1alpha1::inference_cache_server::InferenceCacheServer;
use tonic::transport::Server;
use tonic::transport::server::Router;

/// Builds the gRPC router with every service registered. Request messages
/// longer than `max_message_bytes` are refused with RESOURCE_EXHAUSTED
/// (`grpc_limits`); `refused` counts them. LookupRoute is served by
/// `grpc_lookup` in front of the router, with the same size limit.
pub(crate) async fn router(
    service: InferenceCacheService,
    max_message_bytes: usize,
    refused: prometheus_client::metrics::counter::Counter,
) -> Result<
    Router<
        tower::layer::util::Stack<
            MessageLimitLayer,
            tower::layer::util::Stack<LookupRouteLayer, tower::layer::util::Identity>,
        >,
    >,
    ServeError,
> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    // The overall service "" is SERVING from the start and never changes, as
    // in the reference; per-service status is reported too.
    health_reporter
        .set_serving::<InferenceCacheServer<InferenceCacheService>>()
        .await;

    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(inferencecache_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;

    // TLS, when on, is terminated in front of the router (crate::tls), so the
    // certificate can be reloaded without restarting the server.
    // LookupRoute's route is the outer layer: it checks its bodies against
    // the size limit itself (one boxed body per call fewer); every other
    // request gets the limit's layer behind it.
    let limit = MessageLimitLayer::new(max_message_bytes, refused);
    Ok(Server::builder()
        .layer(LookupRouteLayer::new(
            service.clone(),
            limit.clone(),
            max_message_bytes.saturating_add(1),
        ))
        .layer(limit)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            // tonic's own check stays as a backstop (it answers OUT_OF_RANGE).
            InferenceCacheServer::new(service)
                .max_decoding_message_size(max_message_bytes.saturating_add(1)),
        ))
}

//! The gRPC router: the InferenceCache service, `grpc.health.v1.Health` and
//! server reflection (v1 and v1alpha: grpcurl 1.8.6 speaks only v1alpha).

use crate::error::ServeError;
use crate::service::InferenceCacheService;
use inferencecache_proto::v1alpha1::inference_cache_server::InferenceCacheServer;
use tonic::transport::Server;
use tonic::transport::server::Router;

/// Largest accepted request: a LookupRoute at the contract's limits (1 Mi
/// token ids at up to 5 varint bytes each, plus 1 MiB of prompt text) must
/// reach the handler and fail open there, not die in the codec at gRPC's
/// 4 MiB default.
pub const MAX_REQUEST_BYTES: usize = 8 << 20;

/// Builds the gRPC router with every service registered.
pub async fn router(service: InferenceCacheService) -> Result<Router, ServeError> {
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
    Ok(Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            InferenceCacheServer::new(service).max_decoding_message_size(MAX_REQUEST_BYTES),
        ))
}

//! Helpers of the server's suites; the running server itself is
//! `inferencecache_testkit::server::Running`.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

pub(crate) mod certs;

use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
pub(crate) use inferencecache_testkit::server::Running;
use tonic::transport::Channel;

/// Sends one `ReportCacheState` stream of `updates` and checks it was accepted.
#[allow(dead_code)] // not every test binary that includes `common` reports
pub(crate) async fn report(
    c: &mut InferenceCacheClient<Channel>,
    updates: Vec<inferencecache_proto::v1alpha1::CacheStateUpdate>,
) {
    let ack = c
        .report_cache_state(futures::stream::iter(updates))
        .await
        .unwrap()
        .into_inner();
    assert!(ack.accepted);
}

/// `GetCacheState` for (`model`, `tenant`).
#[allow(dead_code)] // not every test binary that includes `common` reads state
pub(crate) async fn cache_state(
    c: &mut InferenceCacheClient<Channel>,
    model: &str,
    tenant: &str,
) -> inferencecache_proto::v1alpha1::GetCacheStateResponse {
    c.get_cache_state(inferencecache_proto::v1alpha1::GetCacheStateRequest {
        model_id: model.into(),
        tenant_id: tenant.into(),
    })
    .await
    .unwrap()
    .into_inner()
}

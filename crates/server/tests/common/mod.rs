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

/// A block hash of the chain suites: eight copies of `b`.
#[allow(dead_code)] // not every test binary that includes `common` builds chains
pub(crate) fn h(b: u8) -> Vec<u8> {
    vec![b; 8]
}

/// A LookupRoute of ("m", "t", "vllm") by the chain of `blocks` (64 tokens each).
#[allow(dead_code)] // not every test binary that includes `common` builds chains
pub(crate) fn chain_req(
    blocks: std::ops::RangeInclusive<u8>,
) -> inferencecache_proto::v1alpha1::LookupRouteRequest {
    let hashes: Vec<Vec<u8>> = blocks.map(h).collect();
    inferencecache_proto::v1alpha1::LookupRouteRequest {
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        block_token_counts: vec![64; hashes.len()],
        block_hashes: hashes.into_iter().map(Into::into).collect(),
        ..Default::default()
    }
}

/// A server whose index reads the returned manual clock (queued work
/// drains as the test moves it, not as the machine happens to run).
#[allow(dead_code)] // not every test binary that includes `common` needs a clock
pub(crate) async fn start_on_manual_clock()
-> (Running, std::sync::Arc<inferencecache_index::ManualClock>) {
    let clock = std::sync::Arc::new(inferencecache_index::ManualClock::new(
        1_700_000_000_000_000_000,
    ));
    let s = Running::start_with_clock(
        inferencecache_server::ServerConfig::ephemeral(),
        clock.clone(),
    )
    .await;
    (s, clock)
}

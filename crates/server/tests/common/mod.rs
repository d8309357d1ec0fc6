//! Boots a real server on ephemeral loopback ports for a test.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub(crate) mod certs;

use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_server::{Server, ServerConfig};
use std::net::SocketAddr;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// A running server and handles to reach and stop it.
pub(crate) struct Running {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub control: SocketAddr,
    pub policies: inferencecache_server::policy::PolicyStore,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<(), inferencecache_server::ServeError>>,
}

impl Running {
    pub(crate) async fn start() -> Self {
        Self::start_with(ServerConfig::ephemeral()).await
    }

    /// A server started with `--ranking contract`: the reference's ranking
    /// and affinity, for the tests that pin them.
    pub(crate) async fn start_contract() -> Self {
        let mut config = ServerConfig::ephemeral();
        config.index.ranking = inferencecache_server::core::RankingMode::Contract;
        Self::start_with(config).await
    }

    pub(crate) async fn start_with(config: ServerConfig) -> Self {
        let server = Server::bind(&config).await.expect("bind");
        let (grpc, http, control) = (
            server.grpc_addr(),
            server.http_addr(),
            server.control_addr(),
        );
        let policies = server.policies();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.serve(shutdown.clone()));
        let running = Self {
            grpc,
            http,
            control,
            policies,
            shutdown,
            task,
        };
        running.wait_ready().await;
        running
    }

    async fn wait_ready(&self) {
        for _ in 0..100 {
            if let Ok(r) = reqwest::get(self.url("/readyz")).await {
                if r.status() == 200 {
                    return;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        panic!("server did not become ready");
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// The public `/metrics` body.
    pub(crate) async fn metrics_text(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    pub(crate) fn control_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.control)
    }

    pub(crate) async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.grpc))
            .unwrap()
            .connect()
            .await
            .expect("connect")
    }

    pub(crate) async fn client(&self) -> InferenceCacheClient<Channel> {
        InferenceCacheClient::new(self.channel().await)
    }

    pub(crate) async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("join").expect("clean shutdown");
    }
}

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

//! A real server in-process on ephemeral loopback ports (feature `server`):
//! the one running-server harness of the server's and the client's suites.
//!
//! [`Running`] serves on the test's runtime; [`Isolated`] on a thread and
//! runtime of its own, as a remote server would (its CPU-bound work cannot
//! starve the test's timers). Both return once `/readyz` answers 200,
//! polled with a deadline.

use inferencecache_index::Clock;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_server::{ServeError, Server, ServerConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// How long a server may take to become ready (a loaded debug build).
const READY_WITHIN: Duration = Duration::from_secs(10);

/// Polls `http`'s `/readyz` until it answers 200; panics past [`READY_WITHIN`].
async fn wait_ready(http: SocketAddr) {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        if let Ok(r) = reqwest::get(format!("http://{http}/readyz")).await {
            if r.status() == 200 {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "server on {http} not ready within {READY_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A running server and handles to reach and stop it.
pub struct Running {
    /// gRPC listener.
    pub grpc: SocketAddr,
    /// Public HTTP listener (`/metrics`, `/readyz`).
    pub http: SocketAddr,
    /// Control listener (`/policy`, `/snapshot`).
    pub control: SocketAddr,
    /// The server's policy store.
    pub policies: inferencecache_server::policy::PolicyStore,
    /// Cancel to stop the server.
    pub shutdown: CancellationToken,
    /// The serving task.
    pub task: JoinHandle<Result<(), ServeError>>,
}

impl Running {
    /// A server with [`ServerConfig::ephemeral`].
    pub async fn start() -> Self {
        Self::start_with(ServerConfig::ephemeral()).await
    }

    /// A server started with `--ranking contract`: the reference's ranking
    /// and affinity, for the tests that pin them.
    pub async fn start_contract() -> Self {
        let mut config = ServerConfig::ephemeral();
        config.index.ranking = inferencecache_server::core::RankingMode::Contract;
        Self::start_with(config).await
    }

    /// A server with `config` on the system clock.
    pub async fn start_with(config: ServerConfig) -> Self {
        Self::start_with_clock(config, Arc::new(inferencecache_index::SystemClock)).await
    }

    /// A server whose index runs on `clock` (a `ManualClock` lets a test
    /// move time instead of sleeping).
    pub async fn start_with_clock(config: ServerConfig, clock: Arc<dyn Clock>) -> Self {
        let server = Server::bind_with_clock(&config, clock).await.expect("bind");
        Self::serve(server, CancellationToken::new()).await
    }

    /// Serves a bound `server` (a test took handles from it first) until
    /// `shutdown`, once it is ready.
    pub async fn serve(server: Server, shutdown: CancellationToken) -> Self {
        let (grpc, http, control) = (
            server.grpc_addr(),
            server.http_addr(),
            server.control_addr(),
        );
        let policies = server.policies();
        let task = tokio::spawn(server.serve(shutdown.clone()));
        wait_ready(http).await;
        Self {
            grpc,
            http,
            control,
            policies,
            shutdown,
            task,
        }
    }

    /// A URL on the public HTTP listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.http)
    }

    /// A URL on the control listener.
    pub fn control_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.control)
    }

    /// The gRPC endpoint as a URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// The public `/metrics` body.
    pub async fn metrics_text(&self) -> String {
        reqwest::get(self.url("/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// A connected gRPC channel.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.endpoint())
            .unwrap()
            .connect()
            .await
            .expect("connect")
    }

    /// A generated gRPC client.
    pub async fn client(&self) -> InferenceCacheClient<Channel> {
        InferenceCacheClient::new(self.channel().await)
    }

    /// Pushes a tenant policy document to the control endpoint (204 asserted).
    pub async fn policy(&self, body: &str) {
        let r = reqwest::Client::new()
            .post(self.control_url("/policy"))
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "{}", r.text().await.unwrap());
    }

    /// Stops the server and checks it shut down cleanly.
    pub async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("join").expect("clean shutdown");
    }
}

/// A real server on its own thread and runtime, as a remote server would be:
/// its CPU-bound work cannot starve the client's runtime (and its timers),
/// which an in-process server on the test's runtime would.
pub struct Isolated {
    /// gRPC listener.
    pub grpc: SocketAddr,
    /// Public HTTP listener.
    pub http: SocketAddr,
    shutdown: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Isolated {
    /// A server with [`ServerConfig::ephemeral`] on a 2-thread runtime of its own.
    pub async fn start() -> Self {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let server = Server::bind(&ServerConfig::ephemeral()).await.unwrap();
                tx.send((server.grpc_addr(), server.http_addr())).unwrap();
                server.serve(stop).await.unwrap();
            });
        });
        let (grpc, http) = rx.await.unwrap();
        wait_ready(http).await;
        Self {
            grpc,
            http,
            shutdown,
            thread: Some(thread),
        }
    }

    /// The gRPC endpoint as a URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }
}

impl Drop for Isolated {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

//! Boots a real server in-process on ephemeral loopback ports.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use inferencecache_client::{CacheStateUpdate, Client, ClientConfig, PrefixEntry, ReplicaStats};
use inferencecache_server::{Server, ServerConfig};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Policy that turns affinity off, so misses are NO_HINT / TENANT_HOT.
pub(crate) const NO_AFFINITY: &str = r#"{"version":7,"policies":[{"namespace":"t","affinityRouting":false,"minimumMatchedTokens":64}]}"#;

/// A running server.
pub(crate) struct Running {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub control: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), inferencecache_server::ServeError>>,
}

impl Running {
    pub(crate) async fn start() -> Self {
        Self::start_with(ServerConfig::ephemeral()).await
    }

    /// A server ranking as the reference does (`--ranking contract`): the
    /// only mode that still answers TENANT_HOT and the scope-wide affinity
    /// pick the hint-parsing tests pin.
    #[allow(dead_code)]
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
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(server.serve(shutdown.clone()));
        let running = Self {
            grpc,
            http,
            control,
            shutdown,
            task,
        };
        running.wait_ready().await;
        running
    }

    async fn wait_ready(&self) {
        for _ in 0..200 {
            if let Ok(r) = reqwest::get(format!("http://{}/readyz", self.http)).await {
                if r.status() == 200 {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("server did not become ready");
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.grpc)
    }

    /// A client with a deadline generous enough for a loaded debug build.
    pub(crate) async fn client(&self) -> Client {
        Client::connect(ClientConfig::new(self.endpoint()).lookup_deadline(Duration::from_secs(5)))
            .await
            .expect("connect")
    }

    /// Pushes a tenant policy document to the control endpoint.
    pub(crate) async fn policy(&self, body: &str) {
        let r = reqwest::Client::new()
            .post(format!("http://{}/policy", self.control))
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "{}", r.text().await.unwrap());
    }

    pub(crate) async fn stop(self) {
        self.shutdown.cancel();
        self.task.await.expect("join").expect("clean shutdown");
    }
}

/// A real server on its own thread and runtime, as a remote server would be:
/// its CPU-bound work cannot starve the client's runtime (and its timers),
/// which an in-process server on the test's runtime would.
pub(crate) struct Isolated {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    shutdown: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Isolated {
    pub(crate) async fn start() -> Self {
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
        for _ in 0..200 {
            if let Ok(r) = reqwest::get(format!("http://{http}/readyz")).await {
                if r.status() == 200 {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self {
            grpc,
            http,
            shutdown,
            thread: Some(thread),
        }
    }

    pub(crate) fn endpoint(&self) -> String {
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

/// A state update for tenant `t`, model `m`, scheme `vllm`.
pub(crate) fn update(replica: &str, prefixes: Vec<PrefixEntry>) -> CacheStateUpdate {
    CacheStateUpdate {
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes,
        ..Default::default()
    }
}

/// The chain entry a subscriber would report for `tokens`.
pub(crate) fn chain_entry(tokens: &[u32]) -> PrefixEntry {
    let (block_hashes, block_token_counts) = inferencecache_client::block_hashes(tokens, 16);
    PrefixEntry {
        block_hashes,
        block_token_counts,
        ..Default::default()
    }
}

/// An update whose replica reports a cache hit rate (what makes it "hot").
pub(crate) fn hot_update(replica: &str, prefixes: Vec<PrefixEntry>) -> CacheStateUpdate {
    CacheStateUpdate {
        stats: Some(ReplicaStats {
            hit_rate: 0.8,
            ..Default::default()
        }),
        ..update(replica, prefixes)
    }
}

//! The operator process: leader election, the push loop and its watch
//! triggers, the CacheIndex poller, the webhook listener and the
//! metrics/health listeners, all stopped by one cancellation token.

use crate::client::ServerClient;
use crate::crd::{CachePolicy, CacheTenant, PDTopology, PromptTemplate};
use crate::leader::{self, LeaderConfig};
use crate::metrics::Metrics;
use crate::poller::Poller;
use crate::push::Pusher;
use crate::reach::{self, Reach};
use crate::webhook::inject::InjectConfig;
use crate::webhook::provision::{self, ProvisionError, SelfSignedConfig};
use crate::webhook::{WebhookError, WebhookServer, WebhookState};
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

/// Longest wait between retries of a failed push.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// First retry delay.
const MIN_BACKOFF: Duration = Duration::from_millis(500);
/// Watch events closer together than this are pushed once.
const COALESCE: Duration = Duration::from_millis(50);

/// Everything the operator needs (the CLI's flags).
#[derive(Debug, Clone)]
pub struct OperatorConfig {
    /// Kubeconfig; `None` = in-cluster or `$KUBECONFIG`.
    pub kubeconfig: Option<PathBuf>,
    /// `/metrics` listener.
    pub metrics_addr: String,
    /// `/healthz` + `/readyz` listener.
    pub health_addr: String,
    /// `--server-policy-url`.
    pub policy_url: String,
    /// `--server-snapshot-url`.
    pub snapshot_url: String,
    /// `--server-templates-url` ("" disables).
    pub templates_url: String,
    /// `--server-pd-topologies-url` ("" disables).
    pub pd_url: String,
    /// Projected token for `/policy` (and the other pushes).
    pub policy_token_file: PathBuf,
    /// Projected token for `/snapshot`.
    pub controller_token_file: PathBuf,
    /// `--cachepolicy-push-interval`.
    pub push_interval: Duration,
    /// `--cacheindex-refresh-interval`.
    pub refresh_interval: Duration,
    /// `Some` = elect a leader on this Lease; `None` = always lead.
    pub leader: Option<LeaderConfig>,
    /// `Some((bind, cert_dir))` serves the admission webhooks.
    pub webhook: Option<(String, PathBuf)>,
    /// `Some`: provision and rotate the webhook certificate into
    /// `cert_dir` (and inject its CA); `None`: serve the mounted files.
    pub webhook_certs: Option<SelfSignedConfig>,
    /// Sidecar settings.
    pub inject: InjectConfig,
}

/// Why the operator could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No Kubernetes client.
    #[error("{0}")]
    Kube(String),
    /// A listener could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The webhook listener could not start.
    #[error(transparent)]
    Webhook(#[from] WebhookError),
    /// The webhook certificate could not be provisioned.
    #[error(transparent)]
    Provision(#[from] ProvisionError),
}

/// A Kubernetes client from a kubeconfig file, or in-cluster / `$KUBECONFIG`.
pub async fn kube_client(kubeconfig: Option<&std::path::Path>) -> Result<Client, RunError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| RunError::Kube(format!("read kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| RunError::Kube(format!("kubeconfig {}: {e}", path.display())))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            RunError::Kube(format!(
                "no in-cluster config or KUBECONFIG ({e}); pass --kubeconfig when running outside a cluster"
            ))
        })?,
    };
    Client::try_from(config).map_err(|e| RunError::Kube(format!("kubernetes client: {e}")))
}

/// A bound, not yet running operator.
pub struct Operator {
    cfg: OperatorConfig,
    client: Client,
    metrics: Metrics,
    metrics_listener: TcpListener,
    health_listener: TcpListener,
    webhook: Option<WebhookServer>,
    /// Whether the first certificate check injected every CA bundle.
    certs_complete: bool,
}

impl std::fmt::Debug for Operator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Operator")
            .field("metrics_addr", &self.metrics_addr())
            .field("health_addr", &self.health_addr())
            .field("webhook_addr", &self.webhook_addr())
            .finish_non_exhaustive()
    }
}

/// Binds a listener flag's value (`:PORT`, `HOST:PORT`; the forms every
/// listener of the binary shares).
pub(crate) async fn bind_listener(addr: &str) -> Result<TcpListener, RunError> {
    let parsed = inferencecache_control_api::listen::parse_listen_addr(addr).map_err(|e| {
        RunError::Bind {
            addr: addr.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()),
        }
    })?;
    TcpListener::bind(parsed)
        .await
        .map_err(|source| RunError::Bind {
            addr: addr.to_owned(),
            source,
        })
}

#[derive(Clone)]
struct HealthState {
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    server: Reach,
}

fn tasks_spawn_reach(
    tasks: &mut tokio::task::JoinSet<()>,
    server: &Reach,
    policy_url: &str,
    shutdown: &CancellationToken,
) {
    tasks.spawn(reach::run(
        server.clone(),
        policy_url.to_owned(),
        reach::PERIOD,
        shutdown.clone(),
    ));
}

async fn metrics_handler(
    State(s): State<HealthState>,
) -> ([(&'static str, &'static str); 1], String) {
    (
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        s.metrics.encode(),
    )
}

/// Ready once every loop runs and the server is reachable; the body says
/// what is missing.
async fn readyz(State(s): State<HealthState>) -> (StatusCode, String) {
    if !s.ready.load(Ordering::Relaxed) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: starting\n".into(),
        );
    }
    match s.server.status() {
        Ok(()) => (StatusCode::OK, "ok\n".into()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        ),
    }
}

impl Operator {
    /// Connects to Kubernetes and binds every listener.
    pub async fn bind(cfg: OperatorConfig) -> Result<Self, RunError> {
        let client = kube_client(cfg.kubeconfig.as_deref()).await?;
        let metrics_listener = bind_listener(&cfg.metrics_addr).await?;
        let health_listener = bind_listener(&cfg.health_addr).await?;
        let mut certs_complete = true;
        let webhook = match &cfg.webhook {
            Some((addr, dir)) => {
                // The certificate must exist before the listener loads it.
                if let Some(certs) = &cfg.webhook_certs {
                    certs_complete = provision::ensure(&client, certs, dir).await?.injected;
                }
                Some(WebhookServer::bind(addr, dir).await?)
            }
            None => None,
        };
        Ok(Self {
            cfg,
            client,
            metrics: Metrics::new(),
            metrics_listener,
            health_listener,
            webhook,
            certs_complete,
        })
    }

    /// The metrics listener's address.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_listener.local_addr().ok()
    }

    /// The health listener's address.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_listener.local_addr().ok()
    }

    /// The webhook listener's address.
    pub fn webhook_addr(&self) -> Option<SocketAddr> {
        self.webhook.as_ref().and_then(WebhookServer::local_addr)
    }

    /// Runs until `shutdown`, then releases the Lease and drains the
    /// listeners.
    pub async fn run(self, shutdown: CancellationToken) {
        let Self {
            cfg,
            client,
            metrics,
            metrics_listener,
            health_listener,
            webhook,
            certs_complete,
        } = self;
        let mut tasks = tokio::task::JoinSet::new();
        let ready = Arc::new(AtomicBool::new(false));
        let server = Reach::default();
        let health = HealthState {
            metrics: metrics.clone(),
            ready: ready.clone(),
            server: server.clone(),
        };
        tasks_spawn_reach(&mut tasks, &server, &cfg.policy_url, &shutdown);
        let metrics_app = Router::new()
            .route("/metrics", get(metrics_handler))
            .with_state(health.clone());
        let health_app = Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/readyz", get(readyz))
            .with_state(health);
        for (listener, app) in [
            (metrics_listener, metrics_app),
            (health_listener, health_app),
        ] {
            let stop = shutdown.clone();
            tasks.spawn(async move {
                if let Err(e) = axum::serve(listener, app)
                    .with_graceful_shutdown(async move { stop.cancelled().await })
                    .await
                {
                    tracing::error!(error = %e, "listener failed");
                }
            });
        }
        if let (Some(certs), Some((_, dir))) = (&cfg.webhook_certs, &cfg.webhook) {
            tasks.spawn(provision::rotate_loop(
                client.clone(),
                certs.clone(),
                dir.clone(),
                certs_complete,
                shutdown.clone(),
            ));
        }
        if let Some(server) = webhook {
            let state = WebhookState {
                client: client.clone(),
                inject: Arc::new(cfg.inject.clone()),
                metrics: metrics.clone(),
            };
            tasks.spawn(server.serve(state, shutdown.clone()));
        }

        let (leader_tx, leader_rx) = watch::channel(cfg.leader.is_none());
        // Without election the sender must outlive the loops (a dropped
        // sender ends them).
        let _always_leading = if let Some(lc) = cfg.leader.clone() {
            let api: Api<Lease> = Api::namespaced(client.clone(), &lc.namespace);
            tasks.spawn(leader::run(
                api,
                lc,
                leader_tx,
                metrics.clone(),
                shutdown.clone(),
            ));
            None
        } else {
            metrics.leader.set(1);
            Some(leader_tx)
        };

        let trigger = Arc::new(Notify::new());
        spawn_watch::<CachePolicy>(&mut tasks, &client, &trigger, &shutdown);
        spawn_watch::<CacheTenant>(&mut tasks, &client, &trigger, &shutdown);
        if !cfg.templates_url.is_empty() {
            spawn_watch::<PromptTemplate>(&mut tasks, &client, &trigger, &shutdown);
        }
        if !cfg.pd_url.is_empty() {
            spawn_watch::<PDTopology>(&mut tasks, &client, &trigger, &shutdown);
        }

        let http = ServerClient::new();
        let pusher = Pusher {
            client: client.clone(),
            http: http.clone(),
            policy_url: cfg.policy_url.clone(),
            templates_url: cfg.templates_url.clone(),
            pd_url: cfg.pd_url.clone(),
            policy_token_file: cfg.policy_token_file.clone(),
            metrics: metrics.clone(),
            templates_unsupported: Arc::default(),
            pd_unsupported: Arc::default(),
        };
        tasks.spawn(push_loop(
            pusher,
            cfg.push_interval,
            leader_rx.clone(),
            trigger,
            shutdown.clone(),
        ));
        let poller = Poller {
            client,
            http,
            snapshot_url: cfg.snapshot_url.clone(),
            token_file: cfg.controller_token_file.clone(),
            metrics,
        };
        tasks.spawn(poll_loop(
            poller,
            cfg.refresh_interval,
            leader_rx,
            shutdown.clone(),
        ));

        ready.store(true, Ordering::Relaxed);
        tracing::info!("operator running");
        while tasks.join_next().await.is_some() {}
        tracing::info!("operator stopped");
    }
}

/// Watches one kind and pokes `trigger` on every event (the key is
/// irrelevant: every push carries everything).
fn spawn_watch<K>(
    tasks: &mut tokio::task::JoinSet<()>,
    client: &Client,
    trigger: &Arc<Notify>,
    shutdown: &CancellationToken,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api: Api<K> = Api::all(client.clone());
    let (trigger, shutdown) = (trigger.clone(), shutdown.clone());
    tasks.spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed();
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                ev = stream.next() => match ev {
                    Some(Ok(_)) => trigger.notify_one(),
                    Some(Err(e)) => tracing::debug!(error = %e, kind = %K::kind(&()), "watch error (retrying)"),
                    None => return,
                },
            }
        }
    });
}

/// Waits until this replica leads (or shutdown). Returns false on shutdown.
async fn until_leading(leader: &mut watch::Receiver<bool>, shutdown: &CancellationToken) -> bool {
    loop {
        if *leader.borrow_and_update() {
            return true;
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            r = leader.changed() => if r.is_err() { return false },
        }
    }
}

/// Pushes on every watch event, every `interval`, and on retry after a
/// failure (exponential backoff up to 30 s), while leading.
async fn push_loop(
    pusher: Pusher,
    interval: Duration,
    mut leader: watch::Receiver<bool>,
    trigger: Arc<Notify>,
    shutdown: CancellationToken,
) {
    let mut backoff = MIN_BACKOFF;
    loop {
        if !until_leading(&mut leader, &shutdown).await {
            return;
        }
        let wait = match pusher.push_all().await {
            Ok(()) => {
                backoff = MIN_BACKOFF;
                interval
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "policy push failed");
                let retry = backoff.min(interval);
                backoff = (backoff * 2).min(MAX_BACKOFF);
                retry
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = trigger.notified() => tokio::time::sleep(COALESCE).await,
            () = tokio::time::sleep(wait) => {}
            r = leader.changed() => if r.is_err() { return },
        }
    }
}

/// Polls `/snapshot` every `interval` while leading.
async fn poll_loop(
    poller: Poller,
    interval: Duration,
    mut leader: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    loop {
        if !until_leading(&mut leader, &shutdown).await {
            return;
        }
        if let Err(e) = poller.poll_once().await {
            tracing::warn!(error = %e, "CacheIndex refresh failed; status unchanged");
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
            r = leader.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_listener_accepts_the_go_port_form() {
        let l = bind_listener(":0").await.unwrap();
        assert!(l.local_addr().unwrap().ip().is_unspecified());
        let l = bind_listener("localhost:0").await.unwrap();
        assert!(l.local_addr().unwrap().ip().is_loopback());
        let e = bind_listener("8080").await.unwrap_err();
        assert!(e.to_string().contains("HOST:PORT"), "{e}");
    }
}

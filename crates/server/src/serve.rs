//! Binding the three listeners, serving them, and the graceful shutdown
//! lifecycle (`graceful_shutdown_started` → drain → `graceful_shutdown_done`).

use crate::config::ControlAuth;
use crate::config::ServerConfig;
use crate::core::Core;
use crate::error::ServeError;
use crate::http::{HttpState, control_router, public_router};
use crate::metrics::Metrics;
use crate::named::FileTarget;
use crate::pd::Topology;
use crate::policy::{PolicyFileWatcher, PolicyStore};
use crate::service::InferenceCacheService;
use crate::templates::CompiledTemplate;
use crate::watch::{FileWatcher, Reloadable};
use crate::write_coalesce::CoalescedWrites;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;

/// How long in-flight HTTP requests and gRPC calls may take to finish after a
/// shutdown signal before they are cut.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// How often `--policy-file`, `--templates-dir` and `--pd-topology-file` are
/// checked for changes.
pub(crate) const POLICY_FILE_POLL: Duration = Duration::from_secs(2);

/// A server whose listeners are bound but not yet serving.
pub struct Server {
    core: Core,
    sweep_interval: Duration,
    metrics_interval: Duration,
    ready: Arc<AtomicBool>,
    policy_file: Option<PolicyFileWatcher>,
    templates_dir: Option<FileWatcher<FileTarget<CompiledTemplate>>>,
    pd_topology_file: Option<FileWatcher<FileTarget<Topology>>>,
    control_auth: ControlAuth,
    auth: Option<Arc<crate::http::ControlAuthenticators>>,
    tls: Option<TlsAcceptor>,
    replication: crate::replicate::Replication,
    producers: Option<Arc<crate::producer::Gate>>,
    edge: EdgeMetrics,
    grpc: TcpListener,
    http: TcpListener,
    control: TcpListener,
}

/// The edge subsystems' own metrics: each registers its families in the
/// server's registry at construction and keeps its handle here.
struct EdgeMetrics {
    producers: Arc<crate::producer::ProducerMetrics>,
    replication: Arc<crate::replicate::ReplicationMetrics>,
    ui: Arc<crate::http::ui::UiMetrics>,
    control_auth: crate::auth::ControlAuthMetrics,
}

impl EdgeMetrics {
    fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        Self {
            replication: Arc::new(crate::replicate::ReplicationMetrics::register(registry)),
            producers: Arc::new(crate::producer::ProducerMetrics::register(registry)),
            ui: Arc::new(crate::http::ui::UiMetrics::register(registry)),
            control_auth: crate::auth::ControlAuthMetrics::register(registry),
        }
    }
}

async fn bind(
    what: &'static str,
    flag: &'static str,
    addr: SocketAddr,
) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind {
            what,
            flag,
            addr: addr.to_string(),
            source,
        })
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("grpc", &self.grpc_addr())
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Loads TLS material and binds every listener; fails before serving
    /// anything if a file is unreadable or a port is taken.
    pub async fn bind(config: &ServerConfig) -> Result<Self, ServeError> {
        Self::bind_with_clock(config, Arc::new(inferencecache_index::SystemClock)).await
    }

    /// As [`Server::bind`], with the index on another clock (the simulator's
    /// simulated time).
    pub async fn bind_with_clock(
        config: &ServerConfig,
        clock: Arc<dyn inferencecache_index::Clock>,
    ) -> Result<Self, ServeError> {
        let tls = config.tls.as_ref().map(crate::tls::acceptor).transpose()?;
        let (metrics, edge) = Metrics::with_subsystems(EdgeMetrics::register);
        let metrics = Arc::new(metrics);
        metrics.grpc_tls_enabled.set(i64::from(tls.is_some()));
        let policies = PolicyStore::new();
        let policy_file = match &config.policy_file {
            Some(path) => Some(
                crate::policy::watch_policy_file(
                    path.clone(),
                    policies.clone(),
                    Arc::clone(&metrics),
                )
                .map_err(ServeError::PolicyFile)?,
            ),
            None => None,
        };
        let core = Core::with_clock(
            config.index,
            config.engine_block_size,
            policies.clone(),
            Arc::clone(&metrics),
            config.tokenizer_models_dir.as_deref().map_or_else(
                crate::tokenize::Tokenizers::none,
                |dir| {
                    crate::tokenize::Tokenizers::load_dir_cached(
                        dir,
                        config.tokenize_prefix_cache_bytes,
                        &metrics.tokenize_prefix,
                    )
                },
            ),
            clock,
        )
        .with_limits(config.limits);
        let templates_dir = match &config.templates_dir {
            Some(dir) => Some(
                crate::named::watch(
                    &crate::templates::TEMPLATES_DIR,
                    dir.clone(),
                    core.templates.clone(),
                    Arc::clone(&metrics),
                )
                .map_err(ServeError::TemplatesDir)?,
            ),
            None => None,
        };
        let pd_topology_file = match &config.pd_topology_file {
            Some(path) => Some(
                crate::named::watch(
                    &crate::pd::PD_TOPOLOGY_FILE,
                    path.clone(),
                    core.pd_topologies.clone(),
                    Arc::clone(&metrics),
                )
                .map_err(ServeError::PdTopologyFile)?,
            ),
            None => None,
        };
        let replication = crate::replicate::Replication::start(
            &core,
            config.bus.clone(),
            config.state.clone(),
            Arc::clone(&edge.replication),
        )
        .await?;
        let auth = match &config.control_auth {
            ControlAuth::TokenReview {
                allowed_sa,
                controller_audience,
                policy_audience,
            } => {
                let client = crate::auth::kube_client(config.kubeconfig.as_deref())
                    .await
                    .map_err(ServeError::Kube)?;
                let counters = &edge.control_auth;
                let make = |audience: &str, counter| {
                    crate::auth::Authenticator::new(client.clone(), audience, allowed_sa, counter)
                };
                Some(Arc::new(crate::http::ControlAuthenticators {
                    snapshot: make(controller_audience, counters.snapshot.clone()),
                    policy: make(policy_audience, counters.policy.clone()),
                    probe: make(controller_audience, counters.probe.clone()),
                    templates: make(policy_audience, counters.templates.clone()),
                    pd_topologies: make(policy_audience, counters.pd_topologies.clone()),
                }))
            }
            ControlAuth::Disabled | ControlAuth::LoopbackOnly => None,
        };
        let producers = producer_gate(config, &edge.producers).await?;
        Ok(Self {
            auth,
            producers,
            edge,
            core,
            sweep_interval: config.index.sweep_interval,
            metrics_interval: config.stream_metrics_interval,
            policy_file,
            templates_dir,
            pd_topology_file,
            control_auth: config.control_auth.clone(),
            grpc: bind("gRPC", "--grpc-bind-address", config.grpc_addr.0).await?,
            http: bind("HTTP", "--http-bind-address", config.http_addr.0).await?,
            control: bind("control", "--snapshot-bind-address", config.control_addr.0).await?,
            ready: Arc::new(AtomicBool::new(false)),
            tls,
            replication,
        })
    }

    /// Bound gRPC address (useful with port 0).
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr().unwrap_or_else(|_| unspecified())
    }

    /// Bound public HTTP address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http.local_addr().unwrap_or_else(|_| unspecified())
    }

    /// Bound control HTTP address.
    pub fn control_addr(&self) -> SocketAddr {
        self.control.local_addr().unwrap_or_else(|_| unspecified())
    }

    /// The policy store (for embedding and tests).
    pub fn policies(&self) -> PolicyStore {
        self.core.policies.clone()
    }

    /// The domain core (index, policies, metrics), for embedding and tests.
    pub fn core(&self) -> Core {
        self.core.clone()
    }

    /// The ingest edge for producers in this process (the embedded
    /// gateway's subscribers): what `ReportCacheState` and `PublishEvent`
    /// do, without the wire. Its open report streams end with UNAVAILABLE
    /// when `stop` fires, as the gRPC ones do at shutdown.
    pub fn local_ingest(&self, stop: CancellationToken) -> crate::local_ingest::LocalIngest {
        crate::local_ingest::LocalIngest::new(
            InferenceCacheService::new(self.core.clone(), stop, self.metrics_interval)
                .with_relay(self.replication.relay().cloned()),
        )
    }

    /// The server's metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.core.metrics)
    }

    /// Serves until `shutdown` is cancelled (returns Ok after draining) or a
    /// listener fails (stops the others, then returns that error).
    pub async fn serve(self, shutdown: CancellationToken) -> Result<(), ServeError> {
        let stop = shutdown.child_token();
        let mut replication = self.replication;
        replication.spawn();
        let state = HttpState {
            core: self.core.clone(),
            ready: Arc::clone(&self.ready),
            control_auth: self.control_auth.clone(),
            prober: crate::probe::Prober::default(),
            auth: self.auth,
            body_timeout: self.core.limits.http_body_timeout,
            ui: Arc::clone(&self.edge.ui),
            relay: replication.relay().cloned(),
            producers: Arc::clone(&self.edge.producers),
        };
        let limits = self.core.limits;
        let oversize = self.core.metrics.limits.counter("oversize");
        let grpc = crate::grpc::router(
            InferenceCacheService::new(self.core.clone(), stop.clone(), self.metrics_interval)
                .with_producers(self.producers)
                .with_relay(replication.relay().cloned()),
            limits.max_grpc_message_bytes,
            oversize,
        )
        .await?;

        let mut tasks: JoinSet<Result<(), ServeError>> = JoinSet::new();
        {
            let stop = stop.clone();
            match self.tls {
                Some(acceptor) => {
                    let incoming = crate::tls::incoming(
                        self.grpc,
                        acceptor,
                        limits.grpc_write_coalescing,
                        stop.clone(),
                    );
                    tasks.spawn(async move {
                        grpc.serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                            .await
                            .map_err(ServeError::from)
                    });
                }
                None => {
                    // Small unary responses must not wait for the peer's delayed
                    // ACK (Nagle): without NODELAY LookupRoute's p99 is ~40 ms.
                    let coalesce = limits.grpc_write_coalescing;
                    let incoming = TcpListenerStream::new(self.grpc).map(move |accepted| {
                        accepted.map(|tcp| {
                            if let Err(e) = tcp.set_nodelay(true) {
                                tracing::debug!(error = %e, "grpc_set_nodelay_failed");
                            }
                            CoalescedWrites::new(tcp, coalesce)
                        })
                    });
                    tasks.spawn(async move {
                        grpc.serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                            .await
                            .map_err(ServeError::from)
                    });
                }
            }
        }
        for (what, listener, router) in [
            ("public", self.http, public_router(state.clone())),
            ("control", self.control, control_router(state)),
        ] {
            let stop = stop.clone();
            tasks.spawn(async move {
                crate::http::serve::serve(listener, router, limits.http_header_timeout, stop)
                    .await
                    .map_err(|source| ServeError::Http { what, source })
            });
        }

        {
            let core = self.core.clone();
            let job = move || core.sweep();
            let run = every(self.sweep_interval, stop.clone(), "index_sweep_failed", job);
            tasks.spawn(async move {
                run.await;
                Ok(())
            });
        }
        if replication.relay().is_none() {
            // Producers gone silent (`--producer-silence`), checked every
            // second. Not in bus mode: the replicas share one stream, so a
            // silent producer is left to its own clears.
            let core = self.core.clone();
            let job = move || core.withdraw_silent();
            let run = every(
                Duration::from_secs(1),
                stop.clone(),
                "silence_check_failed",
                job,
            );
            tasks.spawn(async move {
                run.await;
                Ok(())
            });
        }
        spawn_watcher(&mut tasks, self.policy_file, &stop);
        spawn_watcher(&mut tasks, self.templates_dir, &stop);
        spawn_watcher(&mut tasks, self.pd_topology_file, &stop);

        self.ready.store(true, Ordering::Release);
        self.core.metrics.server_up.set(1);

        let mut failure = None;
        tokio::select! {
            () = shutdown.cancelled() => {}
            Some(joined) = tasks.join_next() => {
                failure = Some(task_error(joined));
            }
        }
        tracing::info!("graceful_shutdown_started");
        self.ready.store(false, Ordering::Release);
        stop.cancel();
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            while let Some(joined) = tasks.join_next().await {
                let err = task_error(joined);
                if failure.is_none() && shutdown.is_cancelled() {
                    if let Err(e) = err {
                        tracing::warn!(error = %e, "listener_stop_error");
                    }
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                timeout_s = DRAIN_TIMEOUT.as_secs(),
                "graceful_shutdown_timeout"
            );
            tasks.abort_all();
        }
        replication.finish().await;
        self.core.metrics.server_up.set(0);
        tracing::info!("graceful_shutdown_done");
        match failure {
            Some(Err(e)) => Err(e),
            // A listener that ends on its own without an error is still a
            // failure of `serve`: nothing should stop before the signal.
            _ => Ok(()),
        }
    }
}

/// Polls a configuration file or directory until `stop`.
fn spawn_watcher<R: Reloadable>(
    tasks: &mut JoinSet<Result<(), ServeError>>,
    watcher: Option<FileWatcher<R>>,
    stop: &CancellationToken,
) {
    if let Some(watcher) = watcher {
        let stop = stop.clone();
        tasks.spawn(async move {
            watcher.run(POLICY_FILE_POLL, stop).await;
            Ok(())
        });
    }
}

/// The producer/consumer gate, or `None` when nothing is checked (issue 19).
async fn producer_gate(
    config: &ServerConfig,
    metrics: &Arc<crate::producer::ProducerMetrics>,
) -> Result<Option<Arc<crate::producer::Gate>>, ServeError> {
    let p = &config.producer;
    if p.is_open() {
        return Ok(None);
    }
    p.validate(config.tls.as_ref())
        .map_err(|e| ServeError::Producer(e.to_string()))?;
    let client = if p.needs_kube() {
        Some(
            crate::auth::kube_client(config.kubeconfig.as_deref())
                .await
                .map_err(ServeError::Kube)?,
        )
    } else {
        None
    };
    crate::producer::Gate::new(p, client, Arc::clone(metrics))
        .map(|g| Some(Arc::new(g)))
        .map_err(ServeError::Producer)
}

/// Runs `job` on the blocking pool every `period` (the first time one period
/// after start) until `stop`: the TTL + cap sweep walks every shard and the
/// silence check may clear replicas, so neither may occupy a runtime worker.
async fn every(
    period: Duration,
    stop: CancellationToken,
    failed: &'static str,
    job: impl Fn() + Clone + Send + 'static,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        if let Err(e) = tokio::task::spawn_blocking(job.clone()).await {
            tracing::error!(error = %e, "{failed}");
        }
    }
}

fn task_error(
    joined: Result<Result<(), ServeError>, tokio::task::JoinError>,
) -> Result<(), ServeError> {
    match joined {
        Ok(r) => r,
        Err(e) => Err(ServeError::Http {
            what: "task",
            source: std::io::Error::other(e.to_string()),
        }),
    }
}

fn unspecified() -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], 0))
}

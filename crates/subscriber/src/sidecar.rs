//! The whole sidecar: one transport task per data-parallel rank, the event
//! loop ([`forward::run`], on a thread of its own: [`forward::thread`]), the
//! stats path and the HTTP endpoints, all owned by one [`CancellationToken`].

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::decode::DecodeOptions;
use crate::error::SidecarError;
use crate::forward::{self, ForwardConfig, Inputs};
use crate::frames::endpoint_for_rank;
use crate::http::{HttpState, router};
use crate::mapping::MappingConfig;
use crate::metrics::SidecarMetrics;
use crate::replica::ReplicaState;
use crate::stats::{self, StatsConfig};
use crate::transport::{self, TransportConfig, TransportStatus};

/// Everything the sidecar needs (the CLI's flags, validated).
#[derive(Debug, Clone)]
pub struct SidecarConfig {
    /// Rank 0's transport; each rank gets a copy with its rank set.
    pub transport: TransportConfig,
    /// Ranks served: `first_rank .. first_rank + ranks`.
    pub first_rank: u32,
    /// `--data-parallel-size` (min 1).
    pub ranks: u32,
    /// Mapping settings (per rank).
    pub mapping: MappingConfig,
    /// Decoder settings.
    pub decode: DecodeOptions,
    /// Forwarding settings.
    pub forward: ForwardConfig,
    /// The stats path; `None` turns it off.
    pub stats: Option<StatsConfig>,
    /// `--http-bind-address`; `None` serves no endpoints.
    pub http_bind: Option<String>,
}

/// A started sidecar.
#[derive(Debug)]
pub struct Running {
    /// Where `/metrics`, `/healthz`, `/readyz` are served.
    pub http_addr: Option<SocketAddr>,
    /// Shared metrics (also what `/metrics` shows).
    pub metrics: Arc<SidecarMetrics>,
    tasks: JoinSet<Result<(), SidecarError>>,
    cancel: CancellationToken,
}

/// Validates the endpoints, binds the HTTP listener and starts every task.
pub async fn start(
    config: SidecarConfig,
    cancel: CancellationToken,
) -> Result<Running, SidecarError> {
    let metrics = Arc::new(SidecarMetrics::new());
    let ranks = config.ranks.max(1);
    let mut transports = Vec::new();
    for rank in config.first_rank..config.first_rank.saturating_add(ranks) {
        let mut t = config.transport.clone();
        t.data_parallel_rank = rank;
        t.status = Arc::new(TransportStatus::default());
        // Fail at startup, not inside a task, when a rank's port overflows.
        for e in std::iter::once(&t.engine_endpoint).chain(t.replay_endpoint.as_ref()) {
            if endpoint_for_rank(e, rank).is_none() {
                return Err(transport::TransportError::Endpoint {
                    endpoint: e.clone(),
                    rank,
                }
                .into());
            }
        }
        transports.push(t);
    }
    let statuses: Vec<(u32, Arc<TransportStatus>)> = transports
        .iter()
        .map(|t| (t.data_parallel_rank, Arc::clone(&t.status)))
        .collect();

    let mut tasks = JoinSet::new();
    let mut http_addr = None;
    if let Some(addr) = &config.http_bind {
        let bind_err = |source| SidecarError::Bind {
            addr: addr.clone(),
            source,
        };
        // `:8090` (what the injected sidecar gets) is Go's "every interface".
        let parsed = inferencecache_control_api::listen::parse_listen_addr(addr)
            .map_err(|e| bind_err(e.into()))?;
        let listener = tokio::net::TcpListener::bind(parsed)
            .await
            .map_err(bind_err)?;
        http_addr = listener.local_addr().ok();
        let app = router(HttpState {
            metrics: Arc::clone(&metrics),
            transports: Arc::new(statuses.clone()),
        });
        let c = cancel.clone();
        tasks.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(c.cancelled_owned())
                .await
                .map_err(|e| SidecarError::Task(format!("http: {e}")))
        });
    }

    // Sized so a burst of batches waits here, not in ZMQ's high-water mark.
    let (dtx, drx) = mpsc::channel(1024);
    for t in transports {
        let (tx, c) = (dtx.clone(), cancel.clone());
        tasks.spawn(async move { transport::run(t, tx, c).await.map_err(SidecarError::from) });
    }
    drop(dtx);

    let (stx, srx) = mpsc::channel(1);
    if let Some(s) = config.stats.clone().filter(|s| !s.url.is_empty()) {
        let (m, c) = (Arc::clone(&metrics), cancel.clone());
        tasks.spawn(async move {
            stats::run(s, stx, m, c).await;
            Ok(())
        });
    }

    let inputs = Inputs {
        state: ReplicaState::new(config.mapping.clone(), config.decode),
        deliveries: drx,
        stats: srx,
        transports: statuses,
    };
    let fwd: ForwardConfig = config.forward.clone();
    if let Some(bus) = fwd.bus.clone() {
        let (m, c) = (Arc::clone(&metrics), cancel.clone());
        tasks.spawn(forward::bus::run(fwd, bus, inputs, m, c));
    } else {
        let done = forward::thread::spawn(fwd, inputs, Arc::clone(&metrics), cancel.clone())?;
        tasks.spawn(async move {
            done.await
                .map_err(|_| SidecarError::Task("forwarder thread panicked".into()))?
        });
    }

    Ok(Running {
        http_addr,
        metrics,
        tasks,
        cancel,
    })
}

impl Running {
    /// Waits until every task ended (after cancellation), or until one fails,
    /// which cancels the rest. Returns the first failure.
    pub async fn wait(mut self) -> Result<(), SidecarError> {
        let mut first = None;
        while let Some(r) = self.tasks.join_next().await {
            let r = r
                .map_err(|e| SidecarError::Task(e.to_string()))
                .and_then(|r| r);
            if let Err(e) = r {
                if first.is_none() {
                    tracing::error!(error = %e, "sidecar task failed; shutting down");
                    self.cancel.cancel();
                    first = Some(e);
                }
            } else if !self.cancel.is_cancelled() {
                // A task ending on its own (e.g. every transport gone) ends
                // the sidecar: it can no longer do its job.
                self.cancel.cancel();
            }
        }
        first.map_or(Ok(()), Err)
    }
}

//! The stats path (spec A.8): scrape the engine's Prometheus `/metrics`
//! every `--stats-interval`, turn it into [`EngineStats`] and hand them to
//! the forwarder, which sends them as `ReplicaStats`. A failed scrape is
//! counted and logged (WARN, then ERROR `load_signal_stale` at the third in a
//! row), never fatal, and never blocks the event path.
//!
//! **Liveness.** The metrics endpoint is the engine's other pulse: an engine
//! that hangs (or is stopped) keeps its event stream's TCP connection, so
//! the stream-down path never fires, but its scrapes time out. When scrapes
//! have failed for `--engine-metrics-grace` after having worked, the path
//! says [`StatsSignal::EngineDown`] and the forwarder withdraws the
//! replica's blocks (`ALL_CLEARED`) while it keeps tracking the engine's
//! events; the next good scrape brings them back (a full resync). An
//! endpoint that never answered withdraws nothing: that is a wrong
//! `--engine-metrics-url`, logged as `load_signal_stale`, not a dead engine.

pub mod exposition;
pub mod profile;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::metrics::SidecarMetrics;
pub use profile::{HitBaseline, Profile, ProfileConfig, ProfileError, compute};

/// Replica stats from one successful scrape (proto-free).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EngineStats {
    /// `usage × --engine-cache-size-bytes`.
    pub cache_memory_bytes: i64,
    /// Prefix-cache hit rate in [0, 1].
    pub hit_rate: f64,
    /// `(running + waiting) / ceiling`, in [0, 1].
    pub pressure: f64,
    /// `--client-version`, else detected from the engine's metrics.
    pub client_version: String,
    /// Cumulative tier-2 hit tokens.
    pub t2_hit_tokens: i64,
    /// Cumulative tier-2 query tokens.
    pub t2_query_tokens: i64,
    /// What the engine is doing now (sent as `ReplicaStats.load`).
    pub load: EngineLoad,
}

/// The engine's load from one scrape: the ranking's queued-work input.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests running.
    pub running: u32,
    /// Requests waiting for admission.
    pub waiting: u32,
    /// Fraction of the KV cache in use, [0, 1] (the `--cache-tier` gauge).
    pub kv_usage: f64,
    /// KV cache capacity in tokens; 0 = the engine does not say.
    pub kv_capacity_tokens: u64,
}

/// `--cache-tier`: which usage gauge feeds `cache_memory_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheTierGauge {
    /// `kv_cache_usage_perc`, else the larger of the GPU/CPU gauges.
    #[default]
    Auto,
    /// Only `kv_cache_usage_perc` (SGLang: `token_usage`).
    Kv,
    /// Only the legacy GPU gauge.
    Gpu,
    /// Only the legacy CPU gauge.
    Cpu,
}

impl std::str::FromStr for CacheTierGauge {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "kv" => Ok(Self::Kv),
            "gpu" => Ok(Self::Gpu),
            "cpu" => Ok(Self::Cpu),
            other => Err(format!("{other:?} is not one of auto, kv, gpu, cpu")),
        }
    }
}

/// What the stats path tells the event loop.
#[derive(Debug, Clone, PartialEq)]
pub enum StatsSignal {
    /// A good scrape (after [`StatsSignal::EngineDown`]: the engine is back).
    Sample(EngineStats),
    /// Scrapes have failed past the grace: withdraw the replica's blocks.
    EngineDown,
}

/// Default `--engine-metrics-grace`: three missed 1 s scrapes.
pub const DEFAULT_METRICS_GRACE: Duration = Duration::from_secs(3);

/// Stats-path settings.
#[derive(Debug, Clone)]
pub struct StatsConfig {
    /// `--engine-metrics-url`; empty disables the stats path.
    pub url: String,
    /// `--stats-interval`.
    pub interval: Duration,
    /// HTTP timeout per scrape.
    pub timeout: Duration,
    /// What to compute.
    pub profile: ProfileConfig,
    /// `--client-version`; overrides what the metrics say.
    pub client_version: Option<String>,
    /// `--engine-metrics-grace`: how long scrapes may fail (after one
    /// worked) before the replica is withdrawn; `None` never withdraws.
    pub down_grace: Option<Duration>,
}

/// Consecutive failures after which the load signal is reported stale.
const STALE_AFTER: u32 = 3;

/// Scrapes until `cancel`, sending each good result on `out` (a full
/// channel drops the sample: the next one is fresher anyway; the signals
/// that change liveness wait for room).
pub async fn run(
    config: StatsConfig,
    out: mpsc::Sender<StatsSignal>,
    metrics: Arc<SidecarMetrics>,
    cancel: CancellationToken,
) {
    let client = match reqwest::Client::builder().timeout(config.timeout).build() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "engine metrics client cannot be built; stats path off");
            // Returning early would look like a task failure to the sidecar.
            cancel.cancelled().await;
            return;
        }
    };
    let mut baseline = HitBaseline::default();
    let mut failures = 0u32;
    let mut delivered = false;
    // Since when scrapes fail (None while they work), and whether the
    // engine was declared down.
    let mut failing_since: Option<tokio::time::Instant> = None;
    let mut down = false;
    // The first tick is one interval after start, like the reference: the
    // engine is often still loading its model at startup.
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + config.interval,
        config.interval,
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        // A failing run counts from the start of its first failed scrape
        // (a hung engine's scrape takes the whole timeout).
        let started = tokio::time::Instant::now();
        match scrape(&client, &config, &mut baseline).await {
            Ok(mut stats) => {
                metrics.scrapes.get_or_create(&[("result", "ok")]).inc();
                if let Some(v) = &config.client_version {
                    stats.client_version = v.clone();
                }
                if failures >= STALE_AFTER {
                    tracing::info!(
                        event = "load_signal_recovered",
                        failures,
                        "engine metrics scrape recovered"
                    );
                }
                failures = 0;
                delivered = true;
                failing_since = None;
                if down {
                    down = false;
                    metrics.set_engine_metrics_down(false);
                    tracing::info!(
                        event = "engine_back",
                        "engine metrics answer again: the replica's blocks are re-reported"
                    );
                    // Recovery must not be dropped: wait for room.
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = out.send(StatsSignal::Sample(stats)) => {}
                    }
                } else {
                    let _ = out.try_send(StatsSignal::Sample(stats));
                }
            }
            Err(reason) => {
                metrics.scrapes.get_or_create(&[("result", "error")]).inc();
                failures += 1;
                let since = *failing_since.get_or_insert(started);
                if let Some(grace) = config.down_grace
                    && delivered
                    && !down
                    && since.elapsed() >= grace
                {
                    down = true;
                    metrics.set_engine_metrics_down(true);
                    metrics.metrics_withdrawals.inc();
                    tracing::warn!(
                        event = "engine_metrics_down",
                        url = config.url.as_str(),
                        grace_ms = grace.as_millis() as u64,
                        %reason,
                        "engine metrics unreachable past the grace: the replica's blocks are withdrawn (ALL_CLEARED) until a scrape works again"
                    );
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = out.send(StatsSignal::EngineDown) => {}
                    }
                }
                let url = config.url.as_str();
                if failures < STALE_AFTER {
                    tracing::warn!(url, failures, %reason, "engine metrics scrape failed");
                } else if failures == STALE_AFTER {
                    tracing::error!(
                        event = "load_signal_stale",
                        url,
                        failures,
                        ever_delivered = delivered,
                        %reason,
                        "engine metrics unavailable: the server's load signal for this replica is stale"
                    );
                } else {
                    tracing::debug!(url, failures, %reason, "engine metrics scrape failed");
                }
            }
        }
    }
}

async fn scrape(
    client: &reqwest::Client,
    config: &StatsConfig,
    baseline: &mut HitBaseline,
) -> Result<EngineStats, String> {
    let resp = client
        .get(&config.url)
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    let body = resp.text().await.map_err(|e| e.to_string())?;
    let (samples, _bad) = exposition::parse(&body);
    compute(&samples, &config.profile, baseline).map_err(|e| e.to_string())
}

//! Simulation settings.

use crate::error::SimError;
use crate::policy::PolicyKind;
use crate::service_model::ServiceModel;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What the gateway sends to LookupRoute.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LookupInput {
    /// `token_ids`: the server fingerprints the prompt (its
    /// `--engine-block-size` must equal the trace's block size).
    TokenIds,
    /// `block_hashes` + `block_token_counts`, fingerprinted by the gateway.
    Chain,
}

/// Everything that shapes a run (recorded in the JSON output).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// Simulated engine replicas.
    pub replicas: usize,
    /// KV-cache capacity of each replica, in blocks.
    pub cache_blocks: usize,
    /// Tokens per block (the trace's block size).
    pub block_size: usize,
    /// Seed of the token expansion (and so of every fingerprint).
    pub seed: u64,
    /// Trace time is divided by this (2 = twice the arrival rate).
    pub speedup: f64,
    /// Queue depth at which a replica reports pressure 1.0; also the
    /// oracle's load bound.
    pub max_queue: usize,
    /// LookupRoute input form.
    pub input: LookupInput,
    /// Service-time constants.
    pub service: ServiceModel,
    /// A running server's gRPC endpoint instead of an in-process one.
    pub server: Option<String>,
    /// Time buckets of the over-time series and the plot.
    pub buckets: usize,
    /// Client deadline of each lookup, ms. Generous on purpose: a fail-open
    /// timeout would make a run depend on machine speed.
    pub lookup_deadline_ms: u64,
    /// How long a replica's KV events take to reach the server after its
    /// prefill finishes (the sidecar's batching window), ms.
    #[serde(default = "default_event_delay_ms")]
    pub event_delay_ms: u64,
    /// How often replicas report stats (pressure, hit rate): the sidecar's
    /// scrape interval, ms.
    #[serde(default = "default_stats_interval_ms")]
    pub stats_interval_ms: u64,
}

fn default_event_delay_ms() -> u64 {
    100
}

fn default_stats_interval_ms() -> u64 {
    10_000
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            replicas: 8,
            cache_blocks: 1024,
            block_size: 512,
            seed: 42,
            speedup: 1.0,
            max_queue: 4,
            input: LookupInput::TokenIds,
            service: ServiceModel::default(),
            server: None,
            buckets: 60,
            lookup_deadline_ms: 5_000,
            event_delay_ms: default_event_delay_ms(),
            stats_interval_ms: default_stats_interval_ms(),
        }
    }
}

impl Settings {
    /// Refuses settings the simulation cannot run with.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |m: &str| Err(SimError::Config(m.to_owned()));
        if self.replicas == 0 {
            return bad("--replicas must be at least 1");
        }
        if self.cache_blocks == 0 {
            return bad("--cache-blocks must be at least 1");
        }
        if self.block_size == 0 || i32::try_from(self.block_size).is_err() {
            return bad("--block-size must be between 1 and 2^31-1");
        }
        if !(self.speedup.is_finite() && self.speedup > 0.0) {
            return bad("--speedup must be a positive number");
        }
        if self.max_queue == 0 {
            return bad("--max-queue must be at least 1");
        }
        if self.stats_interval_ms == 0 {
            return bad("--stats-interval must be positive");
        }
        let s = &self.service;
        if [
            s.prefill_overhead_us,
            s.prefill_us_per_token,
            s.decode_us_per_token,
        ]
        .iter()
        .any(|v| !v.is_finite() || *v < 0.0)
        {
            return bad("service-time constants must be finite and non-negative");
        }
        Ok(())
    }

    /// The lookup deadline.
    pub fn lookup_deadline(&self) -> Duration {
        Duration::from_millis(self.lookup_deadline_ms.max(1))
    }
}

/// A run: settings plus the policies to compare and whether to draw a
/// progress bar.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// Shared settings.
    pub settings: Settings,
    /// Policies, run one after another on fresh state.
    pub policies: Vec<PolicyKind>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            settings: Settings::default(),
            policies: PolicyKind::DEFAULT.to_vec(),
            progress: false,
        }
    }
}

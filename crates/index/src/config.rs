//! Constructor parameters.

use crate::clock::{Clock, SystemClock};
use crate::observer::IndexObserver;
use crate::policy::{NoPolicy, PolicyResolver};
use std::sync::Arc;
use std::time::Duration;

/// Default tenant TTL: 30 minutes.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30 * 60);
/// Default sweep interval (the server's timer): 1 minute.
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// Default global cap in (prefix, replica) entries.
pub const DEFAULT_MAX_ENTRIES: i64 = 1_000_000;
/// Default limit on distinct live replica ids.
pub const DEFAULT_MAX_REPLICAS: usize = 65_536;
/// Cap victims gathered per full scan.
pub const DEFAULT_CAP_RESERVE: usize = 4096;

/// Ranking knobs (§2.1). The defaults are the production values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankingConfig {
    /// Pressure weight (1.0).
    pub pressure_weight: f32,
    /// SLO TTFT below which a request is "tight" (200 ms, strict).
    pub slo_tight_ttft_ms: i32,
    /// SLO freshness bias for tight requests (1.0).
    pub slo_tight_bias: f32,
    /// TENANT_HOT minimum hit rate (0.1).
    pub tenant_hot_min_hit_rate: f32,
    /// TENANT_HOT stats window (5 min); zero disables TENANT_HOT.
    pub tenant_hot_max_age: Duration,
}

impl Default for RankingConfig {
    fn default() -> Self {
        Self {
            pressure_weight: 1.0,
            slo_tight_ttft_ms: 200,
            slo_tight_bias: 1.0,
            tenant_hot_min_hit_rate: 0.1,
            tenant_hot_max_age: Duration::from_secs(5 * 60),
        }
    }
}

/// Index constructor parameters (builder style).
#[derive(Clone)]
pub struct IndexConfig {
    /// Global cap in (prefix, replica) entries, excluding reserved tenants;
    /// `<= 0` = unbounded.
    pub max_entries: i64,
    /// TTL for tenants without a policy TTL; zero is clamped to [`DEFAULT_TTL`].
    pub default_ttl: Duration,
    /// Reserved tenants (hidden from cap, aggregates, snapshot and gauge).
    pub reserved_tenants: Vec<String>,
    /// Ranking knobs.
    pub ranking: RankingConfig,
    /// Time source.
    pub clock: Arc<dyn Clock>,
    /// Policy resolver.
    pub policy: Arc<dyn PolicyResolver>,
    /// Optional change observer.
    pub observer: Option<Arc<dyn IndexObserver>>,
    /// Cap victims gathered per full scan (see the `cap` module docs); tests
    /// lower it to exercise reserve refills. Clamped to at least 1.
    pub cap_reserve: usize,
    /// Limit on distinct live replica ids (0 = unbounded): an update from a
    /// new replica past it is refused whole
    /// ([`crate::IngestOutcome::refused_replica_limit`]). Replicas holding
    /// nothing and without stats are released by the sweep.
    pub max_replicas: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            max_entries: DEFAULT_MAX_ENTRIES,
            default_ttl: DEFAULT_TTL,
            reserved_tenants: Vec::new(),
            ranking: RankingConfig::default(),
            clock: Arc::new(SystemClock),
            policy: Arc::new(NoPolicy),
            observer: None,
            cap_reserve: DEFAULT_CAP_RESERVE,
            max_replicas: DEFAULT_MAX_REPLICAS,
        }
    }
}

impl std::fmt::Debug for IndexConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexConfig")
            .field("max_entries", &self.max_entries)
            .field("default_ttl", &self.default_ttl)
            .field("reserved_tenants", &self.reserved_tenants)
            .field("ranking", &self.ranking)
            .field("observer", &self.observer.is_some())
            .field("max_replicas", &self.max_replicas)
            .finish_non_exhaustive()
    }
}

impl IndexConfig {
    /// Defaults: cap 1,000,000, TTL 30 min, no reserved tenants, system clock, no policy.
    pub fn new() -> Self {
        Self::default()
    }

    /// Set the global cap (`<= 0` = unbounded).
    pub fn max_entries(mut self, n: i64) -> Self {
        self.max_entries = n;
        self
    }

    /// Set the default TTL (zero → 30 min).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Set the reserved tenants.
    pub fn reserved_tenants<I, S>(mut self, tenants: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.reserved_tenants = tenants.into_iter().map(Into::into).collect();
        self
    }

    /// Set ranking knobs.
    pub fn ranking(mut self, ranking: RankingConfig) -> Self {
        self.ranking = ranking;
        self
    }

    /// Set the clock.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Set the policy resolver.
    pub fn policy(mut self, policy: Arc<dyn PolicyResolver>) -> Self {
        self.policy = policy;
        self
    }

    /// Install an observer.
    pub fn observer(mut self, observer: Arc<dyn IndexObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Set the limit on distinct live replica ids (0 = unbounded).
    pub fn max_replicas(mut self, n: usize) -> Self {
        self.max_replicas = n;
        self
    }

    /// Set the cap victim reserve size.
    pub fn cap_reserve(mut self, n: usize) -> Self {
        self.cap_reserve = n;
        self
    }

    /// Build the index.
    pub fn build(self) -> crate::Index {
        crate::Index::new(self)
    }
}

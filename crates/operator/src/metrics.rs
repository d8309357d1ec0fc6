//! The operator's own Prometheus metrics (`/metrics` on the metrics
//! listener). Names carry the `inferencecache_operator_` prefix so they sit
//! next to the server's in one scrape config.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// `target` (policy, templates, pd-topologies) and `result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PushLabels {
    /// What was pushed.
    pub target: String,
    /// ok, error, rejected (4xx), unsupported (404).
    pub result: String,
}

/// `kind` and `reason` of an object left out of a push.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkippedLabels {
    /// CachePolicy or CacheTenant.
    pub kind: String,
    /// duplicate or invalid.
    pub reason: String,
}

/// A single `result` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// Outcome.
    pub result: String,
}

/// `webhook` and `result` of an admission review.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabels {
    /// cachepolicy, cachetenant, pod.
    pub webhook: String,
    /// allowed, denied, patched, error.
    pub result: String,
}

/// Every operator metric.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    /// Pushes by target and outcome.
    pub pushes: Family<PushLabels, Counter>,
    /// Objects left out of a policy push.
    pub push_skipped: Family<SkippedLabels, Counter>,
    /// Unix seconds of the last successful policy push.
    pub last_policy_push: Gauge<f64, AtomicU64>,
    /// `/snapshot` polls by outcome.
    pub snapshot_polls: Family<ResultLabel, Counter>,
    /// Status writes by outcome (changed, unchanged, error).
    pub status_writes: Family<ResultLabel, Counter>,
    /// 1 while this replica holds the leader Lease.
    pub leader: Gauge,
    /// Admission reviews served.
    pub webhook_reviews: Family<WebhookLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let pushes = Family::<PushLabels, Counter>::default();
        let push_skipped = Family::<SkippedLabels, Counter>::default();
        let last_policy_push = Gauge::<f64, AtomicU64>::default();
        let snapshot_polls = Family::<ResultLabel, Counter>::default();
        let status_writes = Family::<ResultLabel, Counter>::default();
        let leader = Gauge::default();
        let webhook_reviews = Family::<WebhookLabels, Counter>::default();
        registry.register(
            "inferencecache_operator_pushes",
            "Pushes to the server by target (policy, templates, pd-topologies) and result",
            pushes.clone(),
        );
        registry.register(
            "inferencecache_operator_push_skipped",
            "CachePolicy/CacheTenant objects left out of a policy push, by kind and reason",
            push_skipped.clone(),
        );
        registry.register(
            "inferencecache_operator_last_policy_push_timestamp_seconds",
            "Unix time of the last successful /policy push",
            last_policy_push.clone(),
        );
        registry.register(
            "inferencecache_operator_snapshot_polls",
            "Polls of the server's /snapshot by result",
            snapshot_polls.clone(),
        );
        registry.register(
            "inferencecache_operator_status_writes",
            "CacheIndex/CacheTenant/CacheBackend status writes by result",
            status_writes.clone(),
        );
        registry.register(
            "inferencecache_operator_leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        registry.register(
            "inferencecache_operator_webhook_reviews",
            "Admission reviews by webhook and result",
            webhook_reviews.clone(),
        );
        Self {
            registry: Arc::new(registry),
            pushes,
            push_skipped,
            last_policy_push,
            snapshot_polls,
            status_writes,
            leader,
            webhook_reviews,
        }
    }

    /// Counts a push outcome.
    pub fn push(&self, target: &str, result: &str) {
        self.pushes
            .get_or_create(&PushLabels {
                target: target.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts a status write outcome.
    pub fn status_write(&self, result: &str) {
        self.status_writes
            .get_or_create(&ResultLabel {
                result: result.into(),
            })
            .inc();
    }

    /// Counts an admission review.
    pub fn review(&self, webhook: &str, result: &str) {
        self.webhook_reviews
            .get_or_create(&WebhookLabels {
                webhook: webhook.into(),
                result: result.into(),
            })
            .inc();
    }

    /// The text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

//! The server's Prometheus metrics (`server.md` §8): names, types, labels,
//! buckets and help strings are part of the contract.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Buckets of `inferencecache_lookup_route_latency_seconds`.
pub const LOOKUP_LATENCY_BUCKETS: [f64; 10] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
];

/// Labels of `inferencecache_lookup_route_calls_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LookupLabels {
    /// Raw request model_id (may be empty).
    pub model: String,
    /// The response's reason code.
    pub reason_code: String,
    /// "true" when replica_scores is non-empty.
    pub hint_used: String,
}

/// Labels of `inferencecache_policy_updates_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyUpdateLabels {
    /// "http" (a /policy push) or "file" (--policy-file).
    pub source: String,
    /// "applied" or "rejected".
    pub result: String,
}

/// Label of the per-model series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabel {
    /// Raw request model_id (may be empty).
    pub model: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(LOOKUP_LATENCY_BUCKETS)
}

/// Every metric the server exposes, registered in one registry.
pub struct Metrics {
    registry: Registry,
    /// 1 while serving, 0 after.
    pub server_up: Gauge,
    /// 1 when gRPC terminates TLS.
    pub grpc_tls_enabled: Gauge,
    /// One per LookupRoute call.
    pub lookup_route_calls: Family<LookupLabels, Counter>,
    /// Handler latency per model.
    pub lookup_route_latency: Family<ModelLabel, Histogram, fn() -> Histogram>,
    /// Version of the policy set in force (0 = defaults, nothing pushed).
    pub policy_version: Gauge,
    /// Policy pushes and file reloads by source and result.
    pub policy_updates: Family<PolicyUpdateLabels, Counter>,
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
        let server_up = Gauge::default();
        let grpc_tls_enabled = Gauge::default();
        let lookup_route_calls = Family::<LookupLabels, Counter>::default();
        let lookup_route_latency =
            Family::<ModelLabel, Histogram, fn() -> Histogram>::new_with_constructor(
                latency_histogram,
            );
        // prometheus-client appends the final period itself.
        registry.register(
            "inferencecache_server_up",
            "1 if the cache policy server is serving requests, 0 otherwise",
            server_up.clone(),
        );
        registry.register(
            "inferencecache_server_grpc_tls_enabled",
            "1 if the gRPC server is terminating TLS, 0 if serving plaintext",
            grpc_tls_enabled.clone(),
        );
        registry.register(
            "inferencecache_lookup_route_calls",
            "LookupRoute calls by model, reason_code, and whether a hint was returned",
            lookup_route_calls.clone(),
        );
        registry.register(
            "inferencecache_lookup_route_latency_seconds",
            "Server-side LookupRoute latency, per model",
            lookup_route_latency.clone(),
        );
        let policy_version = Gauge::default();
        let policy_updates = Family::<PolicyUpdateLabels, Counter>::default();
        registry.register(
            "inferencecache_policy_version",
            "Version of the policy set in force; 0 until the first push or policy file",
            policy_version.clone(),
        );
        registry.register(
            "inferencecache_policy_updates",
            "Policy pushes (/policy) and policy-file reloads, by source (http|file) and result (applied|rejected)",
            policy_updates.clone(),
        );
        Self {
            registry,
            policy_version,
            policy_updates,
            server_up,
            grpc_tls_enabled,
            lookup_route_calls,
            lookup_route_latency,
        }
    }

    /// Records one LookupRoute call.
    pub fn observe_lookup(&self, model: &str, reason_code: &str, hint_used: bool, seconds: f64) {
        self.lookup_route_calls
            .get_or_create(&LookupLabels {
                model: model.to_owned(),
                reason_code: reason_code.to_owned(),
                hint_used: if hint_used { "true" } else { "false" }.to_owned(),
            })
            .inc();
        self.lookup_route_latency
            .get_or_create(&ModelLabel {
                model: model.to_owned(),
            })
            .observe(seconds);
    }

    /// Records an applied policy set.
    pub fn policy_applied(&self, source: &str, version: i64) {
        self.policy_version.set(version);
        self.policy_update(source, "applied");
    }

    /// Records a refused policy document.
    pub fn policy_rejected(&self, source: &str) {
        self.policy_update(source, "rejected");
    }

    fn policy_update(&self, source: &str, result: &str) {
        self.policy_updates
            .get_or_create(&PolicyUpdateLabels {
                source: source.to_owned(),
                result: result.to_owned(),
            })
            .inc();
    }

    /// OpenMetrics text exposition (ends with `# EOF`).
    pub fn encode_openmetrics(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would only come
        // from a metric's own encode, which ours never return.
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Prometheus classic text exposition, version 0.0.4.
    pub fn encode_text(&self) -> String {
        crate::exposition::openmetrics_to_text(&self.encode_openmetrics())
    }
}

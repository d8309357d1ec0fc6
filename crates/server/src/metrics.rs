//! The server's Prometheus metrics (`server.md` §8): names, types, labels,
//! buckets and help strings are part of the contract.

use inferencecache_proto::Reason;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

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

pub use crate::store_metrics::PolicyUpdateLabels;

/// Labels of `inferencecache_tenant_evictions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantEvictionLabels {
    /// Tenant whose quota forced the eviction.
    pub tenant_id: String,
    /// Always `over_entries`.
    pub reason: String,
}

/// Labels of `inferencecache_index_evictions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IndexEvictionLabels {
    /// `lru` or `lfu`.
    pub algorithm: String,
    /// `cap` or `ttl`.
    pub reason: String,
}

/// A single free-form `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// Why.
    pub reason: String,
}

/// A single `type` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabel {
    /// Event type name.
    pub r#type: String,
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

/// LookupRoute counters summed over models.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LookupTotals {
    /// Calls by reason code (codes never answered are absent).
    pub by_reason: std::collections::BTreeMap<&'static str, u64>,
    /// Sum of handler latencies, seconds.
    pub latency_sum: f64,
    /// Observations behind `latency_sum`.
    pub latency_count: u64,
}

/// One model's LookupRoute series: a counter per (reason, hint_used),
/// created on first use, and the latency histogram.
struct ModelSeries {
    calls: [OnceLock<Counter>; Reason::ALL.len() * 2],
    latency: Histogram,
}

/// The server-wide metrics (LookupRoute, ingest, index, policy) and the
/// domain's own families, registered in one registry that also holds the
/// edge subsystems' families (producer gate, bus, status page): those
/// register themselves through [`Metrics::with_subsystems`] and keep their
/// handles, so this module depends on no edge module.
pub struct Metrics {
    registry: Registry,
    /// Resource limits: refusals, shed lookups, replica and tokenizer gauges.
    pub limits: crate::limits::LimitMetrics,
    /// The prompt_text prefix caches.
    pub tokenize_prefix: crate::tokenize::prefix::PrefixCacheMetrics,
    lookup_series: RwLock<HashMap<String, Arc<ModelSeries>>>,
    /// `lookup_route_latency` alone, for [`Metrics::lookup_totals`].
    latency_view: Registry,
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
    /// The index's size gauges, read at scrape time.
    pub index_gauges: Arc<crate::index_gauges::IndexGauges>,
    /// Quota evictions (distinct prefixes).
    pub tenant_evictions: Family<TenantEvictionLabels, Counter>,
    /// Cap and TTL evictions (entries).
    pub index_evictions: Family<IndexEvictionLabels, Counter>,
    /// CacheStateUpdate messages ingested.
    pub ingest_updates: Counter,
    /// (prefix, replica) entries written by ingest (new or refreshed).
    pub ingest_entries: Counter,
    /// Prefix entries dropped at ingest, by reason.
    pub ingest_dropped: Family<ReasonLabel, Counter>,
    /// CacheEvents received, by type.
    pub events: Family<TypeLabel, Counter>,
    /// The configured global cap (0 = unbounded).
    pub index_max_entries: Gauge,
    /// Open StreamCacheEvents / StreamMetrics streams.
    pub stream_subscribers: Family<TypeLabel, Gauge>,
    /// Streams ended because the subscriber fell behind.
    pub stream_lagged: Family<TypeLabel, Counter>,
    /// Estimated-TTFT ranking and approximate mode.
    pub routing: crate::routing_metrics::RoutingMetrics,
    /// Template and PD-topology stores, RenderTemplate and LookupPDRoute.
    pub stores: crate::store_metrics::StoreMetrics,
    /// Engine block sizes learned from producers.
    pub block_size: crate::block_size::BlockSizeMetrics,
    /// Replicas withdrawn because their producer went silent.
    pub liveness: crate::liveness::LivenessMetrics,
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
    /// Creates and registers the server-wide metrics (no edge subsystem:
    /// tests and embedders that serve no edge use this).
    pub fn new() -> Self {
        Self::with_subsystems(|_| ()).0
    }

    /// Creates and registers the server-wide metrics, then lets `subsystems`
    /// register their own families in the same registry (one `/metrics`,
    /// one StreamMetrics) and returns what it built with them.
    pub fn with_subsystems<T>(subsystems: impl FnOnce(&mut Registry) -> T) -> (Self, T) {
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
        // The same histograms (shared handles) in a registry of their own,
        // so the status page reads their sums without encoding every family.
        let mut latency_view = Registry::default();
        latency_view.register(
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
        let tenant_evictions = Family::<TenantEvictionLabels, Counter>::default();
        let index_evictions = Family::<IndexEvictionLabels, Counter>::default();
        let ingest_updates = Counter::default();
        let ingest_entries = Counter::default();
        let ingest_dropped = Family::<ReasonLabel, Counter>::default();
        let events = Family::<TypeLabel, Counter>::default();
        let index_max_entries = Gauge::default();
        let stream_subscribers = Family::<TypeLabel, Gauge>::default();
        let stream_lagged = Family::<TypeLabel, Counter>::default();
        registry.register(
            "inferencecache_tenant_evictions",
            "Index prefixes evicted to enforce a CacheTenant quota, by tenant and reason",
            tenant_evictions.clone(),
        );
        registry.register(
            "inferencecache_index_evictions",
            "Index entries evicted by the cap or TTL sweep, by algorithm (lru|lfu) and reason (cap|ttl)",
            index_evictions.clone(),
        );
        registry.register(
            "inferencecache_ingest_updates",
            "CacheStateUpdate messages ingested",
            ingest_updates.clone(),
        );
        registry.register(
            "inferencecache_ingest_entries",
            "Replica x prefix entries written by ingest (new or refreshed)",
            ingest_entries.clone(),
        );
        registry.register(
            "inferencecache_ingest_dropped",
            "Prefix entries dropped at ingest, by reason (no_hash_scheme|mismatched_chain|empty_hash|shard_full)",
            ingest_dropped.clone(),
        );
        registry.register(
            "inferencecache_events",
            "CacheEvents received through PublishEvent, by type",
            events.clone(),
        );
        registry.register(
            "inferencecache_index_max_entries",
            "Configured global cap on replica x prefix entries (0 = unbounded)",
            index_max_entries.clone(),
        );
        registry.register(
            "inferencecache_stream_subscribers",
            "Open observer streams, by type (events|metrics)",
            stream_subscribers.clone(),
        );
        registry.register(
            "inferencecache_stream_lagged",
            "Observer streams disconnected because the subscriber fell behind, by type",
            stream_lagged.clone(),
        );
        let routing = crate::routing_metrics::RoutingMetrics::register(&mut registry);
        let stores = crate::store_metrics::StoreMetrics::register(&mut registry);
        let limits = crate::limits::LimitMetrics::default();
        limits.register(&mut registry);
        let tokenize_prefix = crate::tokenize::prefix::PrefixCacheMetrics::default();
        tokenize_prefix.register(&mut registry);
        let edge = subsystems(&mut registry);
        let block_size = crate::block_size::BlockSizeMetrics::register(&mut registry);
        let liveness = crate::liveness::LivenessMetrics::register(&mut registry);
        let index_gauges = Arc::new(crate::index_gauges::IndexGauges::default());
        registry.register_collector(Box::new(Arc::clone(&index_gauges)));
        let metrics = Self {
            routing,
            stores,
            block_size,
            liveness,
            registry,
            latency_view,
            index_gauges,
            limits,
            tokenize_prefix,
            lookup_series: RwLock::default(),
            tenant_evictions,
            index_evictions,
            ingest_updates,
            ingest_entries,
            ingest_dropped,
            events,
            index_max_entries,
            stream_subscribers,
            stream_lagged,
            policy_version,
            policy_updates,
            server_up,
            grpc_tls_enabled,
            lookup_route_calls,
            lookup_route_latency,
        };
        (metrics, edge)
    }

    /// Records one LookupRoute call.
    pub fn observe_lookup(&self, model: &str, reason: Reason, hint_used: bool, seconds: f64) {
        let series = self.model_series(model);
        series.calls[reason as usize * 2 + usize::from(hint_used)]
            .get_or_init(|| self.lookup_counter(model, reason, hint_used))
            .inc();
        series.latency.observe(seconds);
    }

    fn lookup_counter(&self, model: &str, reason: Reason, hint_used: bool) -> Counter {
        self.lookup_route_calls
            .get_or_create(&LookupLabels {
                model: model.to_owned(),
                reason_code: reason.as_str().to_owned(),
                hint_used: if hint_used { "true" } else { "false" }.to_owned(),
            })
            .clone()
    }

    /// The model's series handles, resolved once: the hot path then takes a
    /// read lock and a map probe by `&str`, with no label allocation.
    fn model_series(&self, model: &str) -> Arc<ModelSeries> {
        let cached = match self.lookup_series.read() {
            Ok(m) => m.get(model).cloned(),
            Err(p) => p.into_inner().get(model).cloned(),
        };
        if let Some(s) = cached {
            return s;
        }
        let series = Arc::new(ModelSeries {
            calls: std::array::from_fn(|_| OnceLock::new()),
            latency: self
                .lookup_route_latency
                .get_or_create(&ModelLabel {
                    model: model.to_owned(),
                })
                .clone(),
        });
        let mut map = match self.lookup_series.write() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        };
        Arc::clone(map.entry(model.to_owned()).or_insert(series))
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

    /// Adds to a labelled counter in one call.
    pub fn add_index_evictions(&self, algorithm: &str, reason: &str, n: u64) {
        if n > 0 {
            self.index_evictions
                .get_or_create(&IndexEvictionLabels {
                    algorithm: algorithm.to_owned(),
                    reason: reason.to_owned(),
                })
                .inc_by(n);
        }
    }

    /// Adds quota evictions for a tenant.
    pub fn add_tenant_evictions(&self, tenant: &str, n: u64) {
        if n > 0 {
            self.tenant_evictions
                .get_or_create(&TenantEvictionLabels {
                    tenant_id: tenant.to_owned(),
                    reason: "over_entries".to_owned(),
                })
                .inc_by(n);
        }
    }

    /// Adds dropped ingest entries for a reason.
    pub fn add_ingest_dropped(&self, reason: &str, n: u64) {
        if n > 0 {
            self.ingest_dropped
                .get_or_create(&ReasonLabel {
                    reason: reason.to_owned(),
                })
                .inc_by(n);
        }
    }

    /// Type-labelled series handle (events, streams).
    pub fn type_label(kind: &str) -> TypeLabel {
        TypeLabel {
            r#type: kind.to_owned(),
        }
    }

    /// LookupRoute calls by reason and the latency sum/count, over every
    /// model, read from the typed series (the status page's counters).
    pub fn lookup_totals(&self) -> LookupTotals {
        let mut out = LookupTotals::default();
        {
            let series = match self.lookup_series.read() {
                Ok(m) => m,
                Err(p) => p.into_inner(),
            };
            for s in series.values() {
                for (i, call) in s.calls.iter().enumerate() {
                    if let Some(c) = call.get() {
                        let reason = Reason::ALL[i / 2].as_str();
                        *out.by_reason.entry(reason).or_default() += c.get();
                    }
                }
            }
        }
        // prometheus-client reads a histogram's sum and count back only
        // through an encoder; the typed families are that encoder's output.
        let latency = prometheus_client::encoding::prometheus_protobuf::encode(&self.latency_view)
            .unwrap_or_default();
        for series in latency.iter().flat_map(|f| &f.metric) {
            if let Some(h) = &series.histogram {
                out.latency_sum += h.sample_sum;
                out.latency_count += h.sample_count;
            }
        }
        out
    }

    /// OpenMetrics text exposition (ends with `# EOF`).
    pub fn encode_openmetrics(&self) -> String {
        self.encode_with(prometheus_client::encoding::text::encode)
    }

    /// Prometheus classic text exposition, version 0.0.4.
    pub fn encode_text(&self) -> String {
        self.encode_with(prometheus_client::encoding::prometheus_text::encode)
    }

    fn encode_with(
        &self,
        encode: fn(&mut String, &Registry) -> Result<(), std::fmt::Error>,
    ) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would only come
        // from a metric's own encode, which ours never return.
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Every family as typed samples (StreamMetrics reads these).
    pub fn families(
        &self,
    ) -> Vec<prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::MetricFamily>
    {
        prometheus_client::encoding::prometheus_protobuf::encode(&self.registry).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_totals_sum_every_model_by_reason() {
        let m = Metrics::new();
        m.observe_lookup("a", Reason::PrefixMatch, true, 0.5);
        m.observe_lookup("a", Reason::PrefixMatch, true, 0.0);
        m.observe_lookup("b", Reason::PrefixMatch, true, 0.25);
        m.observe_lookup("b", Reason::NoHint, false, 0.0);
        let t = m.lookup_totals();
        assert_eq!(t.by_reason["PREFIX_MATCH"], 3);
        assert_eq!(t.by_reason["NO_HINT"], 1);
        assert!(!t.by_reason.contains_key("TIMEOUT"));
        assert!((t.latency_sum - 0.75).abs() < 1e-9);
        assert_eq!(t.latency_count, 4);
    }

    #[test]
    fn the_text_exposition_names_counters_with_total_and_has_no_eof() {
        let m = Metrics::new();
        m.observe_lookup("a", Reason::NoHint, false, 0.001);
        let text = m.encode_text();
        assert!(text.contains("# TYPE inferencecache_lookup_route_calls_total counter"));
        assert!(text.contains(
            "inferencecache_lookup_route_calls_total{model=\"a\",reason_code=\"NO_HINT\",hint_used=\"false\"} 1"
        ));
        assert!(!text.contains("# EOF"));
        assert!(!text.contains("# UNIT"));
    }
}

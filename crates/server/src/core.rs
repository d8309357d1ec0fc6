//! The server's domain core: the index, the policy store and the metrics,
//! with the bookkeeping that turns index outcomes into metrics. gRPC and HTTP
//! handlers are thin adapters over this.

use crate::events::EventHub;
use crate::metrics::{Metrics, ModelLabel};
use crate::policy::PolicyStore;
use crate::route::LookupPipeline;
use inferencecache_index::{
    CacheEvent, CacheUpdate, EvictionCounts, Index, IndexConfig, PROBE_TENANT, SystemClock,
};
use std::sync::Arc;
use std::time::Duration;

/// Index settings from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexSettings {
    /// Global cap on replica×prefix entries; <= 0 is unbounded.
    pub max_entries: i64,
    /// TTL for tenants whose policy sets none.
    pub default_ttl: Duration,
    /// How often the TTL + cap sweep runs.
    pub sweep_interval: Duration,
}

impl Default for IndexSettings {
    fn default() -> Self {
        Self {
            max_entries: inferencecache_index::DEFAULT_MAX_ENTRIES,
            default_ttl: inferencecache_index::DEFAULT_TTL,
            sweep_interval: inferencecache_index::DEFAULT_SWEEP_INTERVAL,
        }
    }
}

/// Shared server state.
#[derive(Clone)]
pub struct Core {
    /// The prefix index.
    pub index: Arc<Index>,
    /// Tenant policies.
    pub policies: PolicyStore,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The LookupRoute pipeline.
    pub pipeline: LookupPipeline,
    /// Live index-change feed.
    pub events: EventHub,
    /// Named `/readyz` blockers (e.g. the bus catching up).
    pub readiness: crate::readiness::Readiness,
    /// Bus mode: the relay that publishes gRPC-received updates.
    pub bus: Arc<std::sync::OnceLock<crate::replicate::BusRelay>>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").finish_non_exhaustive()
    }
}

impl Core {
    /// Builds the index wired to the policy store, the event hub and the
    /// system clock.
    pub fn new(
        settings: IndexSettings,
        block_size: u32,
        policies: PolicyStore,
        metrics: Arc<Metrics>,
        tokenizers: crate::tokenize::Tokenizers,
    ) -> Self {
        let events = EventHub::new();
        let index = Arc::new(
            IndexConfig::new()
                .max_entries(settings.max_entries)
                .default_ttl(settings.default_ttl)
                .reserved_tenants([PROBE_TENANT])
                .clock(Arc::new(SystemClock))
                .policy(Arc::new(policies.clone()))
                .observer(Arc::new(events.clone()))
                .build(),
        );
        metrics.index_max_entries.set(settings.max_entries.max(0));
        let pipeline = LookupPipeline::new(
            Arc::clone(&index),
            policies.clone(),
            Arc::clone(&metrics),
            block_size,
            tokenizers,
        );
        Self {
            index,
            policies,
            metrics,
            pipeline,
            events,
            readiness: crate::readiness::Readiness::default(),
            bus: Arc::default(),
        }
    }

    /// The bus relay, in bus mode.
    pub fn bus(&self) -> Option<&crate::replicate::BusRelay> {
        self.bus.get()
    }

    /// Ingests one update (the probe tenant is refused by the caller).
    pub fn ingest(&self, update: &CacheUpdate) {
        let out = self.index.ingest(update);
        let m = &self.metrics;
        m.ingest_updates.inc();
        m.ingest_entries.inc_by(out.entries_upserted);
        m.add_ingest_dropped("no_hash_scheme", out.skipped_no_scheme);
        m.add_ingest_dropped("mismatched_chain", out.dropped_mismatched_chain);
        m.add_ingest_dropped("empty_hash", out.dropped_empty_hash);
        self.record_evictions(&out.evictions);
        self.refresh_gauges();
    }

    /// Applies one event.
    pub fn apply_event(&self, event: &CacheEvent) {
        self.index.apply_event(event);
        self.refresh_gauges();
    }

    /// One TTL + cap sweep.
    pub fn sweep(&self) {
        let out = self.index.sweep();
        self.record_evictions(&out.evictions);
        self.refresh_gauges();
    }

    fn record_evictions(&self, e: &EvictionCounts) {
        let m = &self.metrics;
        m.add_index_evictions("lru", "cap", e.cap_lru);
        m.add_index_evictions("lfu", "cap", e.cap_lfu);
        m.add_index_evictions("lru", "ttl", e.ttl_lru);
        m.add_index_evictions("lfu", "ttl", e.ttl_lfu);
        for (tenant, n) in &e.quota {
            m.add_tenant_evictions(tenant, *n);
        }
    }

    fn refresh_gauges(&self) {
        for (model, n) in self.index.entry_counts_by_model() {
            self.metrics
                .index_entries
                .get_or_create(&ModelLabel {
                    model: model.to_string(),
                })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.metrics
            .index_replica_entries
            .set(i64::try_from(self.index.total_entries()).unwrap_or(i64::MAX));
    }
}

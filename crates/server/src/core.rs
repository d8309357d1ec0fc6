//! The server's domain core: the index, the policy store and the metrics,
//! with the bookkeeping that turns index outcomes into metrics. gRPC and HTTP
//! handlers are thin adapters over this.

use crate::events::EventHub;
use crate::metrics::Metrics;
use crate::policy::PolicyStore;
use crate::route::LookupPipeline;
pub use inferencecache_index::RankingMode;
use inferencecache_index::{
    CacheEvent, CacheUpdate, Clock, EventKind, EvictionCounts, Index, IndexConfig, SystemClock,
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
    /// `--ranking`: the ranking of tenants whose policy does not choose one.
    pub ranking: RankingMode,
    /// Limit on distinct replica ids (0 = unbounded).
    pub max_replicas: usize,
    /// `--producer-silence`: how long a heartbeating producer may say
    /// nothing before its replica is withdrawn; `None` never.
    pub producer_silence: Option<Duration>,
    /// Eviction foresight (`--no-eviction-foresight` turns it off): a hint
    /// does not claim blocks the requests hinted to the replica before it
    /// will evict ([`crate::foresight`]).
    pub eviction_foresight: bool,
}

impl Default for IndexSettings {
    fn default() -> Self {
        Self {
            max_entries: inferencecache_index::DEFAULT_MAX_ENTRIES,
            default_ttl: inferencecache_index::DEFAULT_TTL,
            sweep_interval: inferencecache_index::DEFAULT_SWEEP_INTERVAL,
            ranking: RankingMode::default(),
            max_replicas: inferencecache_index::DEFAULT_MAX_REPLICAS,
            producer_silence: Some(crate::liveness::DEFAULT_PRODUCER_SILENCE),
            eviction_foresight: true,
        }
    }
}

/// The server's domain: the index and what it is read and written with
/// (policies, templates, PD topologies, the LookupRoute pipeline), plus the
/// crate-internal machinery every handler shares (ingest lanes, limits,
/// readiness, learned block sizes, producer liveness). Cheap to clone. The
/// bus relay is not here: it belongs to `replicate::Replication`.
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
    pub(crate) events: EventHub,
    /// Prompt templates (RenderTemplate).
    pub templates: crate::templates::TemplateStore,
    /// Prefill/decode topologies (LookupPDRoute).
    pub pd_topologies: crate::pd::PdTopologyStore,
    /// Resource limits (see [`Core::with_limits`]).
    pub(crate) limits: crate::limits::Limits,
    /// Threads applying ingest and events off the runtime.
    pub(crate) lanes: crate::ingest_lane::IngestLanes,
    /// Named `/readyz` blockers (e.g. the bus catching up).
    pub(crate) readiness: crate::readiness::Readiness,
    /// Engine block sizes producers report (lookups by tokens use them).
    pub(crate) block_sizes: crate::block_size::BlockSizes,
    /// When each heartbeating producer last reported.
    pub(crate) liveness: crate::liveness::ProducerLiveness,
    /// Each replica's eviction foresight, fed by what ingest applies.
    pub(crate) foresight: Arc<crate::foresight::Foresight>,
    /// Callers' requests in flight (`ReportCallerLoad`, issue 36 item 4).
    pub caller_loads: Arc<crate::caller_loads::CallerLoads>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core").finish_non_exhaustive()
    }
}

impl Core {
    /// A core on the embedded defaults (block size 16, no tenant
    /// policies, metrics of its own, no tokenizer): what tests, benches and
    /// in-process tools start from.
    pub fn with_defaults() -> Self {
        Self::new(
            IndexSettings::default(),
            16,
            PolicyStore::new(),
            Arc::new(Metrics::new()),
            crate::tokenize::Tokenizers::none(),
        )
    }

    /// Builds the index wired to the policy store, the event hub and the
    /// system clock.
    pub fn new(
        settings: IndexSettings,
        block_size: u32,
        policies: PolicyStore,
        metrics: Arc<Metrics>,
        tokenizers: crate::tokenize::Tokenizers,
    ) -> Self {
        Self::with_clock(
            settings,
            block_size,
            policies,
            metrics,
            tokenizers,
            Arc::new(SystemClock),
        )
    }

    /// As [`Core::new`] on another clock (the simulator drives the index on
    /// simulated time, so freshness, the delivered-hint window and tentative
    /// holdings follow the simulation, not the wall clock).
    pub fn with_clock(
        settings: IndexSettings,
        block_size: u32,
        policies: PolicyStore,
        metrics: Arc<Metrics>,
        tokenizers: crate::tokenize::Tokenizers,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let events = EventHub::new();
        let index = Arc::new(
            IndexConfig::new()
                .max_entries(settings.max_entries)
                .max_replicas(settings.max_replicas)
                .default_ttl(settings.default_ttl)
                .reserved_tenants(crate::reserved_tenant::RESERVED_TENANTS)
                .clock(clock)
                .policy(Arc::new(policies.clone()))
                .observer(Arc::new(events.clone()))
                .build(),
        );
        metrics.index_gauges.bind(&index);
        metrics.index_max_entries.set(settings.max_entries.max(0));
        metrics
            .limits
            .index_max_replicas
            .set(i64::try_from(settings.max_replicas).unwrap_or(i64::MAX));
        let block_sizes =
            crate::block_size::BlockSizes::new(block_size, metrics.block_size.clone());
        let liveness = crate::liveness::ProducerLiveness::new(
            settings.producer_silence,
            metrics.liveness.clone(),
        );
        // Only the ttft ranking delivers hints: under the contract default
        // the models would be kept for nothing.
        let foresight = Arc::new(crate::foresight::Foresight::new(
            settings.eviction_foresight && settings.ranking != RankingMode::Contract,
        ));
        let pipeline = LookupPipeline::new(
            Arc::clone(&index),
            policies.clone(),
            Arc::clone(&metrics),
            block_sizes.clone(),
            tokenizers,
        )
        .with_ranking(settings.ranking)
        .with_foresight(Arc::clone(&foresight));
        Self {
            index,
            policies,
            metrics,
            pipeline,
            events,
            templates: crate::templates::TemplateStore::new(),
            pd_topologies: crate::pd::PdTopologyStore::new(),
            limits: crate::limits::Limits::default(),
            lanes: crate::ingest_lane::IngestLanes::new(crate::ingest_lane::default_lanes()),
            readiness: crate::readiness::Readiness::default(),
            block_sizes,
            liveness,
            foresight,
            caller_loads: Arc::default(),
        }
    }

    /// LookupPDRoute over this core's topologies, index and policies.
    pub fn pd_router(&self) -> crate::pd::PdRouter<'_> {
        crate::pd::PdRouter {
            topologies: &self.pd_topologies,
            index: &self.index,
            policies: &self.policies,
            metrics: &self.metrics,
        }
    }

    /// Ingests one update on its replica's ingest lane (off the runtime
    /// workers); false when refused (replica limit) or the lane is gone.
    pub async fn ingest_on_lane(&self, update: CacheUpdate) -> bool {
        let core = self.clone();
        let lane = self.lanes.lane_of(&update.replica_id);
        self.lanes
            .run(lane, move || core.ingest(&update))
            .await
            .unwrap_or(false)
    }

    /// Ingests a window of updates as one index batch on the first update's
    /// lane; false when one was refused (replica limit: it and the rest of
    /// the window were not applied) or the lane is gone.
    pub async fn ingest_batch_on_lane(&self, updates: Vec<CacheUpdate>) -> bool {
        let Some(lane) = updates.first().map(|u| self.lanes.lane_of(&u.replica_id)) else {
            return true;
        };
        let core = self.clone();
        self.lanes
            .run(lane, move || core.ingest_batch(&updates))
            .await
            .unwrap_or(false)
    }

    /// Applies one event in its replica's ingest-lane order. A clear (work
    /// in proportion to what the replica holds) runs on the lane; the others
    /// cost an index probe or two and run inline when the lane is idle
    /// (`IngestLanes::run_light`).
    pub async fn apply_event_on_lane(&self, event: CacheEvent) {
        let core = self.clone();
        let lane = self.lanes.lane_of(&event.replica_id);
        if matches!(event.kind, EventKind::AllCleared) {
            self.lanes.run(lane, move || core.apply_event(&event)).await;
        } else {
            self.lanes
                .run_light(lane, move || core.apply_event(&event))
                .await;
        }
    }

    /// Applies resource limits (the defaults apply until this is called).
    pub fn with_limits(mut self, limits: crate::limits::Limits) -> Self {
        self.pipeline =
            self.pipeline
                .with_tokenize_budget(crate::tokenize_budget::TokenizeBudget::new(
                    limits.tokenize_concurrency,
                    limits.tokenize_memory_budget,
                    Arc::clone(&self.metrics),
                ));
        if limits.ingest_lanes != self.lanes.len() {
            self.lanes = crate::ingest_lane::IngestLanes::new(limits.ingest_lanes);
        }
        self.limits = limits;
        self
    }

    /// Ingests one update (the probe tenant is refused by the caller).
    /// Returns false when the index refused it whole (replica limit).
    pub fn ingest(&self, update: &CacheUpdate) -> bool {
        let out = self.index.ingest(update);
        if out.refused_replica_limit {
            self.metrics.limits.reject("replica_limit");
            return false;
        }
        self.foresee(update);
        self.record_ingest(1, &out);
        true
    }

    /// Ingests updates as one index batch (`Index::apply_batch`: in order,
    /// quota and cap enforced once at the end). False when one was refused
    /// (replica limit): it and the later ones were not applied.
    pub fn ingest_batch(&self, updates: &[CacheUpdate]) -> bool {
        let out = self
            .index
            .apply_batch(updates.iter().map(inferencecache_index::BatchWrite::Store));
        let applied = out.refused_at.unwrap_or(updates.len()).min(updates.len());
        for u in &updates[..applied] {
            self.foresee(u);
        }
        if out.stores > 0 {
            self.record_ingest(out.stores, &out.ingest);
        }
        if out.refused_at.is_some() {
            self.metrics.limits.reject("replica_limit");
            return false;
        }
        true
    }

    /// What ingest applied, in the replica's order, to its foresight model
    /// (and to the decision log).
    fn foresee(&self, update: &CacheUpdate) {
        if crate::decision_log::enabled() {
            crate::decision_log::engine_load(update);
        }
        if self.foresight.enabled() {
            let bs = self
                .block_sizes
                .for_scope(&update.tenant_id, &update.model_id);
            let moved = self.foresight.ingest(update, bs);
            if moved > 0 {
                self.metrics.routing.foresight_moved.inc_by(moved);
            }
        }
    }

    fn record_ingest(&self, updates: u64, out: &inferencecache_index::IngestOutcome) {
        let m = &self.metrics;
        m.ingest_updates.inc_by(updates);
        m.ingest_entries.inc_by(out.entries_upserted);
        m.add_ingest_dropped("no_hash_scheme", out.skipped_no_scheme);
        m.add_ingest_dropped("mismatched_chain", out.dropped_mismatched_chain);
        m.add_ingest_dropped("empty_hash", out.dropped_empty_hash);
        m.add_ingest_dropped("shard_full", out.dropped_shard_full);
        self.record_evictions(&out.evictions);
        m.routing.tentative("confirmed", out.tentative_confirmed);
    }

    /// Applies one event.
    pub fn apply_event(&self, event: &CacheEvent) {
        let out = self.index.apply_event(event);
        self.foresight.event(event);
        self.metrics
            .routing
            .tentative("removed", out.tentative_removed);
    }

    /// Withdraws the replicas whose heartbeating producer went silent
    /// (`ALL_CLEARED` for each). Not called in bus mode: the replicas share
    /// one stream, so this is left to the producers' own clears.
    pub fn withdraw_silent(&self) {
        for (tenant_id, model_id, replica_id) in
            self.liveness.newly_silent(std::time::Instant::now())
        {
            self.apply_event(&CacheEvent {
                kind: EventKind::AllCleared,
                replica_id,
                model_id,
                tenant_id,
                prefix_hash: Vec::new(),
                timestamp_us: 0,
                adapter_id: String::new(),
            });
        }
    }

    /// GetCacheState: replica stats and prefix counts of (tenant, model);
    /// empty for the reserved tenant.
    pub fn cache_state(&self, tenant: &str, model: &str) -> inferencecache_index::CacheState {
        if crate::reserved_tenant::is_reserved(tenant) {
            return inferencecache_index::CacheState::default();
        }
        self.index.cache_state(tenant, model)
    }

    /// One TTL + cap sweep.
    pub fn sweep(&self) {
        let out = self.index.sweep();
        self.record_evictions(&out.evictions);
        self.metrics
            .routing
            .tentative("expired", out.tentative_expired);
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
}

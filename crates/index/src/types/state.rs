//! Read-side views: stored stats, aggregates and the `/snapshot` body.

use std::sync::Arc;

/// Stats of one replica as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaStatsView {
    /// Replica.
    pub replica_id: Arc<str>,
    /// Bytes of KV cache memory.
    pub cache_memory_bytes: i64,
    /// Hit rate.
    pub hit_rate: f32,
    /// Pressure.
    pub pressure: f32,
    /// Client version.
    pub client_version: Arc<str>,
    /// T2 hit tokens.
    pub t2_hit_tokens: i64,
    /// T2 query tokens.
    pub t2_query_tokens: i64,
    /// The engine's load from the last stats report (not persisted: a
    /// restored index has none until the next report).
    pub load: Option<super::EngineLoad>,
    /// Liveness (ingest or REPLICA_UPDATED), Unix ns.
    pub last_seen_ns: i64,
    /// Last ingest carrying stats, Unix ns.
    pub stats_reported_ns: i64,
}

/// `GetCacheState` aggregate.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheState {
    /// Replica stats of (tenant, model), sorted by replica id.
    pub replicas: Vec<ReplicaStatsView>,
    /// Distinct prefix keys of (tenant, model), all schemes and adapters.
    pub total_prefixes: i64,
    /// Distinct prefix keys of (tenant, model) whose summed access count is
    /// at least [`crate::HOT_PREFIX_MIN_HITS`].
    pub hot_prefixes: i64,
}

/// Distinct prefix counts, excluding reserved tenants.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Aggregate {
    /// Σ per_tenant.
    pub total: i64,
    /// (tenant, distinct prefixes), sorted by tenant; only tenants with ≥ 1.
    pub per_tenant: Vec<(Arc<str>, i64)>,
}

/// One `/snapshot` replica row (per (tenant, replica)).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SnapshotReplica {
    /// Replica.
    pub replica_id: Arc<str>,
    /// Tenant.
    pub tenant: Arc<str>,
    /// Stats memory (0 without stats).
    pub cache_memory_bytes: i64,
    /// Stats hit rate.
    pub hit_rate: f32,
    /// Stats pressure.
    pub pressure: f32,
    /// Stats last_seen (Unix ns); `None` = zero time.
    pub last_update_ns: Option<i64>,
    /// Number of (prefix, replica) entries the replica holds for the tenant.
    pub prefix_count: i64,
    /// Newest entry last_seen; `None` = zero time.
    pub last_event_at_ns: Option<i64>,
    /// A stats entry exists.
    pub stats_reported: bool,
    /// T2 hit tokens.
    pub t2_hit_tokens: i64,
    /// T2 query tokens.
    pub t2_query_tokens: i64,
    /// Client version (`""` without stats).
    pub client_version: Arc<str>,
    /// The engine's load from the last stats report.
    pub load: Option<super::EngineLoad>,
    /// Unexpired tentative holdings (approximate mode), not in `prefix_count`.
    pub tentative_count: i64,
}

/// One `/snapshot` tenant row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SnapshotTenant {
    /// Tenant.
    pub tenant_id: Arc<str>,
    /// Distinct prefixes.
    pub index_entries: i64,
    /// Mean of the per-replica latest hit rates.
    pub hit_rate: f32,
    /// At least one hit-rate sample.
    pub hit_rate_reported: bool,
    /// Always 0.
    pub memory_used: i64,
}

/// `/snapshot` body (reserved tenants excluded everywhere).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Sorted by (tenant, replica id).
    pub replicas: Vec<SnapshotReplica>,
    /// Sorted by tenant.
    pub tenants: Vec<SnapshotTenant>,
    /// Aggregate total.
    pub total_prefixes: i64,
    /// Hot distinct prefixes across all (non-reserved) tenants.
    pub hot_prefixes: i64,
    /// Unexpired tentative holdings (approximate mode), all tenants.
    pub tentative_entries: i64,
}

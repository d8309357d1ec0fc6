//! Domain types: what the server hands the index and what it gets back.
//! No protobuf type ever reaches the index.

use std::fmt;
use std::sync::Arc;

/// Cache tier (§3.6). Built from the raw proto `CacheTier` number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tier(i32);

impl Tier {
    /// `CACHE_TIER_UNSPECIFIED`.
    pub const UNSPECIFIED: Tier = Tier(0);
    /// GPU HBM.
    pub const T1: Tier = Tier(1);
    /// Host memory.
    pub const T2: Tier = Tier(2);
    /// Disk / remote.
    pub const T3: Tier = Tier(3);
    /// Sentinel for a negative wire value: "invalid cold", colder than anything.
    pub const INVALID: Tier = Tier(i32::MAX);

    /// Proto → index: 0 → Unspecified, positive kept raw, negative → [`Tier::INVALID`].
    pub fn from_wire(v: i32) -> Tier {
        if v < 0 { Tier::INVALID } else { Tier(v) }
    }

    /// Index → proto: T1/T2/T3 → 1/2/3, anything else → 0 (UNSPECIFIED).
    pub fn to_wire(self) -> i32 {
        match self.0 {
            1..=3 => self.0,
            _ => 0,
        }
    }

    /// The raw internal number.
    pub fn raw(self) -> i32 {
        self.0
    }

    /// Ingest normalization: Unspecified → T1; everything else unchanged.
    pub fn normalized(self) -> Tier {
        if self == Tier::UNSPECIFIED {
            Tier::T1
        } else {
            self
        }
    }

    /// The colder of two tiers; Unspecified on either side wins.
    pub fn worst(a: Tier, b: Tier) -> Tier {
        if a == Tier::UNSPECIFIED || b == Tier::UNSPECIFIED {
            Tier::UNSPECIFIED
        } else if b.0 > a.0 {
            b
        } else {
            a
        }
    }
}

impl fmt::Debug for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("Unspecified"),
            1 => f.write_str("T1"),
            2 => f.write_str("T2"),
            3 => f.write_str("T3"),
            i32::MAX => f.write_str("Invalid"),
            n => write!(f, "Tier({n})"),
        }
    }
}

/// Lookup outcome strategy (§2.6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// No hint.
    #[default]
    None,
    /// At least one replica holds the prefix.
    PrefixMatch,
    /// Fallback on recent tenant hit rates (non-chain requests).
    TenantHot,
    /// The tenant has no prefixes.
    UnknownTenant,
    /// The tenant has no prefixes for this model.
    UnknownModel,
    /// No replica serves (tenant, model, hash_scheme).
    UnknownHashScheme,
}

/// One prefix reported by a replica (a `PrefixEntry`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefixEntry {
    /// Legacy exact key (may be co-set with a chain).
    pub prefix_hash: Vec<u8>,
    /// Token count for the legacy key.
    pub token_count: i32,
    /// Chain form: one hash per block.
    pub block_hashes: Vec<Vec<u8>>,
    /// Chain form: tokens per block, parallel to `block_hashes`.
    pub block_token_counts: Vec<i32>,
    /// Tier (Unspecified is normalized to T1).
    pub tier: Tier,
    /// Adapter partition; empty falls back to the update's adapter.
    pub adapter_id: String,
}

impl Default for Tier {
    fn default() -> Self {
        Tier::UNSPECIFIED
    }
}

/// Replica stats carried by an update.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaStatsReport {
    /// Bytes of KV cache memory.
    pub cache_memory_bytes: i64,
    /// Hit rate (non-finite → 0).
    pub hit_rate: f32,
    /// Memory pressure 0..1 (non-finite → 0).
    pub pressure: f32,
    /// Engine/sidecar version string (stored, shown in snapshots).
    pub client_version: String,
    /// T2 hit tokens.
    pub t2_hit_tokens: i64,
    /// T2 query tokens.
    pub t2_query_tokens: i64,
}

/// One `CacheStateUpdate`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheUpdate {
    /// Reporting replica (identity; a nested stats replica id is ignored).
    pub replica_id: String,
    /// Model.
    pub model_id: String,
    /// Tenant.
    pub tenant_id: String,
    /// Engine hash scheme; empty skips every prefix (stats still stored).
    pub hash_scheme: String,
    /// Unix µs; 0 = now.
    pub timestamp_us: i64,
    /// Prefixes (additive).
    pub prefixes: Vec<PrefixEntry>,
    /// Stats, if the message carried them.
    pub stats: Option<ReplicaStatsReport>,
    /// Default adapter for entries.
    pub adapter_id: String,
}

/// Event type (§2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// No-op.
    PrefixAdded,
    /// Remove a replica from a hash (all schemes; adapter-narrowed if given).
    PrefixEvicted,
    /// Refresh a replica's stats liveness.
    ReplicaUpdated,
    /// Remove a replica from every key of (tenant, model) and drop its stats.
    AllCleared,
}

impl EventKind {
    /// Proto `CacheEvent.Type` number → kind; 0 and unknown numbers → `None`.
    pub fn from_wire(v: i32) -> Option<EventKind> {
        match v {
            1 => Some(EventKind::PrefixAdded),
            2 => Some(EventKind::PrefixEvicted),
            3 => Some(EventKind::ReplicaUpdated),
            4 => Some(EventKind::AllCleared),
            _ => None,
        }
    }

    /// Kind → proto `CacheEvent.Type` number.
    pub fn to_wire(self) -> i32 {
        match self {
            EventKind::PrefixAdded => 1,
            EventKind::PrefixEvicted => 2,
            EventKind::ReplicaUpdated => 3,
            EventKind::AllCleared => 4,
        }
    }
}

/// One `CacheEvent`.
#[derive(Debug, Clone, PartialEq)]
pub struct CacheEvent {
    /// Event type.
    pub kind: EventKind,
    /// Replica.
    pub replica_id: String,
    /// Model.
    pub model_id: String,
    /// Tenant.
    pub tenant_id: String,
    /// Hash (PREFIX_EVICTED).
    pub prefix_hash: Vec<u8>,
    /// Unix µs; 0 = now.
    pub timestamp_us: i64,
    /// Adapter (PREFIX_EVICTED narrowing; ignored by ALL_CLEARED).
    pub adapter_id: String,
}

/// A lookup request. Borrowed so the handler can pass its request fields
/// without copying; `H` is any byte container (`Vec<u8>`, `[u8; 8]`, `Bytes`).
#[derive(Debug)]
pub struct LookupRequest<'a, H = Vec<u8>> {
    /// Tenant.
    pub tenant: &'a str,
    /// Model.
    pub model: &'a str,
    /// Engine hash scheme.
    pub hash_scheme: &'a str,
    /// Adapter partition (`""` = base).
    pub adapter: &'a str,
    /// Legacy exact key.
    pub prefix_hash: &'a [u8],
    /// Legacy exact token count (informational; the index uses stored counts).
    pub prefix_token_count: i32,
    /// Chain hashes.
    pub block_hashes: &'a [H],
    /// Chain token counts (matched tokens are computed from these).
    pub block_token_counts: &'a [i32],
    /// SLO time-to-first-token in ms (0 = none).
    pub slo_ttft_ms: i32,
}

impl<H> Clone for LookupRequest<'_, H> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<H> Copy for LookupRequest<'_, H> {}

impl<'a, H> LookupRequest<'a, H> {
    /// A request with no fingerprint input yet.
    pub fn new(tenant: &'a str, model: &'a str, hash_scheme: &'a str) -> Self {
        Self {
            tenant,
            model,
            hash_scheme,
            adapter: "",
            prefix_hash: &[],
            prefix_token_count: 0,
            block_hashes: &[],
            block_token_counts: &[],
            slo_ttft_ms: 0,
        }
    }

    /// Set the adapter partition.
    pub fn adapter(mut self, adapter: &'a str) -> Self {
        self.adapter = adapter;
        self
    }

    /// Set the legacy exact key.
    pub fn exact(mut self, prefix_hash: &'a [u8], token_count: i32) -> Self {
        self.prefix_hash = prefix_hash;
        self.prefix_token_count = token_count;
        self
    }

    /// Set the chain.
    pub fn chain(mut self, block_hashes: &'a [H], block_token_counts: &'a [i32]) -> Self {
        self.block_hashes = block_hashes;
        self.block_token_counts = block_token_counts;
        self
    }

    /// Set the SLO TTFT.
    pub fn slo_ttft_ms(mut self, ms: i32) -> Self {
        self.slo_ttft_ms = ms;
        self
    }

    /// Either chain array is non-empty.
    pub fn is_chain_bearing(&self) -> bool {
        !self.block_hashes.is_empty() || !self.block_token_counts.is_empty()
    }
}

/// One ranked replica.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaScore {
    /// Replica.
    pub replica_id: Arc<str>,
    /// Score (f32, §2.6).
    pub score: f32,
    /// Matched tokens.
    pub matched_tokens: i32,
    /// Estimated cache-hit probability (freshness, or hit rate for TENANT_HOT).
    pub estimated_cache_hit_prob: f32,
    /// Tier (use [`Tier::to_wire`]).
    pub tier: Tier,
}

/// The LFU-captured entries of one replica in a lookup: the first `blocks`
/// keys of the request (1 for an exact hit, the run length for a chain hit),
/// credited by [`crate::Index::credit`] only when the handler delivers the
/// hint. The keys are shared by every hit of the lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LfuHit {
    pub(crate) keys: Arc<[crate::key::EntryKey]>,
    pub(crate) blocks: u32,
    pub(crate) replica: u32,
    pub(crate) replica_id: Arc<str>,
}

impl LfuHit {
    /// The replica this hit belongs to.
    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    /// Number of (prefix, replica) entries this hit credits.
    pub fn entries(&self) -> usize {
        self.blocks as usize
    }
}

/// The result of [`crate::Index::lookup_route`] / [`crate::Index::lookup`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LookupRouteResult {
    /// Strategy (the server maps it to the wire reason code).
    pub strategy: Strategy,
    /// Ranked replicas: score desc, replica id asc.
    pub scores: Vec<ReplicaScore>,
    /// Access-counter hits to credit if the hint is delivered (every tenant;
    /// only LFU tenants' eviction reads the counters).
    pub hits: Vec<LfuHit>,
}

impl LookupRouteResult {
    /// Matched-tokens floor (§3.2 13b): keep replicas with `matched_tokens >= floor`,
    /// pruning LFU hits of dropped replicas too (order preserved). If nothing is
    /// left the strategy becomes `None`. Returns whether anything is left.
    pub fn retain_min_matched_tokens(&mut self, floor: i32) -> bool {
        self.scores.retain(|s| s.matched_tokens >= floor);
        if self.scores.is_empty() {
            self.demote();
            return false;
        }
        let scores = &self.scores;
        self.hits
            .retain(|h| scores.iter().any(|s| *s.replica_id == *h.replica_id));
        true
    }

    /// Total (prefix, replica) entries the hits would credit.
    pub fn hit_entries(&self) -> usize {
        self.hits.iter().map(LfuHit::entries).sum()
    }

    /// Demote to `None`: scores and hits cleared.
    pub fn demote(&mut self) {
        self.strategy = Strategy::None;
        self.scores.clear();
        self.hits.clear();
    }
}

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

/// Eviction counters for metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvictionCounts {
    /// Cap evictions (entries) of LRU tenants.
    pub cap_lru: u64,
    /// Cap evictions (entries) of LFU tenants.
    pub cap_lfu: u64,
    /// TTL evictions (entries) of LRU tenants.
    pub ttl_lru: u64,
    /// TTL evictions (entries) of LFU tenants.
    pub ttl_lfu: u64,
    /// Quota evictions (distinct prefixes) per tenant (`over_entries`).
    pub quota: Vec<(Arc<str>, u64)>,
}

impl EvictionCounts {
    pub(crate) fn add_cap(&mut self, algo: crate::EvictionAlgorithm, n: u64) {
        match algo {
            crate::EvictionAlgorithm::Lru => self.cap_lru += n,
            crate::EvictionAlgorithm::Lfu => self.cap_lfu += n,
        }
    }

    pub(crate) fn add_ttl(&mut self, algo: crate::EvictionAlgorithm, n: u64) {
        match algo {
            crate::EvictionAlgorithm::Lru => self.ttl_lru += n,
            crate::EvictionAlgorithm::Lfu => self.ttl_lfu += n,
        }
    }

    /// Total cap evictions.
    pub fn cap_total(&self) -> u64 {
        self.cap_lru + self.cap_lfu
    }

    /// Total TTL evictions.
    pub fn ttl_total(&self) -> u64 {
        self.ttl_lru + self.ttl_lfu
    }
}

/// What one ingest did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestOutcome {
    /// (prefix, replica) entries written (new or refreshed).
    pub entries_upserted: u64,
    /// Of which new.
    pub entries_added: u64,
    /// PrefixEntries skipped because the update's hash scheme was empty.
    pub skipped_no_scheme: u64,
    /// Chain entries dropped for mismatched / one-sided arrays.
    pub dropped_mismatched_chain: u64,
    /// Keys dropped because the hash was empty (legacy or chain block).
    pub dropped_empty_hash: u64,
    /// A stats entry was stored.
    pub stats_stored: bool,
    /// Nothing was applied: the update names a new replica and the index
    /// already holds its limit of live replicas ([`crate::IndexConfig::max_replicas`]).
    pub refused_replica_limit: bool,
    /// Quota and cap evictions.
    pub evictions: EvictionCounts,
    /// Tentative holdings replaced by these real entries.
    pub tentative_confirmed: u64,
}

/// What one event did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventOutcome {
    /// (prefix, replica) entries removed.
    pub entries_removed: u64,
    /// Stats entries touched (refreshed or removed).
    pub stats_touched: u64,
    /// Tentative holdings removed with the real ones.
    pub tentative_removed: u64,
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Stats entries removed by TTL.
    pub stats_removed: u64,
    /// Replica ids released: they held no entry and had no stats record.
    pub replicas_released: u64,
    /// TTL and cap evictions.
    pub evictions: EvictionCounts,
    /// Tentative holdings expired.
    pub tentative_expired: u64,
}

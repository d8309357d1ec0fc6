//! What producers report: cache updates and events (§2.3, §2.4).

use super::Tier;

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
    /// Our extension: the replica holds the entry, but a match may not end
    /// at it (a chain's last block, else the legacy key): a hybrid model's
    /// sliding-window layers no longer hold the blocks just before it. A
    /// lookup whose run would end here backs off to the deepest valid end
    /// (the `endpoints` module). `false`, the default, is a valid end.
    pub no_match_end: bool,
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
    /// The engine's load (our extension); `None` = not reported.
    pub load: Option<EngineLoad>,
}

/// What an engine is doing, as its producer last scraped it (our extension
/// of v1alpha1's `ReplicaStats`). Sanitized at ingest: `kv_cache_usage` is in
/// [0, 1].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    /// Requests running.
    pub running_requests: u32,
    /// Requests waiting for admission.
    pub waiting_requests: u32,
    /// Fraction of the KV cache in use, [0, 1].
    pub kv_cache_usage: f32,
    /// KV cache capacity in tokens; 0 = unknown.
    pub kv_cache_capacity_tokens: u64,
}

impl EngineLoad {
    /// Requests in the engine (running + waiting).
    pub fn requests(&self) -> u64 {
        u64::from(self.running_requests) + u64::from(self.waiting_requests)
    }

    /// Free KV cache tokens, when the capacity is known.
    pub fn free_tokens(&self) -> Option<u64> {
        (self.kv_cache_capacity_tokens > 0).then(|| {
            let used = f64::from(self.kv_cache_usage) * self.kv_cache_capacity_tokens as f64;
            self.kv_cache_capacity_tokens
                .saturating_sub(used.round() as u64)
        })
    }
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

//! Domain values → proto messages. The only place proto types are built, so
//! decoding and mapping stay free of them. Timestamps are 0 (server "now"),
//! see [`super`].

use inferencecache_proto::v1alpha1::{
    CacheEvent, CacheStateUpdate, EngineLoad, PrefixEntry, ReplicaStats, cache_event,
};

use crate::mapping::{PrefixEviction, PrefixReport};
use crate::stats::EngineStats;

/// Who is reporting: the fields every message carries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// `--replica-id`.
    pub replica_id: String,
    /// `--model-id`.
    pub model_id: String,
    /// `--tenant-id`.
    pub tenant_id: String,
    /// `--hash-scheme` (index domain).
    pub hash_scheme: String,
}

impl Identity {
    /// One `CacheStateUpdate` carrying `reports`.
    pub fn update(&self, reports: &[PrefixReport]) -> CacheStateUpdate {
        CacheStateUpdate {
            replica_id: self.replica_id.clone(),
            model_id: self.model_id.clone(),
            tenant_id: self.tenant_id.clone(),
            hash_scheme: self.hash_scheme.clone(),
            timestamp_us: 0,
            prefixes: reports
                .iter()
                .map(|r| PrefixEntry {
                    prefix_hash: r.prefix_hash_wire().to_vec(),
                    token_count: r.token_count,
                    tier: r.tier.as_proto(),
                    adapter_id: r.adapter.to_string(),
                    no_match_end: r.no_match_end,
                    ..PrefixEntry::default()
                })
                .collect(),
            stats: None,
            adapter_id: String::new(),
            // Every block of a replica has its engine's size; the first says it.
            block_size: reports
                .iter()
                .map(|r| i32::try_from(r.block_size).unwrap_or(0))
                .find(|&b| b > 0)
                .unwrap_or(0),
        }
    }

    /// An empty `CacheStateUpdate`: the heartbeat that keeps the replica
    /// live at a server that withdraws silent producers. It says the block
    /// size, which is also the promise of heartbeats.
    pub fn heartbeat(&self, block_size: u32) -> CacheStateUpdate {
        CacheStateUpdate {
            replica_id: self.replica_id.clone(),
            model_id: self.model_id.clone(),
            tenant_id: self.tenant_id.clone(),
            hash_scheme: self.hash_scheme.clone(),
            block_size: i32::try_from(block_size).unwrap_or(0),
            ..CacheStateUpdate::default()
        }
    }

    /// A stats-only `CacheStateUpdate` (wall-clock time: the server's "now").
    pub fn stats_update(&self, s: &EngineStats) -> CacheStateUpdate {
        CacheStateUpdate {
            replica_id: self.replica_id.clone(),
            model_id: self.model_id.clone(),
            tenant_id: self.tenant_id.clone(),
            hash_scheme: self.hash_scheme.clone(),
            timestamp_us: 0,
            prefixes: Vec::new(),
            stats: Some(ReplicaStats {
                replica_id: self.replica_id.clone(),
                cache_memory_bytes: s.cache_memory_bytes,
                hit_rate: s.hit_rate as f32,
                pressure: s.pressure as f32,
                client_version: s.client_version.clone(),
                t2_hit_tokens: s.t2_hit_tokens,
                t2_query_tokens: s.t2_query_tokens,
                load: Some(EngineLoad {
                    running_requests: s.load.running,
                    waiting_requests: s.load.waiting,
                    kv_cache_usage: s.load.kv_usage as f32,
                    kv_cache_capacity_tokens: s.load.kv_capacity_tokens,
                }),
            }),
            adapter_id: String::new(),
            block_size: 0,
        }
    }

    /// `PublishEvent(PREFIX_EVICTED)`.
    pub fn evicted(&self, e: &PrefixEviction) -> CacheEvent {
        CacheEvent {
            r#type: cache_event::Type::PrefixEvicted as i32,
            replica_id: self.replica_id.clone(),
            model_id: self.model_id.clone(),
            tenant_id: self.tenant_id.clone(),
            prefix_hash: e.prefix_hash_wire().to_vec(),
            timestamp_us: 0,
            adapter_id: e.adapter.to_string(),
        }
    }

    /// `PublishEvent(ALL_CLEARED)`.
    pub fn all_cleared(&self) -> CacheEvent {
        CacheEvent {
            r#type: cache_event::Type::AllCleared as i32,
            replica_id: self.replica_id.clone(),
            model_id: self.model_id.clone(),
            tenant_id: self.tenant_id.clone(),
            prefix_hash: Vec::new(),
            timestamp_us: 0,
            adapter_id: String::new(),
        }
    }
}

//! Proto ⇄ domain conversions, at the edge. The index never sees proto types.

use inferencecache_index as index;
use inferencecache_proto::v1alpha1 as pb;

/// `CacheStateUpdate` → index update (moves the byte vectors, no copies).
pub fn update_from_proto(u: pb::CacheStateUpdate) -> index::CacheUpdate {
    index::CacheUpdate {
        replica_id: u.replica_id,
        model_id: u.model_id,
        tenant_id: u.tenant_id,
        hash_scheme: u.hash_scheme,
        timestamp_us: u.timestamp_us,
        prefixes: u.prefixes.into_iter().map(entry_from_proto).collect(),
        stats: u.stats.map(stats_from_proto),
        adapter_id: u.adapter_id,
    }
}

fn entry_from_proto(e: pb::PrefixEntry) -> index::PrefixEntry {
    index::PrefixEntry {
        prefix_hash: e.prefix_hash,
        token_count: e.token_count,
        block_hashes: e.block_hashes,
        block_token_counts: e.block_token_counts,
        tier: index::Tier::from_wire(e.tier),
        adapter_id: e.adapter_id,
    }
}

fn stats_from_proto(s: pb::ReplicaStats) -> index::ReplicaStatsReport {
    index::ReplicaStatsReport {
        cache_memory_bytes: s.cache_memory_bytes,
        hit_rate: s.hit_rate,
        pressure: s.pressure,
        client_version: s.client_version,
        t2_hit_tokens: s.t2_hit_tokens,
        t2_query_tokens: s.t2_query_tokens,
    }
}

/// `CacheEvent` → index event; `None` for TYPE_UNSPECIFIED and unknown types
/// (acknowledged, nothing applied).
pub fn event_from_proto(e: pb::CacheEvent) -> Option<index::CacheEvent> {
    Some(index::CacheEvent {
        kind: index::EventKind::from_wire(e.r#type)?,
        replica_id: e.replica_id,
        model_id: e.model_id,
        tenant_id: e.tenant_id,
        prefix_hash: e.prefix_hash,
        timestamp_us: e.timestamp_us,
        adapter_id: e.adapter_id,
    })
}

/// Ranked replica → wire score. The probability is clamped to [0, 1]: for
/// TENANT_HOT it is the producer's hit rate, which a buggy producer can send
/// out of range; ranking itself is left exactly as the reference computes it.
pub fn score_to_proto(s: &index::ReplicaScore) -> pb::ReplicaScore {
    pb::ReplicaScore {
        replica_id: s.replica_id.to_string(),
        score: s.score,
        matched_tokens: s.matched_tokens,
        estimated_cache_hit_prob: s.estimated_cache_hit_prob.clamp(0.0, 1.0),
        tier: s.tier.to_wire(),
    }
}

/// Stored stats → wire stats (client_version is returned: decision 2).
pub fn stats_to_proto(s: &index::ReplicaStatsView) -> pb::ReplicaStats {
    pb::ReplicaStats {
        replica_id: s.replica_id.to_string(),
        cache_memory_bytes: s.cache_memory_bytes,
        hit_rate: s.hit_rate,
        pressure: s.pressure,
        client_version: s.client_version.to_string(),
        t2_hit_tokens: s.t2_hit_tokens,
        t2_query_tokens: s.t2_query_tokens,
    }
}

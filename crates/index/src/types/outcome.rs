//! What one ingest, event or sweep did.

use std::sync::Arc;

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
    /// New chain blocks dropped because their arena shard's table of the
    /// partition already holds its most blocks (about 33.5 M).
    pub dropped_shard_full: u64,
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

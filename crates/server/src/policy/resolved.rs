//! Resolved, ready-to-use policy values: what the handlers and the index read
//! on every lookup, with every default already applied.

use super::wire::{DEFAULT_MINIMUM_MATCHED_TOKENS, DEFAULT_ROUTING_FLOOR_SCORE};
pub use inferencecache_index::EvictionAlgorithm;
use inferencecache_index::{LookupPolicy, RankingMode, TtftWeights};
use std::collections::HashMap;
use std::time::Duration;

/// One tenant's effective policy. `Default` is the no-policy behaviour.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TenantPolicy {
    /// Index TTL; `None` = the server default.
    pub eviction_ttl: Option<Duration>,
    /// Minimum prompt tokens for a prefix hint; 0 = no gate.
    pub minimum_prefix_tokens: i32,
    /// Matched-tokens floor; 0 = off.
    pub minimum_matched_tokens: i32,
    /// Routing floor on the top score; 0 = off.
    pub routing_floor_score: f32,
    /// Lookup budget; `None` = no deadline from policy.
    pub lookup_timeout: Option<Duration>,
    /// AFFINITY_HINT fallback on misses.
    pub affinity_routing: bool,
    /// Cap victim order.
    pub eviction: EvictionAlgorithm,
    /// Chain matching (else only the exact key is used).
    pub enable_chain_matching: bool,
    /// Refuse requests without a well-formed chain.
    pub require_chain: bool,
    /// TENANT_HOT fallback.
    pub enable_tenant_hot: bool,
    /// True when the tenant has a pushed policy (affects nothing but reporting).
    pub has_policy: bool,
    /// Ranking override (v8 `routing.ranking`); `None` = the server's `--ranking`.
    pub ranking: Option<RankingMode>,
    /// Estimated-TTFT weights (v8 `routing`).
    pub ttft: TtftWeights,
}

impl Default for TenantPolicy {
    fn default() -> Self {
        Self {
            eviction_ttl: None,
            minimum_prefix_tokens: 0,
            minimum_matched_tokens: DEFAULT_MINIMUM_MATCHED_TOKENS,
            routing_floor_score: DEFAULT_ROUTING_FLOOR_SCORE,
            lookup_timeout: None,
            affinity_routing: true,
            eviction: EvictionAlgorithm::Lru,
            enable_chain_matching: true,
            require_chain: false,
            enable_tenant_hot: true,
            has_policy: false,
            ranking: None,
            ttft: TtftWeights::default(),
        }
    }
}

impl TenantPolicy {
    /// What the index's lookups need of this policy (passed in with the
    /// request, so a lookup makes no resolver call).
    pub fn lookup(&self) -> LookupPolicy {
        LookupPolicy {
            ttl: self.eviction_ttl,
            tenant_hot: self.enable_tenant_hot,
        }
    }
}

/// A complete pushed policy set, swapped in atomically.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PolicySet {
    /// Version of the body it came from (0 = nothing pushed yet).
    pub version: i64,
    /// By namespace (== tenant_id).
    pub policies: HashMap<String, TenantPolicy>,
    /// Distinct-prefix budgets by tenant id (>= 0).
    pub quotas: HashMap<String, i64>,
}

//! The only way policy reaches the index: an injected resolver.

use std::time::Duration;

/// Cap victim ordering for a tenant (§2.5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum EvictionAlgorithm {
    /// Least recently used (`effectiveCount` = 0). The default.
    #[default]
    Lru,
    /// Least frequently used (`effectiveCount` = delivered-hit access count).
    Lfu,
}

impl EvictionAlgorithm {
    /// Policy string to algorithm: lower-cased `"lfu"` is LFU, anything else
    /// (including `""` and unknown values) is LRU.
    pub fn from_policy_str(s: &str) -> Self {
        if s.eq_ignore_ascii_case("lfu") {
            Self::Lfu
        } else {
            Self::Lru
        }
    }

    /// Metric label: `lru` or `lfu`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::Lfu => "lfu",
        }
    }
}

/// Per-tenant policy lookups. Implementations must be cheap and must never call
/// back into the index. Every method has a "no policy" default.
pub trait PolicyResolver: Send + Sync {
    /// Tenant TTL. `None` or a zero duration means the index default (30 min).
    fn ttl(&self, _tenant: &str) -> Option<Duration> {
        None
    }

    /// Tenant eviction algorithm (default LRU). Resolved at sweep/sort time.
    fn eviction_algorithm(&self, _tenant: &str) -> EvictionAlgorithm {
        EvictionAlgorithm::Lru
    }

    /// Tenant quota in distinct prefixes. `None` = unbounded; `Some(0)` admits
    /// nothing; a negative budget is ignored (no enforcement).
    fn tenant_quota(&self, _tenant: &str) -> Option<i64> {
        None
    }
}

/// A resolver with no policy at all: default TTL, LRU, no quotas.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoPolicy;

impl PolicyResolver for NoPolicy {}

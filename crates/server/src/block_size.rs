//! Each scope's engine block size, learned from its producers.
//!
//! A `token_ids` / `prompt_text` lookup is fingerprinted by the server, so it
//! must cut the prompt into blocks of the size the engines use; a different
//! size gives fingerprints no engine block has, and every such lookup misses
//! without a word (vLLM on CPU accepts only multiples of 32, while
//! `--engine-block-size` defaults to the reference's 16). Producers that know
//! the size (our sidecar reads it from every `BlockStored`) say it in
//! `CacheStateUpdate.block_size`, our additive field; the server keeps, per
//! (tenant, model), what each replica said and fingerprints that scope's
//! lookups with the size most of its replicas report. The configured size
//! stays the fallback for scopes whose producers say nothing (the reference's
//! sidecar), so with reference producers nothing changes.
//!
//! A learned size that differs from the configured one, or replicas of one
//! scope that disagree, is logged (once per change), counted in
//! `inferencecache_engine_block_size_mismatch` and reported by `doctor`.

use inferencecache_proto::v1alpha1::CacheStateUpdate;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Labels of the block-size gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScopeLabels {
    /// Tenant of the scope.
    pub tenant_id: String,
    /// Model of the scope.
    pub model: String,
}

/// The block-size metrics.
#[derive(Debug, Clone, Default)]
pub struct BlockSizeMetrics {
    /// The size lookups of a scope use, as its producers report it.
    pub learned: Family<ScopeLabels, Gauge>,
    /// 1 while a scope's producers report a size other than the configured
    /// one, or disagree among themselves.
    pub mismatch: Family<ScopeLabels, Gauge>,
}

impl BlockSizeMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "inferencecache_engine_block_size",
            "Engine block size (tokens) the producers of a tenant and model report; token_ids and prompt_text lookups use it",
            m.learned.clone(),
        );
        registry.register(
            "inferencecache_engine_block_size_mismatch",
            "1 when a scope's producers report a block size other than --engine-block-size, or disagree among themselves",
            m.mismatch.clone(),
        );
        m
    }
}

#[derive(Debug, Default)]
struct Scope {
    by_replica: HashMap<String, u32>,
    effective: u32,
}

impl Scope {
    /// The size most replicas report; a tie keeps the current one if it is
    /// among the tied, else the largest.
    fn elect(&self) -> u32 {
        let mut votes: HashMap<u32, usize> = HashMap::new();
        for &b in self.by_replica.values() {
            *votes.entry(b).or_default() += 1;
        }
        let top = votes.values().copied().max().unwrap_or(0);
        if votes.get(&self.effective) == Some(&top) {
            return self.effective;
        }
        votes
            .into_iter()
            .filter(|&(_, n)| n == top)
            .map(|(b, _)| b)
            .max()
            .unwrap_or(0)
    }

    fn agreed(&self) -> bool {
        self.by_replica.values().all(|&b| b == self.effective)
    }
}

/// Learned block sizes by tenant, then model. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct BlockSizes {
    configured: u32,
    scopes: Arc<RwLock<HashMap<String, HashMap<String, Scope>>>>,
    metrics: BlockSizeMetrics,
}

impl BlockSizes {
    /// Sizes that fall back to `configured` (`--engine-block-size`).
    pub fn new(configured: u32, metrics: BlockSizeMetrics) -> Self {
        Self {
            configured,
            scopes: Arc::default(),
            metrics,
        }
    }

    /// The configured size.
    pub fn configured(&self) -> u32 {
        self.configured
    }

    /// The size to fingerprint a lookup of (`tenant`, `model`) with.
    pub fn for_scope(&self, tenant: &str, model: &str) -> u32 {
        let scopes = self.scopes.read().unwrap_or_else(|p| p.into_inner());
        scopes
            .get(tenant)
            .and_then(|m| m.get(model))
            .map_or(self.configured, |s| s.effective)
    }

    /// Learns from one report (a no-op when it says no size or repeats what
    /// its replica said before).
    pub fn learn(&self, u: &CacheStateUpdate) {
        let Ok(size) = u32::try_from(u.block_size) else {
            return;
        };
        if size == 0 {
            return;
        }
        {
            let scopes = self.scopes.read().unwrap_or_else(|p| p.into_inner());
            let known = scopes
                .get(&u.tenant_id)
                .and_then(|m| m.get(&u.model_id))
                .and_then(|s| s.by_replica.get(&u.replica_id));
            if known == Some(&size) {
                return;
            }
        }
        let mut scopes = self.scopes.write().unwrap_or_else(|p| p.into_inner());
        let scope = scopes
            .entry(u.tenant_id.clone())
            .or_default()
            .entry(u.model_id.clone())
            .or_default();
        scope.by_replica.insert(u.replica_id.clone(), size);
        let before = scope.effective;
        scope.effective = scope.elect();
        let labels = ScopeLabels {
            tenant_id: u.tenant_id.clone(),
            model: u.model_id.clone(),
        };
        self.metrics
            .learned
            .get_or_create(&labels)
            .set(i64::from(scope.effective));
        let agreed = scope.agreed();
        let mismatch = scope.effective != self.configured || !agreed;
        self.metrics
            .mismatch
            .get_or_create(&labels)
            .set(i64::from(mismatch));
        if !agreed {
            let sizes: std::collections::BTreeMap<&str, u32> = scope
                .by_replica
                .iter()
                .map(|(r, &b)| (r.as_str(), b))
                .collect();
            tracing::warn!(
                tenant_id = %u.tenant_id,
                model = %u.model_id,
                using = scope.effective,
                reported = ?sizes,
                "replicas of one model report different engine block sizes: lookups by token_ids or prompt_text use the majority's and miss on the others; give every replica of a model the same --block-size"
            );
        } else if scope.effective != before && scope.effective != self.configured {
            tracing::warn!(
                tenant_id = %u.tenant_id,
                model = %u.model_id,
                engine_block_size = scope.effective,
                configured = self.configured,
                "the engines report a block size other than --engine-block-size: token_ids and prompt_text lookups of this model use the engines' size; set --engine-block-size to it to silence this"
            );
        }
    }

    /// Every learned scope: (tenant, model, size used, replicas agree).
    pub fn scopes(&self) -> Vec<(String, String, u32, bool)> {
        let scopes = self.scopes.read().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<_> = scopes
            .iter()
            .flat_map(|(t, m)| {
                m.iter()
                    .map(|(m, s)| (t.clone(), m.clone(), s.effective, s.agreed()))
            })
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(replica: &str, size: i32) -> CacheStateUpdate {
        CacheStateUpdate {
            replica_id: replica.into(),
            model_id: "m".into(),
            tenant_id: "t".into(),
            block_size: size,
            ..CacheStateUpdate::default()
        }
    }

    #[test]
    fn a_scope_uses_what_its_producers_say_else_the_configured_size() {
        let b = BlockSizes::new(16, BlockSizeMetrics::default());
        assert_eq!(b.for_scope("t", "m"), 16);
        b.learn(&report("a", 0));
        assert_eq!(b.for_scope("t", "m"), 16, "0 says nothing");
        b.learn(&report("a", 32));
        assert_eq!(b.for_scope("t", "m"), 32);
        assert_eq!(b.for_scope("t", "other"), 16);
        assert_eq!(b.for_scope("u", "m"), 16);
        let mismatch = |b: &BlockSizes| {
            b.metrics
                .mismatch
                .get_or_create(&ScopeLabels {
                    tenant_id: "t".into(),
                    model: "m".into(),
                })
                .get()
        };
        assert_eq!(mismatch(&b), 1, "32 is not the configured 16");
        let agree = BlockSizes::new(32, BlockSizeMetrics::default());
        agree.learn(&report("a", 32));
        assert_eq!(mismatch(&agree), 0);
    }

    #[test]
    fn disagreeing_replicas_elect_the_majority_and_are_flagged() {
        let b = BlockSizes::new(32, BlockSizeMetrics::default());
        b.learn(&report("a", 32));
        b.learn(&report("b", 64));
        assert_eq!(b.for_scope("t", "m"), 32, "a tie keeps the current size");
        b.learn(&report("c", 64));
        assert_eq!(b.for_scope("t", "m"), 64);
        assert_eq!(b.scopes(), vec![("t".into(), "m".into(), 64, false)]);
        b.learn(&report("a", 64));
        assert_eq!(b.scopes(), vec![("t".into(), "m".into(), 64, true)]);
    }
}

//! Aggregates (§2.7, §2.8): cache state, per-tenant totals, gauge source.

use crate::index::Index;
use crate::sync::{lock, read};
use crate::types::{Aggregate, CacheState, ReplicaStatsView};
use std::sync::Arc;

/// A distinct prefix is "hot" when the LFU access counts of its holders sum to
/// at least this. Delivered hits are counted for every tenant (issue 15);
/// only LFU tenants' cap eviction reads the counts (§2.5.5).
pub const HOT_PREFIX_MIN_HITS: u64 = 1;

impl Index {
    /// `GetCacheState(tenant, model)`: stats of every replica (sorted by id),
    /// distinct prefixes of (tenant, model) across schemes and adapters, and
    /// hot prefixes. No empty-key guard (quirk 13).
    pub fn cache_state(&self, tenant: &str, model: &str) -> CacheState {
        let Some(tm) = read(&self.store.catalog).find_tm(tenant, model) else {
            return CacheState::default();
        };
        let total = read(&self.store.counters).tm_keys(tm) as i64;
        let hot = if total > 0 {
            self.count_hot(|p| p == tm)
        } else {
            0
        };
        let mut replicas: Vec<ReplicaStatsView> = {
            let stats = self.stats.read();
            let catalog = read(&self.store.catalog);
            stats
                .get(&tm)
                .map(|m| {
                    m.iter()
                        .map(|(&r, s)| s.view(catalog.replica_name(r)))
                        .collect()
                })
                .unwrap_or_default()
        };
        replicas.sort_by(|a, b| a.replica_id.cmp(&b.replica_id));
        CacheState {
            replicas,
            total_prefixes: total,
            hot_prefixes: hot,
        }
    }

    /// Count hot distinct prefixes among keys whose (tenant, model) id passes `want`.
    pub(crate) fn count_hot(&self, want: impl Fn(u32) -> bool) -> i64 {
        let mut hot = 0i64;
        self.scan_keys(|p, _, holders| {
            if want(p.tm_id)
                && holders.iter().map(|h| holders.access(h)).sum::<u64>() >= HOT_PREFIX_MIN_HITS
            {
                hot += 1;
            }
        });
        hot
    }

    /// Distinct prefixes per tenant, reserved tenants excluded.
    pub fn aggregate(&self) -> Aggregate {
        let (names, reserved): (Vec<Arc<str>>, Vec<bool>) = {
            let c = read(&self.store.catalog);
            (
                (0..c.tenant_count() as u32)
                    .map(|i| c.tenant_name(i))
                    .collect(),
                c.tenant_reserved.clone(),
            )
        };
        let counts: Vec<u64> = read(&self.store.counters).keys_by_tenant.clone();
        let mut per_tenant: Vec<(Arc<str>, i64)> = counts
            .iter()
            .enumerate()
            .filter(|&(i, &n)| n > 0 && !reserved.get(i).copied().unwrap_or(false))
            .filter_map(|(i, &n)| names.get(i).map(|t| (t.clone(), n as i64)))
            .collect();
        per_tenant.sort_by(|a, b| a.0.cmp(&b.0));
        Aggregate {
            total: per_tenant.iter().map(|x| x.1).sum(),
            per_tenant,
        }
    }

    /// Gauge source (§2.8): distinct prefixes per model across tenants,
    /// reserved tenants excluded. Models that drained since the previous call
    /// are reported once with 0, then forgotten. Calls are serialized.
    pub fn entry_counts_by_model(&self) -> Vec<(Arc<str>, u64)> {
        let mut out = Vec::new();
        self.report_entry_counts(|m, n| out.push((m.clone(), n)));
        out
    }

    /// Like [`Index::entry_counts_by_model`], but calls `sink(model, count)`
    /// (in model order) while still holding the gauge mutex, so concurrent
    /// reporters can never apply an older snapshot after a newer one. The
    /// sink must be quick and must not call back into the index.
    pub fn report_entry_counts(&self, mut sink: impl FnMut(&Arc<str>, u64)) {
        let mut last = lock(&self.store.gauge);
        let counts: Vec<u64> = read(&self.store.counters).keys_by_model.clone();
        let catalog = read(&self.store.catalog);
        let mut out = Vec::new();
        let n = counts.len().max(last.len());
        last.resize(n, false);
        for (i, was) in last.iter_mut().enumerate() {
            let c = counts.get(i).copied().unwrap_or(0);
            if c > 0 || *was {
                out.push((catalog.model_name(i as u32), c));
            }
            *was = c > 0;
        }
        drop(catalog);
        out.sort_by(|a, b| a.0.cmp(&b.0));
        for (m, n) in &out {
            sink(m, *n);
        }
    }
}

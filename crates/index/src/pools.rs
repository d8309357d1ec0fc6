//! Read-only helpers for routing within a fixed pool of replicas
//! (LookupPDRoute's prefill and decode pools): which hash schemes a
//! (tenant, model) is served under, and each pool member's load as the
//! ranking sees it.

use crate::index::Index;
use crate::ranking::freshness;
use crate::sync::read;
use std::sync::Arc;

impl Index {
    /// The hash schemes at least one replica serves for (tenant, model),
    /// sorted. A caller without a `hash_scheme` (LookupPDRoute carries none)
    /// looks its prefix up in each of these domains separately, so bytes are
    /// still only ever matched within one scheme.
    pub fn served_hash_schemes(&self, tenant: &str, model: &str) -> Vec<Arc<str>> {
        let scopes: Vec<(u32, Arc<str>)> = {
            let c = read(&self.store.catalog);
            let Some(tm) = c.find_tm(tenant, model) else {
                return Vec::new();
            };
            c.tms
                .get(tm as usize)
                .map(|t| {
                    t.scopes
                        .iter()
                        .filter_map(|&s| Some((s, c.scope_scheme(s)?)))
                        .collect()
                })
                .unwrap_or_default()
        };
        let counters = read(&self.store.counters);
        let mut out: Vec<Arc<str>> = scopes
            .into_iter()
            .filter(|(s, _)| counters.scope_len(*s) > 0)
            .map(|(_, scheme)| scheme)
            .collect();
        out.sort();
        out
    }

    /// Each replica's pressure for (tenant, model), in `replicas` order: the
    /// last reported `pressure` while its stats are fresh under the tenant's
    /// TTL, else 0 — the same value the ranking's pressure factor uses.
    pub fn replica_pressures<S: AsRef<str>>(
        &self,
        tenant: &str,
        model: &str,
        replicas: &[S],
    ) -> Vec<f32> {
        let (tm, ids): (Option<u32>, Vec<Option<u32>>) = {
            let c = read(&self.store.catalog);
            (
                c.find_tm(tenant, model),
                replicas
                    .iter()
                    .map(|r| c.find_replica(r.as_ref()))
                    .collect(),
            )
        };
        let Some(tm) = tm else {
            return vec![0.0; replicas.len()];
        };
        let now = self.now();
        let ttl = self.tenant_ttl_ns(tenant);
        let stats = self.stats.read();
        let per_replica = stats.get(&tm);
        ids.iter()
            .map(|id| {
                id.and_then(|id| per_replica?.get(&id))
                    .filter(|s| freshness(now, s.stats_reported, ttl) > 0.0)
                    .map_or(0.0, |s| s.pressure)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use crate::{CacheUpdate, IndexConfig, PrefixEntry, ReplicaStatsReport};

    fn update(replica: &str, scheme: &str, pressure: Option<f32>) -> CacheUpdate {
        CacheUpdate {
            replica_id: replica.into(),
            model_id: "m".into(),
            tenant_id: "t".into(),
            hash_scheme: scheme.into(),
            prefixes: vec![PrefixEntry {
                prefix_hash: vec![1; 8],
                token_count: 64,
                ..PrefixEntry::default()
            }],
            stats: pressure.map(|p| ReplicaStatsReport {
                pressure: p,
                ..ReplicaStatsReport::default()
            }),
            ..CacheUpdate::default()
        }
    }

    #[test]
    fn schemes_are_the_served_ones_sorted() {
        let idx = IndexConfig::new().build();
        assert!(idx.served_hash_schemes("t", "m").is_empty());
        idx.ingest(&update("r1", "vllm", None));
        idx.ingest(&update("r2", "sglang", None));
        let s: Vec<String> = idx
            .served_hash_schemes("t", "m")
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(s, ["sglang", "vllm"]);
        assert!(idx.served_hash_schemes("t", "other").is_empty());
    }

    #[test]
    fn pressures_follow_fresh_stats_and_default_to_zero() {
        let idx = IndexConfig::new().build();
        idx.ingest(&update("busy", "vllm", Some(0.75)));
        idx.ingest(&update("idle", "vllm", Some(0.1)));
        assert_eq!(
            idx.replica_pressures("t", "m", &["idle", "unknown", "busy"]),
            [0.1, 0.0, 0.75]
        );
        assert_eq!(idx.replica_pressures("x", "m", &["busy"]), [0.0]);
    }
}

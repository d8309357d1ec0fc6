//! `/snapshot` rows (§2.7), reserved tenants excluded everywhere.

use crate::aggregate::HOT_PREFIX_MIN_HITS;
use crate::index::Index;
use crate::stats::StatsEntry;
use crate::sync::read;
use crate::types::{Snapshot, SnapshotReplica, SnapshotTenant};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

impl Index {
    /// Build the snapshot: one row per (tenant, replica) holding stats or
    /// entries, tenant rows, totals.
    pub fn snapshot(&self) -> Snapshot {
        let (tm_info, tenant_names, reserved, replica_names) = {
            let c = read(&self.store.catalog);
            let tms: Vec<(u32, Arc<str>)> = c
                .tms
                .iter()
                .map(|t| (t.tenant_id, t.model.clone()))
                .collect();
            let names: Vec<Arc<str>> = (0..c.tenant_count() as u32)
                .map(|i| c.tenant_name(i))
                .collect();
            (
                tms,
                names,
                c.tenant_reserved.clone(),
                c.replica_names().to_vec(),
            )
        };
        let is_reserved = |t: u32| reserved.get(t as usize).copied().unwrap_or(false);

        // Prefix side: (tenant id, replica) → (count, max last_seen).
        let mut prefix_side: HashMap<(u32, u32), (i64, i64)> = HashMap::new();
        let mut hot = 0i64;
        self.scan_keys(|p, _, holders| {
            if p.reserved {
                return;
            }
            let mut sum = 0u64;
            for h in holders.iter() {
                let e = prefix_side
                    .entry((p.tenant_id, h.replica()))
                    .or_insert((0, i64::MIN));
                e.0 += 1;
                e.1 = e.1.max(h.last_seen);
                sum += holders.access(h);
            }
            if sum >= HOT_PREFIX_MIN_HITS {
                hot += 1;
            }
        });

        // Stats side: (tenant id, replica) → latest stats across models.
        let mut stats_side: HashMap<(u32, u32), (StatsEntry, Arc<str>)> = HashMap::new();
        {
            let stats = self.stats.read();
            for (&tm, m) in stats.iter() {
                let Some((tid, model)) = tm_info.get(tm as usize) else {
                    continue;
                };
                if is_reserved(*tid) {
                    continue;
                }
                for (&r, s) in m {
                    let slot = stats_side.entry((*tid, r));
                    match slot {
                        std::collections::hash_map::Entry::Vacant(v) => {
                            v.insert((s.clone(), model.clone()));
                        }
                        std::collections::hash_map::Entry::Occupied(mut o) => {
                            let (cur, cur_model) = o.get();
                            if s.last_seen > cur.last_seen
                                || (s.last_seen == cur.last_seen && model < cur_model)
                            {
                                o.insert((s.clone(), model.clone()));
                            }
                        }
                    }
                }
            }
        }

        let name =
            |v: &[Arc<str>], i: u32| v.get(i as usize).cloned().unwrap_or_else(|| Arc::from(""));
        let mut keys: Vec<(u32, u32)> = prefix_side
            .keys()
            .chain(stats_side.keys())
            .copied()
            .collect();
        keys.sort_unstable();
        keys.dedup();
        // Tentative side: (tenant id, replica) → unexpired holdings.
        let parts = self.partitions();
        let mut tentative: HashMap<(u32, u32), i64> = HashMap::new();
        let mut tentative_total = 0i64;
        for (p, r, n) in self.routing.tentative.counts(self.now()) {
            if let Some(part) = parts.get(p as usize).filter(|x| !x.reserved) {
                *tentative.entry((part.tenant_id, r)).or_default() += n as i64;
                tentative_total += n as i64;
            }
        }
        let mut replicas: Vec<SnapshotReplica> = keys
            .iter()
            .map(|&(t, r)| {
                let mut row = SnapshotReplica {
                    replica_id: name(&replica_names, r),
                    tenant: name(&tenant_names, t),
                    client_version: Arc::from(""),
                    ..SnapshotReplica::default()
                };
                row.tentative_count = tentative.get(&(t, r)).copied().unwrap_or(0);
                if let Some(&(n, last)) = prefix_side.get(&(t, r)) {
                    row.prefix_count = n;
                    row.last_event_at_ns = Some(last);
                }
                if let Some((s, _)) = stats_side.get(&(t, r)) {
                    row.cache_memory_bytes = s.cache_memory_bytes;
                    row.hit_rate = s.hit_rate;
                    row.pressure = s.pressure;
                    row.last_update_ns = Some(s.last_seen);
                    row.stats_reported = true;
                    row.t2_hit_tokens = s.t2_hit_tokens;
                    row.t2_query_tokens = s.t2_query_tokens;
                    row.client_version = s.client_version.clone();
                    row.load = s.load;
                }
                row
            })
            .collect();
        replicas.sort_by(|a, b| {
            a.tenant
                .cmp(&b.tenant)
                .then_with(|| a.replica_id.cmp(&b.replica_id))
        });

        let agg = self.aggregate();
        let mut tenants: BTreeMap<Arc<str>, SnapshotTenant> = BTreeMap::new();
        let mut rates: HashMap<Arc<str>, (f64, u32)> = HashMap::new();
        for ((t, _), (s, _)) in &stats_side {
            let e = rates.entry(name(&tenant_names, *t)).or_insert((0.0, 0));
            e.0 += f64::from(s.hit_rate);
            e.1 += 1;
        }
        let mut touch = |t: Arc<str>| {
            tenants.entry(t.clone()).or_insert_with(|| SnapshotTenant {
                tenant_id: t,
                ..SnapshotTenant::default()
            });
        };
        for (t, _) in &agg.per_tenant {
            touch(t.clone());
        }
        for t in rates.keys() {
            touch(t.clone());
        }
        for (t, row) in tenants.iter_mut() {
            row.index_entries = agg.per_tenant.iter().find(|x| x.0 == *t).map_or(0, |x| x.1);
            if let Some(&(sum, n)) = rates.get(t) {
                if n > 0 {
                    row.hit_rate = (sum / f64::from(n)) as f32;
                    row.hit_rate_reported = true;
                }
            }
        }
        Snapshot {
            replicas,
            tenants: tenants.into_values().collect(),
            total_prefixes: agg.total,
            hot_prefixes: hot,
            tentative_entries: tentative_total,
        }
    }
}

//! Counters maintained in lockstep with the shards (updated while the shard
//! write lock is held; lock order is always shard → counters).

use crate::catalog::Partition;
use crate::hashing::FoldBuild;
use std::collections::HashMap;

/// Index-wide counters, indexed by interned ids.
#[derive(Default)]
pub(crate) struct Counters {
    /// (key, replica) pairs — the cap unit.
    pub(crate) total_entries: u64,
    /// Subset of `total_entries` under reserved tenants.
    pub(crate) reserved_entries: u64,
    /// Distinct keys (all tenants) — the cold-start test.
    pub(crate) total_keys: u64,
    /// Distinct keys per tenant id.
    pub(crate) keys_by_tenant: Vec<u64>,
    /// Distinct keys per (tenant, model) id.
    pub(crate) keys_by_tm: Vec<u64>,
    /// Distinct keys per model id, non-reserved tenants only (gauge source).
    pub(crate) keys_by_model: Vec<u64>,
    /// Per scope id: replica → number of keys held (entry dropped at 0).
    pub(crate) serving: Vec<HashMap<u32, u64, FoldBuild>>,
}

fn slot<T: Default>(v: &mut Vec<T>, i: u32) -> &mut T {
    let i = i as usize;
    if v.len() <= i {
        v.resize_with(i + 1, T::default);
    }
    &mut v[i]
}

fn dec(v: &mut u64) {
    *v = v.saturating_sub(1);
}

impl Counters {
    pub(crate) fn on_add(&mut self, p: &Partition, replica: u32, new_key: bool) {
        self.total_entries += 1;
        if p.reserved {
            self.reserved_entries += 1;
        }
        *slot(&mut self.serving, p.scope_id)
            .entry(replica)
            .or_insert(0) += 1;
        if new_key {
            self.total_keys += 1;
            *slot(&mut self.keys_by_tenant, p.tenant_id) += 1;
            *slot(&mut self.keys_by_tm, p.tm_id) += 1;
            if !p.reserved {
                *slot(&mut self.keys_by_model, p.model_id) += 1;
            }
        }
    }

    pub(crate) fn on_remove(&mut self, p: &Partition, replica: u32, key_removed: bool) {
        dec(&mut self.total_entries);
        if p.reserved {
            dec(&mut self.reserved_entries);
        }
        let scope = slot(&mut self.serving, p.scope_id);
        if let Some(n) = scope.get_mut(&replica) {
            dec(n);
            if *n == 0 {
                scope.remove(&replica);
            }
        }
        if key_removed {
            dec(&mut self.total_keys);
            dec(slot(&mut self.keys_by_tenant, p.tenant_id));
            dec(slot(&mut self.keys_by_tm, p.tm_id));
            if !p.reserved {
                dec(slot(&mut self.keys_by_model, p.model_id));
            }
        }
    }

    pub(crate) fn tenant_keys(&self, id: u32) -> u64 {
        self.keys_by_tenant.get(id as usize).copied().unwrap_or(0)
    }

    pub(crate) fn tm_keys(&self, id: u32) -> u64 {
        self.keys_by_tm.get(id as usize).copied().unwrap_or(0)
    }

    pub(crate) fn scope(&self, id: u32) -> Option<&HashMap<u32, u64, FoldBuild>> {
        self.serving.get(id as usize)
    }

    pub(crate) fn scope_len(&self, id: u32) -> usize {
        self.scope(id).map_or(0, HashMap::len)
    }

    pub(crate) fn serves(&self, scope: u32, replica: u32) -> bool {
        self.scope(scope)
            .is_some_and(|s| s.get(&replica).is_some_and(|&n| n > 0))
    }
}

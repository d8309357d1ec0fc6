//! Interning of strings into small ids: partitions (tenant, model, scheme,
//! adapter), tenants, (tenant, model) pairs, serving scopes (tenant, model,
//! scheme), model names and replicas. Ids are dense `u32`s used to index
//! counter vectors. Partition, tenant and model names are never freed (their
//! number is bounded by the deployment's tenants × models × schemes ×
//! adapters). Replica ids are: a replica that holds no entry and has no stats
//! record is released by the sweep (`replicas.rs`), and its id is reused one
//! sweep later, so a lookup that read the id just before the release still
//! resolves the old name.

use crate::arena::MAX_REPLICA_IDS;
use crate::hashing::{FoldBuild, hash_strs};
use crate::name_order::NameOrder;
use crate::replica_table::{Epoch, MAX_TABLE, ReplicaTable};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// One (tenant, model, scheme, adapter) partition.
#[derive(Debug)]
pub(crate) struct Partition {
    pub(crate) id: u32,
    pub(crate) tenant: Arc<str>,
    pub(crate) model: Arc<str>,
    pub(crate) scheme: Arc<str>,
    pub(crate) adapter: Arc<str>,
    pub(crate) tenant_id: u32,
    pub(crate) tm_id: u32,
    pub(crate) scope_id: u32,
    pub(crate) model_id: u32,
    pub(crate) reserved: bool,
    /// Replicas serving the partition's scope, mirrored from the counters
    /// (shared by every partition of the scope) so lookups read it without a lock.
    pub(crate) serving: Arc<AtomicUsize>,
}

/// Tuple interner: hash of the strings → candidate ids, compared on hit.
#[derive(Default)]
struct TupleMap<const N: usize> {
    buckets: HashMap<u64, Vec<u32>, FoldBuild>,
    items: Vec<[Arc<str>; N]>,
}

impl<const N: usize> TupleMap<N> {
    fn get(&self, key: &[&str; N]) -> Option<u32> {
        let h = hash_strs(key);
        let cands = self.buckets.get(&h)?;
        cands.iter().copied().find(|&id| {
            self.items
                .get(id as usize)
                .is_some_and(|it| it.iter().zip(key.iter()).all(|(a, b)| **a == **b))
        })
    }

    /// Returns (id, newly created).
    fn intern(&mut self, key: &[&str; N], make: impl FnOnce() -> [Arc<str>; N]) -> (u32, bool) {
        if let Some(id) = self.get(key) {
            return (id, false);
        }
        let id = self.items.len() as u32;
        self.items.push(make());
        self.buckets.entry(hash_strs(key)).or_default().push(id);
        (id, true)
    }
}

/// Simple string interner. Ids released with [`NameMap::release`] wait in
/// `quarantine` until [`NameMap::recycle`] makes them reusable.
#[derive(Default)]
struct NameMap {
    map: HashMap<Arc<str>, u32, FoldBuild>,
    names: Vec<Arc<str>>,
    quarantine: Vec<u32>,
    free: Vec<u32>,
    /// One bit per id in `quarantine` (its slot still holds its old name).
    released: Vec<u64>,
}

impl NameMap {
    fn get(&self, s: &str) -> Option<u32> {
        self.map.get(s).copied()
    }

    fn intern(&mut self, s: &str) -> (u32, Arc<str>) {
        if let Some(&id) = self.map.get(s) {
            return (id, self.names[id as usize].clone());
        }
        let a: Arc<str> = Arc::from(s);
        let id = match self.free.pop() {
            Some(id) => {
                if let Some(slot) = self.names.get_mut(id as usize) {
                    *slot = a.clone();
                }
                id
            }
            None => {
                self.names.push(a.clone());
                self.names.len() as u32 - 1
            }
        };
        self.map.insert(a.clone(), id);
        (id, a)
    }

    /// Forgets the name of `id` and returns it (`None` when `id` was not
    /// live); the id stays reserved until the next [`NameMap::recycle`]
    /// (its slot keeps the old name meanwhile).
    fn release(&mut self, id: u32) -> Option<&Arc<str>> {
        let name = self.names.get(id as usize)?;
        if self.map.get(name) != Some(&id) {
            return None;
        }
        self.map.remove(name);
        self.quarantine.push(id);
        let w = id as usize / 64;
        if self.released.len() <= w {
            self.released.resize(w + 1, 0);
        }
        self.released[w] |= 1 << (id % 64);
        Some(name)
    }

    /// Makes the ids released before the previous call reusable.
    fn recycle(&mut self) {
        for &id in &self.quarantine {
            self.released[id as usize / 64] &= !(1 << (id % 64));
        }
        self.free.append(&mut self.quarantine);
        // An empty name costs no heap; the slot is overwritten on reuse.
        let empty: Arc<str> = Arc::from("");
        for &id in &self.free {
            if let Some(slot) = self.names.get_mut(id as usize) {
                *slot = empty.clone();
            }
        }
        if self.map.is_empty() {
            self.map.shrink_to_fit();
        }
    }
}

/// (tenant, model) info.
pub(crate) struct TenantModel {
    pub(crate) tenant_id: u32,
    pub(crate) tenant: Arc<str>,
    pub(crate) model: Arc<str>,
    /// Partition ids under this (tenant, model).
    pub(crate) parts: Vec<u32>,
    /// The same partitions, shared so an event takes them with one
    /// reference-count bump (rebuilt when a partition is interned).
    pub(crate) part_refs: Arc<[Arc<Partition>]>,
    /// Scope ids under this (tenant, model).
    pub(crate) scopes: Vec<u32>,
}

/// All interned names.
#[derive(Default)]
pub(crate) struct Catalog {
    part_map: TupleMap<4>,
    pub(crate) parts: Vec<Arc<Partition>>,
    tenants: NameMap,
    pub(crate) tenant_reserved: Vec<bool>,
    tm_map: TupleMap<2>,
    pub(crate) tms: Vec<TenantModel>,
    scope_map: TupleMap<3>,
    /// Per scope id: the shared serving-replica count (see [`Partition::serving`]).
    scope_serving: Vec<Arc<AtomicUsize>>,
    models: NameMap,
    replicas: NameMap,
    /// Byte-order labels of the live replica names (ranking tie-breaks).
    replica_order: NameOrder,
    /// Names and labels as lookups read them without this catalog's lock
    /// (`None` past [`MAX_TABLE`] ids), and its epoch.
    replica_table: Option<Arc<ReplicaTable>>,
    table_epoch: Epoch,
}

impl Catalog {
    pub(crate) fn find_partition(
        &self,
        t: &str,
        m: &str,
        s: &str,
        a: &str,
    ) -> Option<&Arc<Partition>> {
        self.part_map
            .get(&[t, m, s, a])
            .and_then(|id| self.parts.get(id as usize))
    }

    pub(crate) fn intern_partition(
        &mut self,
        t: &str,
        m: &str,
        s: &str,
        a: &str,
        reserved: &dyn Fn(&str) -> bool,
    ) -> Arc<Partition> {
        if let Some(p) = self.find_partition(t, m, s, a) {
            return p.clone();
        }
        let (tenant_id, tenant) = self.intern_tenant(t, reserved);
        let tm_id = self.intern_tm(t, m, reserved);
        let model = self.tms[tm_id as usize].model.clone();
        let (scope_id, new_scope) = self
            .scope_map
            .intern(&[t, m, s], || [tenant.clone(), model.clone(), Arc::from(s)]);
        if new_scope {
            self.scope_serving.push(Arc::new(AtomicUsize::new(0)));
            self.tms[tm_id as usize].scopes.push(scope_id);
        }
        let scheme = self.scope_map.items[scope_id as usize][2].clone();
        let (model_id, _) = self.models.intern(m);
        let id = self.parts.len() as u32;
        let adapter: Arc<str> = Arc::from(a);
        self.part_map.intern(&[t, m, s, a], || {
            [
                tenant.clone(),
                model.clone(),
                scheme.clone(),
                adapter.clone(),
            ]
        });
        let p = Arc::new(Partition {
            id,
            tenant,
            model,
            scheme,
            adapter,
            tenant_id,
            tm_id,
            scope_id,
            model_id,
            reserved: self.tenant_reserved[tenant_id as usize],
            serving: self
                .scope_serving
                .get(scope_id as usize)
                .cloned()
                .unwrap_or_default(),
        });
        self.parts.push(p.clone());
        let tm = &mut self.tms[tm_id as usize];
        tm.parts.push(id);
        tm.part_refs = tm
            .parts
            .iter()
            .filter_map(|&i| self.parts.get(i as usize).cloned())
            .collect();
        p
    }

    fn intern_tenant(&mut self, t: &str, reserved: &dyn Fn(&str) -> bool) -> (u32, Arc<str>) {
        let (id, name) = self.tenants.intern(t);
        if id as usize >= self.tenant_reserved.len() {
            self.tenant_reserved.push(reserved(t));
        }
        (id, name)
    }

    pub(crate) fn intern_tm(&mut self, t: &str, m: &str, reserved: &dyn Fn(&str) -> bool) -> u32 {
        if let Some(id) = self.tm_map.get(&[t, m]) {
            return id;
        }
        let (tenant_id, tenant) = self.intern_tenant(t, reserved);
        let model: Arc<str> = Arc::from(m);
        let (id, _) = self
            .tm_map
            .intern(&[t, m], || [tenant.clone(), model.clone()]);
        self.tms.push(TenantModel {
            tenant_id,
            tenant,
            model,
            parts: Vec::new(),
            part_refs: Arc::from([]),
            scopes: Vec::new(),
        });
        id
    }

    pub(crate) fn find_tenant(&self, t: &str) -> Option<u32> {
        self.tenants.get(t)
    }

    pub(crate) fn tenant_name(&self, id: u32) -> Arc<str> {
        self.tenants
            .names
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| Arc::from(""))
    }

    pub(crate) fn tenant_count(&self) -> usize {
        self.tenants.names.len()
    }

    pub(crate) fn find_tm(&self, t: &str, m: &str) -> Option<u32> {
        self.tm_map.get(&[t, m])
    }

    pub(crate) fn find_scope(&self, t: &str, m: &str, s: &str) -> Option<u32> {
        self.scope_map.get(&[t, m, s])
    }

    /// The hash scheme of a serving scope.
    pub(crate) fn scope_scheme(&self, scope: u32) -> Option<Arc<str>> {
        self.scope_map
            .items
            .get(scope as usize)
            .map(|s| s[2].clone())
    }

    pub(crate) fn model_name(&self, id: u32) -> Arc<str> {
        self.models
            .names
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| Arc::from(""))
    }

    pub(crate) fn find_replica(&self, r: &str) -> Option<u32> {
        self.replicas.get(r)
    }

    /// Interns a replica id; `None` when `limit` (> 0) live ids exist and
    /// `r` is not one of them, or when a new name would need an id past
    /// what a holder stores ([`MAX_REPLICA_IDS`], 16.7 M: even with no
    /// limit configured).
    pub(crate) fn intern_replica(&mut self, r: &str, limit: usize) -> Option<(u32, Arc<str>)> {
        self.intern_replica_below(r, limit, MAX_REPLICA_IDS)
    }

    /// [`Catalog::intern_replica`] with the id space as a parameter (tests
    /// reach its end without 16.7 M names).
    fn intern_replica_below(
        &mut self,
        r: &str,
        limit: usize,
        ids: usize,
    ) -> Option<(u32, Arc<str>)> {
        if self.replicas.get(r).is_some() {
            return Some(self.replicas.intern(r));
        }
        let full = limit > 0 && self.replicas.map.len() >= limit;
        let no_id = self.replicas.free.is_empty() && self.replicas.names.len() >= ids;
        if full || no_id {
            return None;
        }
        let (id, name) = self.replicas.intern(r);
        self.replica_order.insert(name.clone(), id);
        self.publish_replicas();
        Some((id, name))
    }

    /// Number of live (interned, not released) replica ids.
    pub(crate) fn live_replicas(&self) -> usize {
        self.replicas.map.len()
    }

    /// Live replica ids (id order).
    pub(crate) fn live_replica_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.replicas.map.values().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Releases replica `id` (see [`NameMap::release`]).
    pub(crate) fn release_replica(&mut self, id: u32) {
        if let Some(name) = self.replicas.release(id) {
            self.replica_order.remove(name);
        }
    }

    /// Whether `id` is the live id of `name`, without hashing the name:
    /// the id's name is this very allocation (a recycled id gets a new one)
    /// and the id is not released (a released id keeps its name until
    /// recycled). `find_replica` of the name would give `Some(id)`.
    pub(crate) fn replica_still(&self, id: u32, name: &Arc<str>) -> bool {
        let r = &self.replicas;
        r.names
            .get(id as usize)
            .is_some_and(|n| Arc::ptr_eq(n, name))
            && r.released
                .get(id as usize / 64)
                .is_none_or(|w| w & (1 << (id % 64)) == 0)
    }

    /// The byte-order label of a live replica's name ([`NameOrder::label`]):
    /// ties in a ranking are broken by comparing these, not the names.
    #[inline]
    pub(crate) fn replica_label(&self, id: u32) -> u64 {
        self.replica_order.label(id)
    }

    /// Makes the replica ids released by the previous sweep reusable.
    pub(crate) fn recycle_replicas(&mut self) {
        let recycled = !self.replicas.quarantine.is_empty();
        self.replicas.recycle();
        if recycled {
            self.publish_replicas();
        }
    }

    /// Republishes the lookups' [`ReplicaTable`] after a change of names
    /// or labels (a release changes neither: the id keeps both until
    /// recycled).
    fn publish_replicas(&mut self) {
        let names = &self.replicas.names;
        self.replica_table = (names.len() <= MAX_TABLE).then(|| {
            let labels = (0..names.len() as u32)
                .map(|id| self.replica_order.label(id))
                .collect();
            Arc::new(ReplicaTable::new(names.as_slice().into(), labels))
        });
        self.table_epoch.fetch_add(1, Ordering::Release);
    }

    /// The published table and the epoch it was published at (`None` past
    /// [`MAX_TABLE`] ids: read names through the catalog).
    pub(crate) fn replica_table(&self) -> Option<(u64, Arc<ReplicaTable>)> {
        let t = self.replica_table.clone()?;
        Some((self.table_epoch.load(Ordering::Relaxed), t))
    }

    /// The published table's names (`None` past [`MAX_TABLE`] ids).
    pub(crate) fn replica_table_names(&self) -> Option<Arc<[Arc<str>]>> {
        self.replica_table.as_ref().map(|t| t.names().clone())
    }

    /// The epoch lookups compare against their thread's table.
    pub(crate) fn table_epoch(&self) -> Epoch {
        self.table_epoch.clone()
    }

    pub(crate) fn replica_name(&self, id: u32) -> Arc<str> {
        self.replicas
            .names
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| Arc::from(""))
    }

    pub(crate) fn replica_names(&self) -> &[Arc<str>] {
        &self.replicas.names
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_ids_stop_at_the_id_space_and_resume_from_recycled_ids() {
        let mut c = Catalog::default();
        let a = c.intern_replica_below("a", 0, 2).map(|x| x.0);
        let b = c.intern_replica_below("b", 0, 2).map(|x| x.0);
        assert_eq!((a, b), (Some(0), Some(1)));
        assert!(c.intern_replica_below("c", 0, 2).is_none());
        // A known name still resolves when the space is full.
        assert_eq!(c.intern_replica_below("a", 0, 2).map(|x| x.0), Some(0));
        c.release_replica(0);
        c.recycle_replicas();
        assert_eq!(c.intern_replica_below("c", 0, 2).map(|x| x.0), Some(0));
    }

    #[test]
    fn a_resolved_replica_id_holds_until_its_release() {
        let mut c = Catalog::default();
        let (id, name) = c.intern_replica("a", 0).expect("room");
        assert!(c.replica_still(id, &name));
        // Another allocation of the same name is not the catalog's.
        assert!(!c.replica_still(id, &Arc::from("a")));
        c.release_replica(id);
        assert!(!c.replica_still(id, &name), "released");
        c.recycle_replicas();
        assert!(!c.replica_still(id, &name), "recycled");
        let (again, fresh) = c.intern_replica("a", 0).expect("room");
        assert_eq!(again, id, "the recycled id");
        assert!(!c.replica_still(again, &name), "a new name");
        assert!(c.replica_still(again, &fresh));
        assert_eq!(c.find_replica("a"), Some(again));
    }
}

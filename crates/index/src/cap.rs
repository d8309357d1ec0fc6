//! The global entry cap (§2.5.2) with an incrementally maintained victim
//! reserve.
//!
//! Victim order is total and deterministic: (effectiveCount, lastSeen, tenant,
//! model, scheme, adapter, hash bytes, replica id), effectiveCount being the
//! LFU access count for LFU tenants and 0 otherwise. The reserve of the
//! smallest candidates and its invariant are the `reserve` module's.
//!
//! Keys only grow by themselves (LFU credit, refresh with a newer timestamp);
//! an upsert that may lower a key or creates an entry below the threshold
//! pushes an item (with effectiveCount 0, a lower bound) under its shard lock.
//! When the reserve runs dry, outgrows its bound, or a tenant's algorithm
//! changed, it is rebuilt. Upserts that race a rebuild are recorded and
//! merged when it completes.

use crate::catalog::Partition;
use crate::entries::Taken;
use crate::index::Index;
use crate::key::KeyRef;
use crate::observer::{Note, Notes, RemovalReason};
use crate::policy::EvictionAlgorithm;
use crate::reserve::{ACTIVE, Gather, Hooked, IDLE, RECORDING, Reserve, overtaken};
use crate::sync::{lock, read, write};
use crate::types::EvictionCounts;
use std::cell::Cell;
use std::cmp::Ordering;
use std::sync::atomic::{AtomicU8, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};

/// One cap candidate.
#[derive(Clone)]
pub(crate) struct CapVictim {
    pub(crate) eff: u64,
    pub(crate) last_seen: i64,
    pub(crate) part: Arc<Partition>,
    pub(crate) hash: Box<[u8]>,
    pub(crate) replica: u32,
    pub(crate) replica_id: Arc<str>,
}

type View<'a> = (u64, i64, &'a Partition, &'a [u8], &'a str);

fn cmp_cap(a: View<'_>, b: View<'_>) -> Ordering {
    a.0.cmp(&b.0)
        .then(a.1.cmp(&b.1))
        .then_with(|| cmp_partition(a.2, b.2))
        .then_with(|| a.3.cmp(b.3))
        .then_with(|| a.4.cmp(b.4))
}

/// (tenant, model, scheme, adapter) order; interned partitions compare by
/// identity first.
pub(crate) fn cmp_partition(a: &Partition, b: &Partition) -> Ordering {
    if a.id == b.id {
        return Ordering::Equal;
    }
    a.tenant
        .cmp(&b.tenant)
        .then_with(|| a.model.cmp(&b.model))
        .then_with(|| a.scheme.cmp(&b.scheme))
        .then_with(|| a.adapter.cmp(&b.adapter))
}

impl CapVictim {
    fn view(&self) -> View<'_> {
        (
            self.eff,
            self.last_seen,
            &self.part,
            &self.hash,
            &self.replica_id,
        )
    }
}

impl PartialEq for CapVictim {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for CapVictim {}
impl PartialOrd for CapVictim {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for CapVictim {
    fn cmp(&self, o: &Self) -> Ordering {
        cmp_cap(self.view(), o.view())
    }
}

/// The victim reserve.
pub(crate) struct CapReserve {
    hint: AtomicU8,
    state: Mutex<CapState>,
}

/// The reserve and the algorithm per tenant id it was built with.
struct CapState {
    reserve: Reserve<CapVictim>,
    algos: Vec<EvictionAlgorithm>,
}

impl CapReserve {
    pub(crate) fn new() -> Self {
        Self {
            hint: AtomicU8::new(IDLE),
            state: Mutex::new(CapState {
                reserve: Reserve::new(),
                algos: Vec::new(),
            }),
        }
    }

    /// Upsert hook, called with the entry's shard write lock held after the
    /// entry was written with `last_seen`. Cheap when no reserve is active or
    /// when the entry is above the threshold.
    #[inline]
    pub(crate) fn on_upsert(
        &self,
        part: &Arc<Partition>,
        hash: &[u8],
        replica: u32,
        replica_id: &Arc<str>,
        last_seen: i64,
    ) {
        if part.reserved || self.hint.load(AtomicOrdering::SeqCst) == IDLE {
            return;
        }
        self.record(part, hash, replica, replica_id, last_seen);
    }

    #[cold]
    fn record(
        &self,
        part: &Arc<Partition>,
        hash: &[u8],
        replica: u32,
        replica_id: &Arc<str>,
        last_seen: i64,
    ) {
        let mut st = lock(&self.state);
        let hooked = st.reserve.hook(
            |t| cmp_cap((0, last_seen, part, hash, replica_id), t.view()),
            || CapVictim {
                eff: 0,
                last_seen,
                part: part.clone(),
                hash: Box::from(hash),
                replica,
                replica_id: replica_id.clone(),
            },
        );
        if hooked == Hooked::Dropped {
            self.hint.store(IDLE, AtomicOrdering::SeqCst);
        }
    }

    fn set_mode(&self, st: &mut CapState, mode: u8) {
        st.reserve.reset(mode);
        self.hint.store(mode, AtomicOrdering::SeqCst);
    }
}

impl Index {
    /// Enforce the global cap: remove entries of non-reserved tenants in victim
    /// order until `total − reserved <= max_entries`. Victims come from the
    /// reserve in ordered batches (one reserve lock per batch).
    pub(crate) fn enforce_cap(&self, ev: &mut EvictionCounts, notes: &mut Notes) {
        if self.settings.max_entries <= 0 {
            return;
        }
        let max = self.settings.max_entries as u64;
        let over = |s: &Self| {
            let c = read(&s.store.counters);
            c.total_entries
                .saturating_sub(c.reserved_entries)
                .saturating_sub(max)
        };
        if over(self) == 0 {
            return;
        }
        let _guard = lock(&self.enforcement.evict_lock);
        let algos: Vec<EvictionAlgorithm> =
            self.tenant_policies().into_iter().map(|x| x.1).collect();
        {
            let mut st = lock(&self.enforcement.cap.state);
            let changed = st.algos.iter().zip(&algos).any(|(a, b)| a != b);
            if changed {
                self.enforcement.cap.set_mode(&mut st, IDLE);
            } else if st.algos.len() < algos.len() {
                // Tenants born after the scan: all their entries went through the upsert hook.
                let n = st.algos.len();
                st.algos.extend_from_slice(&algos[n..]);
            }
        }
        let mut rebuilds = 0;
        let mut batch: Vec<CapVictim> = Vec::new();
        let mut later: Vec<CapVictim> = Vec::new();
        loop {
            let need = over(self) as usize;
            if need == 0 {
                return;
            }
            lock(&self.enforcement.cap.state)
                .reserve
                .take(need, &mut batch);
            if batch.is_empty() {
                if rebuilds == 2 || !self.rebuild_reserve(&algos, need) {
                    return;
                }
                rebuilds += 1;
                continue;
            }
            let mut items = batch.drain(..);
            while let Some(v) = items.next() {
                if overtaken(&later, &v) {
                    // A re-pushed item now precedes the rest: let the reserve order them.
                    lock(&self.enforcement.cap.state)
                        .reserve
                        .give_back(std::iter::once(v).chain(items.by_ref()));
                    break;
                }
                let algo = algos
                    .get(v.part.tenant_id as usize)
                    .copied()
                    .unwrap_or_default();
                if let Some(moved) = self.evict_cap_victim(v, algo, ev, notes) {
                    later.push(moved);
                }
            }
            drop(items);
            if !later.is_empty() {
                let mut st = lock(&self.enforcement.cap.state);
                for m in later.drain(..) {
                    st.reserve.repush(m);
                }
            }
        }
    }

    /// Remove one victim if its item is exact; a stale item comes back with
    /// the entry's current key (to be re-pushed), a gone entry as `None`.
    fn evict_cap_victim(
        &self,
        v: CapVictim,
        algo: EvictionAlgorithm,
        ev: &mut EvictionCounts,
        notes: &mut Notes,
    ) -> Option<CapVictim> {
        let key = KeyRef::new(v.part.id, &v.hash);
        let lfu = algo == EvictionAlgorithm::Lfu;
        let taken = self.store.entries.take(
            &key,
            v.replica,
            |h, access| {
                let eff = if lfu { access } else { 0 };
                eff == v.eff && h.last_seen == v.last_seen
            },
            |_, rest| {
                if !rest.is_empty() && self.enforcement.quota.active() {
                    self.enforcement
                        .quota
                        .on_key_changed(&v.part, &v.hash, rest);
                }
                write(&self.store.counters).on_remove(&v.part, v.replica, rest.is_empty());
            },
        );
        match taken {
            Taken::Absent => None,
            Taken::Refused { access, last_seen } => Some(CapVictim {
                eff: if lfu { access } else { 0 },
                last_seen,
                ..v
            }),
            Taken::Removed(h) => {
                ev.add_cap(algo, 1);
                notes.push(|| {
                    Note::Removed(
                        Index::change(&v.part, &v.hash, v.replica_id.clone(), &h),
                        RemovalReason::Cap,
                    )
                });
                None
            }
        }
    }

    /// Rebuild the reserve from a full scan. Returns false if nothing is evictable.
    fn rebuild_reserve(&self, algos: &[EvictionAlgorithm], need: usize) -> bool {
        {
            let mut st = lock(&self.enforcement.cap.state);
            self.enforcement.cap.set_mode(&mut st, RECORDING);
        }
        // Gather a slice proportional to the index (1/32 of it), so the scan
        // cost amortizes to a constant per evicted entry.
        let live = {
            let c = read(&self.store.counters);
            c.total_entries.saturating_sub(c.reserved_entries) as usize
        };
        let k = need.max(self.settings.cap_reserve).max(live / 32);
        let names = self.replica_names();
        let empty: Arc<str> = Arc::from("");
        let mut gather: Gather<CapVictim> = Gather::new(k);
        let lfu = |p: &Partition| algos.get(p.tenant_id as usize) == Some(&EvictionAlgorithm::Lfu);
        // The gather's bound as (effective count, last seen): a span of a
        // non-LFU tenant (effective count 0) seen after it cannot hold a
        // candidate below it, so the arena skips it unread (a third of an
        // ingest at a full index was this scan, BENCHMARKS.md).
        let bound: Cell<Option<(u64, i64)>> = Cell::new(None);
        let span_ok = |p: &Partition, last_seen: i64| {
            !p.reserved
                && (lfu(p)
                    || bound
                        .get()
                        .is_none_or(|(eff, ls)| eff > 0 || last_seen <= ls))
        };
        self.scan_keys_where(span_ok, |p, hash, holders| {
            if p.reserved {
                return;
            }
            let lfu = lfu(p);
            for h in holders.iter() {
                let eff = if lfu { holders.access(h) } else { 0 };
                let name = names.get(h.replica() as usize).unwrap_or(&empty);
                gather.offer(
                    |top| cmp_cap((eff, h.last_seen, p, hash, name), top.view()),
                    || CapVictim {
                        eff,
                        last_seen: h.last_seen,
                        part: p.clone(),
                        hash: Box::from(hash),
                        replica: h.replica(),
                        replica_id: name.clone(),
                    },
                );
            }
            bound.set(gather.bound().map(|v| (v.eff, v.last_seen)));
        });
        let mut st = lock(&self.enforcement.cap.state);
        st.algos = algos.to_vec();
        let ok = st.reserve.install(gather.into_vec(), 2 * k + 1024);
        self.enforcement
            .cap
            .hint
            .store(if ok { ACTIVE } else { IDLE }, AtomicOrdering::SeqCst);
        ok
    }
}

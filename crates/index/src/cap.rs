//! The global entry cap (§2.5.2) with an incrementally maintained victim
//! reserve.
//!
//! Victim order is total and deterministic: (effectiveCount, lastSeen, tenant,
//! model, scheme, adapter, hash bytes, replica id), effectiveCount being the
//! LFU access count for LFU tenants and 0 otherwise. Finding the next victim
//! exactly needs a scan of every entry; doing that on every over-cap ingest
//! would cost O(entries) per ingest at steady state. Instead one scan (shard
//! by shard, read locks only) collects the `max(cap_reserve (default 4096), entries / 32)` smallest candidates; the
//! largest of them is the *threshold*. The reserve then keeps this invariant:
//!
//! > every live entry whose current key is `<= threshold` has an item in the
//! > reserve whose key is `<=` its current key.
//!
//! Keys only grow by themselves (LFU credit, refresh with a newer timestamp);
//! an upsert that may lower a key or creates an entry below the threshold
//! pushes an item (with effectiveCount 0, a lower bound) under its shard lock.
//! Popping the smallest item and re-reading the entry gives either the exact
//! global minimum (item key == current key) or a stale item, which is
//! re-pushed with the current key (if still `<= threshold`) or dropped. When
//! the reserve runs dry, or a tenant's algorithm changed, it is rebuilt.
//! Upserts that race a rebuild are recorded and merged when it completes.

use crate::catalog::Partition;
use crate::index::Index;
use crate::key::KeyRef;
use crate::observer::{Note, Notes, RemovalReason};
use crate::policy::EvictionAlgorithm;
use crate::shard::{lock, read, write};
use crate::types::EvictionCounts;
use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU8, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};

const IDLE: u8 = 0;
const RECORDING: u8 = 1;
const ACTIVE: u8 = 2;

/// One cap candidate.
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

struct ReserveState {
    mode: u8,
    items: BinaryHeap<Reverse<CapVictim>>,
    threshold: Option<CapVictim>,
    recorded: Vec<CapVictim>,
    /// Algorithm per tenant id the reserve was built with.
    algos: Vec<EvictionAlgorithm>,
    /// Item bound: past it (many upserts below the threshold while the index
    /// stays under its cap) the reserve is dropped and rebuilt on demand.
    limit: usize,
}

impl ReserveState {
    fn admits(&self, v: View<'_>) -> bool {
        self.threshold
            .as_ref()
            .is_some_and(|t| cmp_cap(v, t.view()) != Ordering::Greater)
    }
}

/// The victim reserve.
pub(crate) struct CapReserve {
    hint: AtomicU8,
    state: Mutex<ReserveState>,
}

impl CapReserve {
    pub(crate) fn new() -> Self {
        Self {
            hint: AtomicU8::new(IDLE),
            state: Mutex::new(ReserveState {
                mode: IDLE,
                items: BinaryHeap::new(),
                threshold: None,
                recorded: Vec::new(),
                algos: Vec::new(),
                limit: 0,
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
        let make = || CapVictim {
            eff: 0,
            last_seen,
            part: part.clone(),
            hash: Box::from(hash),
            replica,
            replica_id: replica_id.clone(),
        };
        match st.mode {
            RECORDING => st.recorded.push(make()),
            ACTIVE if st.admits((0, last_seen, part, hash, replica_id)) => {
                st.items.push(Reverse(make()))
            }
            _ => {}
        }
    }

    fn set_mode(&self, st: &mut ReserveState, mode: u8) {
        st.mode = mode;
        self.hint.store(mode, AtomicOrdering::SeqCst);
    }
}

impl Index {
    /// Enforce the global cap: remove entries of non-reserved tenants in victim
    /// order until `total − reserved <= max_entries`.
    pub(crate) fn enforce_cap(&self, ev: &mut EvictionCounts, notes: &mut Notes) {
        if self.max_entries <= 0 {
            return;
        }
        let max = self.max_entries as u64;
        let over = |s: &Self| {
            let c = read(&s.counters);
            c.total_entries
                .saturating_sub(c.reserved_entries)
                .saturating_sub(max)
        };
        if over(self) == 0 {
            return;
        }
        let _guard = lock(&self.evict_lock);
        let algos: Vec<EvictionAlgorithm> =
            self.tenant_policies().into_iter().map(|x| x.1).collect();
        {
            let mut st = lock(&self.reserve.state);
            let changed = st.algos.iter().zip(&algos).any(|(a, b)| a != b);
            if changed {
                self.reserve.set_mode(&mut st, IDLE);
            } else if st.algos.len() < algos.len() {
                // Tenants born after the scan: all their entries went through the upsert hook.
                let n = st.algos.len();
                st.algos.extend_from_slice(&algos[n..]);
            }
        }
        let mut rebuilds = 0;
        while over(self) > 0 {
            let item = {
                let mut st = lock(&self.reserve.state);
                if st.mode == ACTIVE {
                    st.items.pop().map(|r| r.0)
                } else {
                    None
                }
            };
            let Some(v) = item else {
                if rebuilds == 2 || !self.rebuild_reserve(&algos, over(self) as usize) {
                    return;
                }
                rebuilds += 1;
                continue;
            };
            let algo = algos
                .get(v.part.tenant_id as usize)
                .copied()
                .unwrap_or_default();
            let key = KeyRef::new(v.part.id, &v.hash);
            let mut shard = self.shards.write(key.shard());
            let current = shard
                .get(&key)
                .and_then(|hs| {
                    hs.binary_search_by_key(&v.replica, |h| h.replica)
                        .ok()
                        .map(|i| &hs[i])
                })
                .map(|h| {
                    let eff = if algo == EvictionAlgorithm::Lfu {
                        h.access()
                    } else {
                        0
                    };
                    (eff, h.last_seen)
                });
            match current {
                None => {} // gone: stale item
                Some((eff, last_seen)) if eff == v.eff && last_seen == v.last_seen => {
                    if let Some((h, rest)) = shard.take_holder(&key, v.replica) {
                        let gone = rest.is_none();
                        if let Some(hs) = rest.filter(|_| self.quota.active()) {
                            self.quota.on_key_changed(&v.part, &v.hash, hs);
                        }
                        write(&self.counters).on_remove(&v.part, v.replica, gone);
                        drop(shard);
                        ev.add_cap(algo, 1);
                        notes.push(|| {
                            Note::Removed(
                                Index::change(&v.part, &v.hash, v.replica_id.clone(), &h),
                                RemovalReason::Cap,
                            )
                        });
                    }
                }
                Some((eff, last_seen)) => {
                    drop(shard);
                    let moved = CapVictim {
                        eff,
                        last_seen,
                        ..v
                    };
                    let mut st = lock(&self.reserve.state);
                    if st.mode == ACTIVE && st.admits(moved.view()) {
                        st.items.push(Reverse(moved));
                    }
                }
            }
        }
    }

    /// Rebuild the reserve from a full scan. Returns false if nothing is evictable.
    fn rebuild_reserve(&self, algos: &[EvictionAlgorithm], need: usize) -> bool {
        {
            let mut st = lock(&self.reserve.state);
            st.items.clear();
            st.recorded.clear();
            st.threshold = None;
            self.reserve.set_mode(&mut st, RECORDING);
        }
        // Gather a slice proportional to the index (1/32 of it), so the scan
        // cost amortizes to a constant per evicted entry.
        let live = {
            let c = read(&self.counters);
            c.total_entries.saturating_sub(c.reserved_entries) as usize
        };
        let k = need.max(self.cap_reserve).max(live / 32);
        let names = self.replica_names();
        let empty: Arc<str> = Arc::from("");
        let mut heap: BinaryHeap<CapVictim> = BinaryHeap::with_capacity(k + 1);
        self.scan_keys(|p, hash, holders| {
            if p.reserved {
                return;
            }
            let lfu = algos.get(p.tenant_id as usize) == Some(&EvictionAlgorithm::Lfu);
            for h in holders.iter() {
                let eff = if lfu { h.access() } else { 0 };
                let name = names.get(h.replica as usize).unwrap_or(&empty);
                if heap.len() >= k {
                    if let Some(top) = heap.peek() {
                        if cmp_cap((eff, h.last_seen, p, hash, name), top.view()) != Ordering::Less
                        {
                            continue;
                        }
                    }
                    heap.pop();
                }
                heap.push(CapVictim {
                    eff,
                    last_seen: h.last_seen,
                    part: p.clone(),
                    hash: Box::from(hash),
                    replica: h.replica,
                    replica_id: name.clone(),
                });
            }
        });
        let mut st = lock(&self.reserve.state);
        st.algos = algos.to_vec();
        let mut sorted = heap.into_vec();
        sorted.sort_unstable();
        let Some(max) = sorted.pop() else {
            st.recorded.clear();
            self.reserve.set_mode(&mut st, IDLE);
            return false;
        };
        st.threshold = Some(CapVictim {
            eff: max.eff,
            last_seen: max.last_seen,
            part: max.part.clone(),
            hash: max.hash.clone(),
            replica: max.replica,
            replica_id: max.replica_id.clone(),
        });
        st.limit = 2 * k + 1024;
        st.items = sorted.into_iter().map(Reverse).collect();
        st.items.push(Reverse(max));
        let recorded = std::mem::take(&mut st.recorded);
        for r in recorded {
            if st.admits(r.view()) {
                st.items.push(Reverse(r));
            }
        }
        self.reserve.set_mode(&mut st, ACTIVE);
        true
    }
}

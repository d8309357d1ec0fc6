//! Tenant quotas (§2.5.3) with per-tenant victim reserves.
//!
//! Over budget, a tenant loses whole prefix keys in (age, model, scheme,
//! adapter, hash) order, age being the newest `last_seen` among the key's
//! holders. Like the cap (see `cap.rs`), one scan gathers the
//! `max(need, cap_reserve, tenant keys / 32)` smallest keys of the tenant and
//! the largest of them becomes the threshold; the reserve then keeps the
//! invariant "every live key of the tenant whose current age-key is `<=`
//! threshold has an item `<=` its current key". A key's age can drop when its
//! newest holder is removed or refreshed with an older timestamp, so every
//! change to a key that survives (upsert, partial removal by events, TTL or
//! cap) calls [`QuotaReserves::on_key_changed`] under the shard write lock.

use crate::catalog::Partition;
use crate::holder::Holder;
use crate::index::Index;
use crate::key::KeyRef;
use crate::observer::{Note, Notes, RemovalReason};
use crate::shard::{lock, read, write};
use crate::types::EvictionCounts;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, RwLock};

const IDLE: u8 = 0;
const RECORDING: u8 = 1;
const ACTIVE: u8 = 2;

/// A whole key of the tenant.
struct QuotaVictim {
    age: i64,
    part: Arc<Partition>,
    hash: Box<[u8]>,
}

type View<'a> = (i64, &'a Partition, &'a [u8]);

fn cmp_quota(a: View<'_>, b: View<'_>) -> Ordering {
    let same = a.1.id == b.1.id;
    a.0.cmp(&b.0)
        .then_with(|| {
            if same {
                Ordering::Equal
            } else {
                a.1.model.cmp(&b.1.model)
            }
        })
        .then_with(|| {
            if same {
                Ordering::Equal
            } else {
                a.1.scheme.cmp(&b.1.scheme)
            }
        })
        .then_with(|| {
            if same {
                Ordering::Equal
            } else {
                a.1.adapter.cmp(&b.1.adapter)
            }
        })
        .then_with(|| a.2.cmp(b.2))
}

impl QuotaVictim {
    fn view(&self) -> View<'_> {
        (self.age, &self.part, &self.hash)
    }
}

impl PartialEq for QuotaVictim {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for QuotaVictim {}
impl PartialOrd for QuotaVictim {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for QuotaVictim {
    fn cmp(&self, o: &Self) -> Ordering {
        cmp_quota(self.view(), o.view())
    }
}

/// Age of a key: the newest `last_seen` among its holders.
pub(crate) fn key_age(holders: &[Holder]) -> i64 {
    holders
        .iter()
        .map(|h| h.last_seen)
        .max()
        .unwrap_or(i64::MIN)
}

struct TenantReserve {
    mode: u8,
    items: BinaryHeap<Reverse<QuotaVictim>>,
    threshold: Option<QuotaVictim>,
    recorded: Vec<QuotaVictim>,
    limit: usize,
}

impl TenantReserve {
    fn admits(&self, v: View<'_>) -> bool {
        self.threshold
            .as_ref()
            .is_some_and(|t| cmp_quota(v, t.view()) != Ordering::Greater)
    }

    fn reset(&mut self, mode: u8) {
        self.mode = mode;
        self.items.clear();
        self.recorded.clear();
        self.threshold = None;
    }
}

/// Per-tenant quota reserves.
pub(crate) struct QuotaReserves {
    any: AtomicBool,
    tenants: RwLock<HashMap<u32, Mutex<TenantReserve>>>,
}

impl QuotaReserves {
    pub(crate) fn new() -> Self {
        Self {
            any: AtomicBool::new(false),
            tenants: RwLock::new(HashMap::new()),
        }
    }

    /// Whether any tenant reserve exists (fast pre-check for the hook).
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.any.load(AtomicOrdering::SeqCst)
    }

    /// Hook: a key of `part` still exists after a change; `holders` is its
    /// current holder list. Called with the key's shard write lock held.
    pub(crate) fn on_key_changed(&self, part: &Arc<Partition>, hash: &[u8], holders: &[Holder]) {
        if !self.any.load(AtomicOrdering::SeqCst) {
            return;
        }
        let tenants = read(&self.tenants);
        let Some(r) = tenants.get(&part.tenant_id) else {
            return;
        };
        let mut r = lock(r);
        let age = key_age(holders);
        let make = || QuotaVictim {
            age,
            part: part.clone(),
            hash: Box::from(hash),
        };
        match r.mode {
            RECORDING => r.recorded.push(make()),
            ACTIVE if r.admits((age, part, hash)) => {
                if r.items.len() >= r.limit {
                    r.reset(IDLE);
                } else {
                    r.items.push(Reverse(make()));
                }
            }
            _ => {}
        }
    }

    fn with<T>(&self, tid: u32, f: impl FnOnce(&mut TenantReserve) -> T) -> T {
        {
            let tenants = read(&self.tenants);
            if let Some(r) = tenants.get(&tid) {
                return f(&mut lock(r));
            }
        }
        let mut tenants = write(&self.tenants);
        let r = tenants.entry(tid).or_insert_with(|| {
            Mutex::new(TenantReserve {
                mode: IDLE,
                items: BinaryHeap::new(),
                threshold: None,
                recorded: Vec::new(),
                limit: 0,
            })
        });
        self.any.store(true, AtomicOrdering::SeqCst);
        f(&mut lock(r))
    }
}

impl Index {
    /// Enforce a tenant quota: drop whole keys, oldest first, until the tenant
    /// holds at most `max` distinct prefixes.
    pub(crate) fn enforce_quota(
        &self,
        tenant: &str,
        max: u64,
        ev: &mut EvictionCounts,
        notes: &mut Notes,
    ) {
        let Some(tid) = read(&self.catalog).find_tenant(tenant) else {
            return;
        };
        let over = |s: &Self| read(&s.counters).tenant_keys(tid).saturating_sub(max);
        if over(self) == 0 {
            return;
        }
        let _guard = lock(&self.evict_lock);
        let names = if notes.enabled {
            self.replica_names()
        } else {
            Vec::new()
        };
        let mut removed_keys = 0u64;
        let mut rebuilds = 0;
        while over(self) > 0 {
            let item = self.quota.with(tid, |r| {
                if r.mode == ACTIVE {
                    r.items.pop().map(|x| x.0)
                } else {
                    None
                }
            });
            let Some(v) = item else {
                if rebuilds == 2 || !self.rebuild_quota_reserve(tid, over(self) as usize) {
                    break;
                }
                rebuilds += 1;
                continue;
            };
            let key = KeyRef::new(v.part.id, &v.hash);
            let mut shard = self.shards.write(key.shard());
            let Some(age) = shard.get(&key).map(|hs| key_age(hs)) else {
                continue;
            };
            if age != v.age {
                drop(shard);
                let moved = QuotaVictim { age, ..v };
                self.quota.with(tid, |r| {
                    if r.mode == ACTIVE && r.admits(moved.view()) {
                        r.items.push(Reverse(moved));
                    }
                });
                continue;
            }
            let Some(holders) = shard.remove(&key) else {
                continue;
            };
            {
                let mut c = write(&self.counters);
                let n = holders.len();
                for (i, h) in holders.iter().enumerate() {
                    c.on_remove(&v.part, h.replica, i + 1 == n);
                }
            }
            drop(shard);
            removed_keys += 1;
            for h in holders.iter() {
                let name = names
                    .get(h.replica as usize)
                    .cloned()
                    .unwrap_or_else(|| Arc::from(""));
                notes.push(|| {
                    Note::Removed(
                        Index::change(&v.part, &v.hash, name, h),
                        RemovalReason::Quota,
                    )
                });
            }
        }
        if removed_keys > 0 {
            ev.quota
                .push((read(&self.catalog).tenant_name(tid), removed_keys));
        }
    }

    /// Rebuild a tenant's reserve from a full scan. False if the tenant has no keys.
    fn rebuild_quota_reserve(&self, tid: u32, need: usize) -> bool {
        self.quota.with(tid, |r| r.reset(RECORDING));
        let tenant_keys = read(&self.counters).tenant_keys(tid) as usize;
        let k = need.max(self.cap_reserve).max(tenant_keys / 32);
        let mut heap: BinaryHeap<QuotaVictim> = BinaryHeap::with_capacity(k + 1);
        self.scan_keys(|p, hash, holders| {
            if p.tenant_id != tid {
                return;
            }
            let age = key_age(holders);
            if heap.len() >= k {
                if let Some(top) = heap.peek() {
                    if cmp_quota((age, p, hash), top.view()) != Ordering::Less {
                        return;
                    }
                }
                heap.pop();
            }
            heap.push(QuotaVictim {
                age,
                part: p.clone(),
                hash: Box::from(hash),
            });
        });
        self.quota.with(tid, |r| {
            let mut sorted = heap.into_vec();
            sorted.sort_unstable();
            let Some(max) = sorted.pop() else {
                r.reset(IDLE);
                return false;
            };
            r.threshold = Some(QuotaVictim {
                age: max.age,
                part: max.part.clone(),
                hash: max.hash.clone(),
            });
            r.limit = 2 * k + 1024;
            r.items = sorted.into_iter().map(Reverse).collect();
            r.items.push(Reverse(max));
            let recorded = std::mem::take(&mut r.recorded);
            for x in recorded {
                if r.admits(x.view()) {
                    r.items.push(Reverse(x));
                }
            }
            r.mode = ACTIVE;
            true
        })
    }
}

//! Tenant quotas (§2.5.3) with per-tenant victim reserves.
//!
//! Over budget, a tenant loses whole prefix keys in (age, model, scheme,
//! adapter, hash) order, age being the newest `last_seen` among the key's
//! holders. Like the cap, each tenant has a `reserve::Reserve` of the
//! `max(need, cap_reserve, tenant keys / 32)` smallest keys (invariant in
//! the `reserve` module). A key's age can drop when its
//! newest holder is removed or refreshed with an older timestamp, so every
//! change to a key that survives (upsert, partial removal by events, TTL or
//! cap) calls [`QuotaReserves::on_key_changed`] under the shard write lock.

use crate::catalog::Partition;
use crate::entries::KeyTaken;
use crate::entries::holder::Holder;
use crate::index::Index;
use crate::key::KeyRef;
use crate::observer::{Note, Notes, RemovalReason};
use crate::reserve::{Gather, RECORDING, Reserve, overtaken};
use crate::sync::{lock, read, write};
use crate::types::EvictionCounts;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, RwLock};

/// A whole key of the tenant.
#[derive(Clone)]
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

type TenantReserve = Reserve<QuotaVictim>;

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
        r.hook(
            |t| cmp_quota((age, part, hash), t.view()),
            || QuotaVictim {
                age,
                part: part.clone(),
                hash: Box::from(hash),
            },
        );
    }

    fn with<T>(&self, tid: u32, f: impl FnOnce(&mut TenantReserve) -> T) -> T {
        {
            let tenants = read(&self.tenants);
            if let Some(r) = tenants.get(&tid) {
                return f(&mut lock(r));
            }
        }
        let mut tenants = write(&self.tenants);
        let r = tenants
            .entry(tid)
            .or_insert_with(|| Mutex::new(Reserve::new()));
        self.any.store(true, AtomicOrdering::SeqCst);
        f(&mut lock(r))
    }
}

impl Index {
    /// Enforce a tenant quota: drop whole keys, oldest first, until the tenant
    /// holds at most `max` distinct prefixes. Victims come from the reserve
    /// in ordered batches (one reserve lock per batch).
    pub(crate) fn enforce_quota(
        &self,
        tenant: &str,
        max: u64,
        ev: &mut EvictionCounts,
        notes: &mut Notes,
    ) {
        let Some(tid) = read(&self.store.catalog).find_tenant(tenant) else {
            return;
        };
        let over = |s: &Self| read(&s.store.counters).tenant_keys(tid).saturating_sub(max);
        if over(self) == 0 {
            return;
        }
        let _guard = lock(&self.enforcement.evict_lock);
        let names = if notes.enabled {
            self.replica_names()
        } else {
            Vec::new()
        };
        let mut removed_keys = 0u64;
        let mut rebuilds = 0;
        let mut batch: Vec<QuotaVictim> = Vec::new();
        let mut later: Vec<QuotaVictim> = Vec::new();
        loop {
            let need = over(self) as usize;
            if need == 0 {
                break;
            }
            self.enforcement
                .quota
                .with(tid, |r| r.take(need, &mut batch));
            if batch.is_empty() {
                if rebuilds == 2 || !self.rebuild_quota_reserve(tid, need) {
                    break;
                }
                rebuilds += 1;
                continue;
            }
            let mut items = batch.drain(..);
            while let Some(v) = items.next() {
                if overtaken(&later, &v) {
                    // A re-pushed key now precedes the rest: let the reserve order them.
                    self.enforcement.quota.with(tid, |r| {
                        r.give_back(std::iter::once(v).chain(items.by_ref()));
                    });
                    break;
                }
                match self.evict_quota_victim(v, &names, notes) {
                    Ok(true) => removed_keys += 1,
                    Ok(false) => {}
                    Err(moved) => later.push(moved),
                }
            }
            drop(items);
            if !later.is_empty() {
                self.enforcement.quota.with(tid, |r| {
                    for m in later.drain(..) {
                        r.repush(m);
                    }
                });
            }
        }
        if removed_keys > 0 {
            ev.quota
                .push((read(&self.store.catalog).tenant_name(tid), removed_keys));
        }
    }

    /// Remove one victim key if its item is exact (`Ok(true)`); a stale item
    /// comes back with the key's current age (to be re-pushed); a gone key is
    /// `Ok(false)`.
    fn evict_quota_victim(
        &self,
        v: QuotaVictim,
        names: &[Arc<str>],
        notes: &mut Notes,
    ) -> Result<bool, QuotaVictim> {
        let key = KeyRef::new(v.part.id, &v.hash);
        let mut now_age = None;
        let holders = match self.store.entries.take_key(&key, |hs| {
            let age = key_age(hs);
            now_age = Some(age);
            age == v.age
        }) {
            KeyTaken::Absent => return Ok(false),
            KeyTaken::Refused => {
                return match now_age {
                    Some(age) => Err(QuotaVictim { age, ..v }),
                    None => Ok(false),
                };
            }
            KeyTaken::Removed(hs) => hs,
        };
        {
            let mut c = write(&self.store.counters);
            let n = holders.len();
            for (i, h) in holders.iter().enumerate() {
                c.on_remove(&v.part, h.replica(), i + 1 == n);
            }
        }
        for h in holders.iter() {
            let name = names
                .get(h.replica() as usize)
                .cloned()
                .unwrap_or_else(|| Arc::from(""));
            notes.push(|| {
                Note::Removed(
                    Index::change(&v.part, &v.hash, name, h),
                    RemovalReason::Quota,
                )
            });
        }
        Ok(true)
    }

    /// Rebuild a tenant's reserve from a full scan. False if the tenant has no keys.
    fn rebuild_quota_reserve(&self, tid: u32, need: usize) -> bool {
        self.enforcement.quota.with(tid, |r| r.reset(RECORDING));
        let tenant_keys = read(&self.store.counters).tenant_keys(tid) as usize;
        let k = need.max(self.settings.cap_reserve).max(tenant_keys / 32);
        let mut gather: Gather<QuotaVictim> = Gather::new(k);
        self.scan_keys(|p, hash, holders| {
            if p.tenant_id != tid {
                return;
            }
            let age = key_age(holders);
            gather.offer(
                |top| cmp_quota((age, p, hash), top.view()),
                || QuotaVictim {
                    age,
                    part: p.clone(),
                    hash: Box::from(hash),
                },
            );
        });
        self.enforcement
            .quota
            .with(tid, |r| r.install(gather.into_vec(), 2 * k + 1024))
    }
}

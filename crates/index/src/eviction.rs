//! Eviction (§2.5): TTL sweep (shard by shard), global cap, tenant quota.

use crate::catalog::Partition;
use crate::index::Index;
use crate::observer::{Note, Notes, RemovalReason};
use crate::policy::EvictionAlgorithm;
use crate::shard::{Holder, KeyBuf, Shards, lock, read, split_key, write};
use crate::types::{EvictionCounts, SweepOutcome};
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

/// (partition id, replica, key removed, (hash, holder) when observed).
type Removed = (u32, u32, bool, Option<(Box<[u8]>, Holder)>);

/// Quota candidate: a whole key, ordered by (newest lastSeen, model, scheme, adapter, hash).
struct QuotaVictim {
    age: i64,
    part: Arc<Partition>,
    hash: Box<[u8]>,
}

fn cmp_quota(a: (i64, &Partition, &[u8]), b: (i64, &Partition, &[u8])) -> Ordering {
    a.0.cmp(&b.0)
        .then_with(|| a.1.model.cmp(&b.1.model))
        .then_with(|| a.1.scheme.cmp(&b.1.scheme))
        .then_with(|| a.1.adapter.cmp(&b.1.adapter))
        .then_with(|| a.2.cmp(b.2))
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
        cmp_quota(
            (self.age, &self.part, &self.hash),
            (o.age, &o.part, &o.hash),
        )
    }
}

impl Index {
    /// The periodic sweep: remove every entry and stats entry whose age is at
    /// least its tenant's TTL (shard by shard, releasing each shard lock before
    /// the next), then enforce the global cap.
    pub fn sweep(&self) -> SweepOutcome {
        let now = self.now();
        let mut out = SweepOutcome::default();
        let mut notes = Notes::new(self.observer.is_some());
        let parts = self.partitions();
        let policies = self.tenant_policies();
        let names = if notes.enabled {
            self.replica_names()
        } else {
            Vec::new()
        };
        let ttl_of = |p: &Partition| {
            policies
                .get(p.tenant_id as usize)
                .map_or(self.default_ttl_ns, |x| x.0)
        };
        let algo_of = |p: &Partition| {
            policies
                .get(p.tenant_id as usize)
                .map_or(EvictionAlgorithm::Lru, |x| x.1)
        };

        for si in 0..self.shards.len() {
            let mut shard = self.shards.write(si);
            let mut removed: Vec<Removed> = Vec::new();
            shard.retain(|key, holders| {
                let (pid, hash) = split_key(key);
                let Some(p) = parts.get(pid as usize) else {
                    return true;
                };
                let ttl = ttl_of(p);
                let before = removed.len();
                let mut i = 0;
                while i < holders.len() {
                    if now.saturating_sub(holders[i].last_seen) >= ttl {
                        let h = holders.remove(i);
                        let replica = h.replica;
                        let note = notes.enabled.then(|| (Box::from(hash), h));
                        removed.push((pid, replica, false, note));
                    } else {
                        i += 1;
                    }
                }
                let gone = holders.is_empty();
                if gone && removed.len() > before {
                    if let Some(last) = removed.last_mut() {
                        last.2 = true;
                    }
                }
                !gone
            });
            if !removed.is_empty() {
                let mut c = write(&self.counters);
                for (pid, replica, gone, _) in &removed {
                    if let Some(p) = parts.get(*pid as usize) {
                        c.on_remove(p, *replica, *gone);
                        out.evictions.add_ttl(algo_of(p), 1);
                    }
                }
            }
            drop(shard);
            for (pid, _, _, note) in removed {
                if let (Some((hash, h)), Some(p)) = (note, parts.get(pid as usize)) {
                    let name = names
                        .get(h.replica as usize)
                        .cloned()
                        .unwrap_or_else(|| Arc::from(""));
                    notes.push(|| {
                        Note::Removed(Index::change(p, &hash, name, &h), RemovalReason::Ttl)
                    });
                }
            }
        }

        // Stats TTL.
        let tm_tenants: Vec<u32> = read(&self.catalog)
            .tms
            .iter()
            .map(|t| t.tenant_id)
            .collect();
        {
            let mut stats = write(&self.stats);
            stats.retain(|tm, m| {
                let ttl = tm_tenants
                    .get(*tm as usize)
                    .and_then(|t| policies.get(*t as usize))
                    .map_or(self.default_ttl_ns, |x| x.0);
                let before = m.len();
                m.retain(|_, s| now.saturating_sub(s.last_seen) < ttl);
                out.stats_removed += (before - m.len()) as u64;
                !m.is_empty()
            });
        }

        self.enforce_cap(&mut out.evictions, &mut notes);
        notes.deliver(self.observer.as_ref());
        out
    }

    /// Enforce a tenant quota (§2.5.3): drop whole keys, oldest newest-lastSeen
    /// first, until the tenant holds at most `max` distinct prefixes.
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
        let count = read(&self.counters).tenant_keys(tid);
        if count <= max {
            return;
        }
        let _guard = lock(&self.evict_lock);
        let k = read(&self.counters).tenant_keys(tid).saturating_sub(max) as usize;
        if k == 0 {
            return;
        }
        let parts = self.partitions();
        let names = if notes.enabled {
            self.replica_names()
        } else {
            Vec::new()
        };
        let mut heap: BinaryHeap<QuotaVictim> = BinaryHeap::with_capacity(k + 1);
        for si in 0..self.shards.len() {
            let shard = self.shards.read(si);
            for (key, holders) in shard.iter() {
                let (pid, hash) = split_key(key);
                let Some(p) = parts.get(pid as usize) else {
                    continue;
                };
                if p.tenant_id != tid {
                    continue;
                }
                let age = holders
                    .iter()
                    .map(|h| h.last_seen)
                    .max()
                    .unwrap_or(i64::MIN);
                if heap.len() >= k {
                    if let Some(top) = heap.peek() {
                        if cmp_quota((age, p, hash), (top.age, &top.part, &top.hash))
                            != Ordering::Less
                        {
                            continue;
                        }
                    }
                    heap.pop();
                }
                heap.push(QuotaVictim {
                    age,
                    part: p.clone(),
                    hash: Box::from(hash),
                });
            }
        }
        let mut removed_keys = 0u64;
        for v in heap.into_sorted_vec() {
            let key = KeyBuf::new(v.part.id, &v.hash);
            let si = Shards::index_of(key.as_slice());
            let mut shard = self.shards.write(si);
            let Some(holders) = shard.remove(key.as_slice()) else {
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
            for h in holders {
                let name = names
                    .get(h.replica as usize)
                    .cloned()
                    .unwrap_or_else(|| Arc::from(""));
                notes.push(|| {
                    Note::Removed(
                        Index::change(&v.part, &v.hash, name, &h),
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
}

//! Eviction (§2.5.1): the TTL sweep, shard by shard. The global cap lives in
//! `cap.rs`, tenant quotas in `quota.rs`.

use crate::catalog::Partition;
use crate::entries::holder::Holder;
use crate::index::Index;
use crate::observer::{Note, Notes, RemovalReason};
use crate::policy::EvictionAlgorithm;
use crate::sync::{read, write};
use crate::types::SweepOutcome;
use std::sync::Arc;

/// (partition id, replica, key removed, (hash, holder) when observed).
type Removed = (u32, u32, bool, Option<(Box<[u8]>, Holder)>);

impl Index {
    /// The periodic sweep: remove every entry and stats entry whose age is at
    /// least its tenant's TTL (shard by shard, releasing each shard lock before
    /// the next), then enforce the global cap.
    pub fn sweep(&self) -> SweepOutcome {
        let now = self.now();
        let mut out = SweepOutcome::default();
        let mut notes = Notes::new(self.env.observer.is_some());
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
                .map_or(self.settings.default_ttl_ns, |x| x.0)
        };
        let algo_of = |p: &Partition| {
            policies
                .get(p.tenant_id as usize)
                .map_or(EvictionAlgorithm::Lru, |x| x.1)
        };

        for si in 0..self.store.entries.odd.len() {
            let mut shard = self.store.entries.odd.write(si);
            let mut removed: Vec<Removed> = Vec::new();
            shard.retain(|pid, hash, holders| {
                let Some(p) = parts.get(pid as usize) else {
                    return true;
                };
                let ttl = ttl_of(p);
                let before = removed.len();
                let mut i = 0;
                while i < holders.len() {
                    if now.saturating_sub(holders[i].last_seen) >= ttl {
                        let Some(h) = holders.remove(i) else {
                            break;
                        };
                        let replica = h.replica();
                        let note = notes.enabled.then(|| (Box::from(hash), h));
                        removed.push((pid, replica, false, note));
                    } else {
                        i += 1;
                    }
                }
                let gone = holders.is_empty();
                if !gone && removed.len() > before && self.enforcement.quota.active() {
                    self.enforcement.quota.on_key_changed(p, hash, holders);
                }
                if gone && removed.len() > before {
                    if let Some(last) = removed.last_mut() {
                        last.2 = true;
                    }
                }
                !gone
            });
            if !removed.is_empty() {
                let mut c = write(&self.store.counters);
                for (pid, replica, gone, _) in &removed {
                    if let Some(p) = parts.get(*pid as usize) {
                        c.on_remove(p, *replica, *gone);
                        out.evictions.add_ttl(algo_of(p), 1);
                    }
                }
            }
            // Give memory back after a mass expiry (rehash under this shard's lock only).
            if shard.capacity() > 1024 && shard.len() < shard.capacity() / 4 {
                let target = shard.len() * 2;
                shard.shrink_to(target);
            }
            drop(shard);
            for (pid, _, _, note) in removed {
                if let (Some((hash, h)), Some(p)) = (note, parts.get(pid as usize)) {
                    let name = names
                        .get(h.replica() as usize)
                        .cloned()
                        .unwrap_or_else(|| Arc::from(""));
                    notes.push(|| {
                        Note::Removed(Index::change(p, &hash, name, &h), RemovalReason::Ttl)
                    });
                }
            }
        }

        let removed = self.store.entries.sweep_arena(|part, _, last_seen| {
            parts
                .get(part as usize)
                .is_some_and(|p| now.saturating_sub(last_seen) >= ttl_of(p))
        });
        self.count_arena_removals(&parts, &removed, |p| {
            out.evictions.add_ttl(algo_of(p), 1);
        });
        let observed = notes.enabled;
        for rm in removed.into_iter().filter(|_| observed) {
            if let Some(p) = parts.get(rm.part as usize) {
                let name = names
                    .get(rm.holder.replica() as usize)
                    .cloned()
                    .unwrap_or_else(|| Arc::from(""));
                notes.push(|| {
                    Note::Removed(
                        Index::change(p, &rm.hash.to_le_bytes(), name, &rm.holder),
                        RemovalReason::Ttl,
                    )
                });
            }
        }

        // Stats TTL.
        let tm_tenants: Vec<u32> = read(&self.store.catalog)
            .tms
            .iter()
            .map(|t| t.tenant_id)
            .collect();
        {
            let mut stats = self.stats.write();
            stats.retain(|tm, m| {
                let ttl = tm_tenants
                    .get(*tm as usize)
                    .and_then(|t| policies.get(*t as usize))
                    .map_or(self.settings.default_ttl_ns, |x| x.0);
                let before = m.len();
                m.retain(|_, s| now.saturating_sub(s.last_seen) < ttl);
                if m.len() != before {
                    crate::cold_sets::fleet_changed();
                }
                out.stats_removed += (before - m.len()) as u64;
                !m.is_empty()
            });
        }

        out.tentative_expired = self.routing.tentative.sweep(now);
        self.enforce_cap(&mut out.evictions, &mut notes);
        notes.deliver(self.env.observer.as_ref());
        out.replicas_released = self.release_idle_replicas();
        out
    }
}

//! Events (§2.4).

use crate::catalog::Partition;
use crate::clock::wire_us_to_ns;
use crate::entries::holder;
use crate::entries::{ArenaRemoval, Taken};
use crate::index::Index;
use crate::ingest::PREFETCH;
use crate::key::{KeyRef, key_hash};
use crate::observer::{Note, Notes, RemovalReason};
use crate::sync::{read, write};
use crate::types::{CacheEvent, EventKind, EventOutcome};
use arrayvec::ArrayVec;
use std::sync::Arc;

/// The resolved (partitions, replica) of a `PrefixEvicted`.
pub(crate) struct EvictTarget {
    parts: Arc<[Arc<Partition>]>,
    replica: u32,
    name: Arc<str>,
}

impl Index {
    /// Apply one event. Unknown wire types never reach here (see
    /// [`EventKind::from_wire`]); `PrefixAdded` is a no-op.
    pub fn apply_event(&self, ev: &CacheEvent) -> EventOutcome {
        let _gate = read(&self.store.gate);
        let mut out = EventOutcome::default();
        let mut notes = Notes::new(self.env.observer.is_some());
        self.event_write(ev, self.now(), None, &mut out, &mut notes);
        notes.deliver(self.env.observer.as_ref());
        out
    }

    /// One event without the gate (the caller holds it) or delivery. A
    /// `PrefixEvicted` uses `target` when given (a batch resolves the
    /// (tenant, model, replica) of a burst once).
    pub(crate) fn event_write(
        &self,
        ev: &CacheEvent,
        now: i64,
        target: Option<&EvictTarget>,
        out: &mut EventOutcome,
        notes: &mut Notes,
    ) {
        let ts = wire_us_to_ns(ev.timestamp_us, now);
        match ev.kind {
            EventKind::PrefixAdded => {}
            EventKind::PrefixEvicted => match target {
                Some(t) => self.evict_prefix_at(t, ev, out, notes),
                None => {
                    if let Some(t) = self.evict_target(ev) {
                        self.evict_prefix_at(&t, ev, out, notes);
                    }
                }
            },
            EventKind::ReplicaUpdated => {
                let ids = {
                    let c = read(&self.store.catalog);
                    c.find_tm(&ev.tenant_id, &ev.model_id)
                        .zip(c.find_replica(&ev.replica_id))
                        .map(|(tm, r)| {
                            (
                                tm,
                                r,
                                c.tms[tm as usize].tenant.clone(),
                                c.tms[tm as usize].model.clone(),
                                c.replica_name(r),
                            )
                        })
                };
                if let Some((tm, r, tenant, model, name)) = ids {
                    let mut stats = self.stats.write();
                    if let Some(s) = stats.get_mut(&tm).and_then(|m| m.get_mut(&r)) {
                        if self.routing.cold.may_have_been_stale(s.last_seen, ts, now) {
                            crate::cold_sets::fleet_changed();
                        }
                        s.last_seen = ts;
                        out.stats_touched += 1;
                        drop(stats);
                        notes.push(|| Note::Updated(tenant, model, name, ts));
                    }
                }
            }
            EventKind::AllCleared => self.clear_replica(ev, ts, out, notes),
        }
    }

    /// What a `PrefixEvicted` of (tenant, model, replica) resolves to; `None`
    /// when any of them is unknown (nothing to remove).
    pub(crate) fn evict_target(&self, ev: &CacheEvent) -> Option<EvictTarget> {
        let c = read(&self.store.catalog);
        let tm = c.find_tm(&ev.tenant_id, &ev.model_id)?;
        let r = c.find_replica(&ev.replica_id)?;
        let t = EvictTarget {
            parts: c.tms[tm as usize].part_refs.clone(),
            replica: r,
            name: c.replica_name(r),
        };
        drop(c);
        // A replica that reports evictions publishes events (`tentative.rs`);
        // marked once per resolution (a batch's burst shares one).
        self.routing.tentative.mark_publisher(r);
        Some(t)
    }

    /// Start the cache misses of the keys that a burst of `PrefixEvicted`
    /// events for target `t` removes, the first [`PREFETCH`] of them, before
    /// [`Index::event_write`] probes them one at a time (a batch's eviction
    /// burst: the table misses were most of a removal,
    /// BENCHMARKS.md). Returns the number of events covered (at least one,
    /// so that a caller always moves on).
    pub(crate) fn prefetch_evictions<'e>(
        &self,
        t: &EvictTarget,
        evs: impl Iterator<Item = &'e CacheEvent>,
    ) -> usize {
        // Arena blocks as (partition, key hash); odd keys are not loaded ahead.
        let mut blocks: ArrayVec<(u32, u64), PREFETCH> = ArrayVec::new();
        let mut covered = 0;
        'fill: for ev in evs {
            let in_arena = self.store.entries.arena_block(&ev.prefix_hash).is_some();
            for p in t
                .parts
                .iter()
                .filter(|p| ev.adapter_id.is_empty() || *p.adapter == *ev.adapter_id)
            {
                if blocks.len() == PREFETCH {
                    break 'fill;
                }
                if in_arena {
                    blocks.push((p.id, key_hash(p.id, &ev.prefix_hash)));
                }
            }
            covered += 1;
        }
        self.store.entries.arena().prefetch_keys(&blocks);
        covered.max(1)
    }

    fn evict_prefix_at(
        &self,
        t: &EvictTarget,
        ev: &CacheEvent,
        out: &mut EventOutcome,
        notes: &mut Notes,
    ) {
        let (parts, replica, name) = (&t.parts, t.replica, &t.name);
        let wanted = parts
            .iter()
            .filter(|p| ev.adapter_id.is_empty() || *p.adapter == *ev.adapter_id);
        if self.routing.tentative.active() {
            let keys: Vec<(u32, u64)> = wanted
                .clone()
                .map(|p| (p.id, key_hash(p.id, &ev.prefix_hash)))
                .collect();
            out.tentative_removed += self.routing.tentative.remove_many(replica, &keys);
        }
        for p in wanted {
            let key = KeyRef::new(p.id, &ev.prefix_hash);
            let taken = self.store.entries.take(
                &key,
                replica,
                |_, _| true,
                |_, rest| {
                    if !rest.is_empty() && self.enforcement.quota.active() {
                        self.enforcement
                            .quota
                            .on_key_changed(p, &ev.prefix_hash, rest);
                    }
                    write(&self.store.counters).on_remove(p, replica, rest.is_empty());
                },
            );
            if let Taken::Removed(h) = taken {
                out.entries_removed += 1;
                notes.push(|| {
                    Note::Removed(
                        Index::change(p, &ev.prefix_hash, name.clone(), &h),
                        RemovalReason::Evicted,
                    )
                });
            }
        }
    }

    /// The counters and quota reserves after an arena sweep removed
    /// `removed` (`each` sees every removal whose partition is known).
    pub(crate) fn count_arena_removals(
        &self,
        parts: &[Arc<Partition>],
        removed: &[ArenaRemoval],
        mut each: impl FnMut(&Partition),
    ) {
        if removed.is_empty() {
            return;
        }
        {
            let mut c = write(&self.store.counters);
            for rm in removed {
                if let Some(p) = parts.get(rm.part as usize) {
                    c.on_remove(p, rm.holder.replica(), rm.key_gone);
                    each(p);
                }
            }
        }
        if self.enforcement.quota.active() {
            for rm in removed.iter().filter(|rm| !rm.key_gone) {
                if let Some(p) = parts.get(rm.part as usize) {
                    let bytes = rm.hash.to_le_bytes();
                    self.store
                        .entries
                        .holders(&KeyRef::new(p.id, &bytes), |hs| {
                            self.enforcement.quota.on_key_changed(p, &bytes, hs)
                        });
                }
            }
        }
    }

    fn clear_replica(&self, ev: &CacheEvent, ts: i64, out: &mut EventOutcome, notes: &mut Notes) {
        let found = {
            let c = read(&self.store.catalog);
            match (
                c.find_tm(&ev.tenant_id, &ev.model_id),
                c.find_replica(&ev.replica_id),
            ) {
                (Some(tm), Some(r)) => {
                    let t = &c.tms[tm as usize];
                    let mut is_part = vec![false; c.parts.len()];
                    for &p in &t.parts {
                        is_part[p as usize] = true;
                    }
                    Some((
                        tm,
                        r,
                        c.replica_name(r),
                        is_part,
                        t.scopes.clone(),
                        c.parts.clone(),
                        t.tenant.clone(),
                        t.model.clone(),
                    ))
                }
                _ => None,
            }
        };
        let Some((tm, replica, name, is_part, scopes, parts, tenant, model)) = found else {
            return;
        };
        self.routing.tentative.mark_publisher(replica);
        if self.routing.tentative.active() {
            let ids: Vec<u32> = (0..is_part.len() as u32)
                .filter(|&p| is_part[p as usize])
                .collect();
            out.tentative_removed += self.routing.tentative.clear(&ids, replica);
        }
        // How many entries the replica holds under (tenant, model): stop the walk early.
        let mut expected: u64 = {
            let c = read(&self.store.counters);
            scopes
                .iter()
                .map(|&s| c.scope(s).map_or(0, |m| m.held(replica)))
                .sum()
        };
        let mut si = 0;
        while expected > 0 && si < self.store.entries.odd.len() {
            let mut shard = self.store.entries.odd.write(si);
            let mut removed = Vec::new();
            shard.retain(|pid, hash, holders| {
                if !is_part.get(pid as usize).copied().unwrap_or(false) {
                    return true;
                }
                if let Ok(i) = holder::position(holders, replica) {
                    let Some(h) = holders.remove(i) else {
                        return true;
                    };
                    let gone = holders.is_empty();
                    if !gone && self.enforcement.quota.active() {
                        if let Some(p) = parts.get(pid as usize) {
                            self.enforcement.quota.on_key_changed(p, hash, holders);
                        }
                    }
                    let note = notes.enabled.then(|| (hash.to_vec(), h));
                    removed.push((pid, gone, note));
                    return !gone;
                }
                true
            });
            if !removed.is_empty() {
                let mut c = write(&self.store.counters);
                for (pid, gone, _) in &removed {
                    if let Some(p) = parts.get(*pid as usize) {
                        c.on_remove(p, replica, *gone);
                    }
                }
            }
            drop(shard);
            expected = expected.saturating_sub(removed.len() as u64);
            out.entries_removed += removed.len() as u64;
            for (pid, _, note) in removed {
                if let (Some((hash, h)), Some(p)) = (note, parts.get(pid as usize)) {
                    notes.push(|| {
                        Note::Removed(
                            Index::change(p, &hash, name.clone(), &h),
                            RemovalReason::Cleared,
                        )
                    });
                }
            }
            si += 1;
        }
        if expected > 0 {
            let removed = self.store.entries.sweep_arena(|part, r, _| {
                r == replica && is_part.get(part as usize).copied().unwrap_or(false)
            });
            out.entries_removed += removed.len() as u64;
            self.count_arena_removals(&parts, &removed, |_| {});
            for rm in removed {
                if let Some(p) = parts.get(rm.part as usize) {
                    notes.push(|| {
                        Note::Removed(
                            Index::change(p, &rm.hash.to_le_bytes(), name.clone(), &rm.holder),
                            RemovalReason::Cleared,
                        )
                    });
                }
            }
        }
        {
            let mut stats = self.stats.write();
            if let Some(m) = stats.get_mut(&tm) {
                if m.remove(&replica).is_some() {
                    out.stats_touched += 1;
                    crate::cold_sets::fleet_changed();
                }
                if m.is_empty() {
                    stats.remove(&tm);
                }
            }
        }
        let name: Arc<str> = name;
        notes.push(|| Note::Cleared(tenant, model, name, ts));
    }
}

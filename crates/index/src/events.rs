//! Events (§2.4).

use crate::clock::wire_us_to_ns;
use crate::index::Index;
use crate::key::{KeyRef, key_hash};
use crate::observer::{Note, Notes, RemovalReason};
use crate::shard::{read, write};
use crate::types::{CacheEvent, EventKind, EventOutcome};
use std::sync::Arc;

impl Index {
    /// Apply one event. Unknown wire types never reach here (see
    /// [`EventKind::from_wire`]); `PrefixAdded` is a no-op.
    pub fn apply_event(&self, ev: &CacheEvent) -> EventOutcome {
        let _gate = read(&self.gate);
        let ts = wire_us_to_ns(ev.timestamp_us, self.now());
        let mut out = EventOutcome::default();
        let mut notes = Notes::new(self.observer.is_some());
        match ev.kind {
            EventKind::PrefixAdded => {}
            EventKind::PrefixEvicted => self.evict_prefix(ev, &mut out, &mut notes),
            EventKind::ReplicaUpdated => {
                let ids = {
                    let c = read(&self.catalog);
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
                    let mut stats = write(&self.stats);
                    if let Some(s) = stats.get_mut(&tm).and_then(|m| m.get_mut(&r)) {
                        s.last_seen = ts;
                        out.stats_touched = 1;
                        drop(stats);
                        notes.push(|| Note::Updated(tenant, model, name, ts));
                    }
                }
            }
            EventKind::AllCleared => self.clear_replica(ev, ts, &mut out, &mut notes),
        }
        notes.deliver(self.observer.as_ref());
        out
    }

    fn evict_prefix(&self, ev: &CacheEvent, out: &mut EventOutcome, notes: &mut Notes) {
        let (parts, replica, name) = {
            let c = read(&self.catalog);
            let (Some(tm), Some(r)) = (
                c.find_tm(&ev.tenant_id, &ev.model_id),
                c.find_replica(&ev.replica_id),
            ) else {
                return;
            };
            (c.tms[tm as usize].part_refs.clone(), r, c.replica_name(r))
        };
        self.tentative.mark_publisher(replica);
        let wanted = parts
            .iter()
            .filter(|p| ev.adapter_id.is_empty() || *p.adapter == *ev.adapter_id);
        if self.tentative.active() {
            let keys: Vec<(u32, u64)> = wanted
                .clone()
                .map(|p| (p.id, key_hash(p.id, &ev.prefix_hash)))
                .collect();
            out.tentative_removed += self.tentative.remove_many(replica, &keys);
        }
        for p in wanted {
            let key = KeyRef::new(p.id, &ev.prefix_hash);
            let mut shard = self.shards.write(key.shard());
            if let Some((h, rest)) = shard.take_holder(&key, replica) {
                let gone = rest.is_none();
                if let Some(hs) = rest.filter(|_| self.quota.active()) {
                    self.quota.on_key_changed(p, &ev.prefix_hash, hs);
                }
                write(&self.counters).on_remove(p, replica, gone);
                drop(shard);
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

    fn clear_replica(&self, ev: &CacheEvent, ts: i64, out: &mut EventOutcome, notes: &mut Notes) {
        let found = {
            let c = read(&self.catalog);
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
        self.tentative.mark_publisher(replica);
        if self.tentative.active() {
            let ids: Vec<u32> = (0..is_part.len() as u32)
                .filter(|&p| is_part[p as usize])
                .collect();
            out.tentative_removed += self.tentative.clear(&ids, replica);
        }
        // How many entries the replica holds under (tenant, model): stop the walk early.
        let mut expected: u64 = {
            let c = read(&self.counters);
            scopes
                .iter()
                .map(|&s| c.scope(s).map_or(0, |m| m.held(replica)))
                .sum()
        };
        let mut si = 0;
        while expected > 0 && si < self.shards.len() {
            let mut shard = self.shards.write(si);
            let mut removed = Vec::new();
            shard.retain(|pid, hash, holders| {
                if !is_part.get(pid as usize).copied().unwrap_or(false) {
                    return true;
                }
                if let Ok(i) = holders.binary_search_by_key(&replica, |h| h.replica) {
                    let Some(h) = holders.remove(i) else {
                        return true;
                    };
                    let gone = holders.is_empty();
                    if !gone && self.quota.active() {
                        if let Some(p) = parts.get(pid as usize) {
                            self.quota.on_key_changed(p, hash, holders);
                        }
                    }
                    let note = notes.enabled.then(|| (hash.to_vec(), h));
                    removed.push((pid, gone, note));
                    return !gone;
                }
                true
            });
            if !removed.is_empty() {
                let mut c = write(&self.counters);
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
        {
            let mut stats = write(&self.stats);
            if let Some(m) = stats.get_mut(&tm) {
                if m.remove(&replica).is_some() {
                    out.stats_touched = 1;
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

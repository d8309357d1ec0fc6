//! Replica records bounded: every replica id the index knows is interned
//! (a dense `u32` indexing the counter vectors), and a record lives as long
//! as the replica holds an entry or has a stats record. Without this, each
//! distinct id ever reported would stay interned forever.
//!
//! The sweep calls [`Index::release_idle_replicas`] after the TTL pass: ids
//! holding nothing and reporting nothing are released (their name forgotten,
//! so a later report re-interns them) and become reusable one sweep later.
//! The release holds the index's `gate` exclusively, so no ingest or event is
//! between resolving an id and writing with it; lookups never hold ids across
//! a sweep period, which the one-sweep quarantine covers. A replica with
//! unexpired tentative holdings or queued delivered work (approximate mode,
//! `routing.rs`) is not idle: its id still names live routing state.

use crate::index::Index;
use crate::sync::{read, write};

impl Index {
    /// Releases every replica id that holds no entry and has no stats record;
    /// recycles the ids released by the previous call. Returns how many were
    /// released.
    pub(crate) fn release_idle_replicas(&self) -> u64 {
        let _gate = write(&self.store.gate);
        let held = read(&self.store.counters).held_by_replica.clone();
        let mut reporting = vec![false; held.len()];
        for m in self.stats.read().values() {
            for &r in m.keys() {
                let r = r as usize;
                if reporting.len() <= r {
                    reporting.resize(r + 1, false);
                }
                reporting[r] = true;
            }
        }
        let now = self.now();
        for (_, r, _) in self.routing.tentative.counts(now) {
            let r = r as usize;
            if reporting.len() <= r {
                reporting.resize(r + 1, false);
            }
            reporting[r] = true;
        }
        let mut catalog = write(&self.store.catalog);
        catalog.recycle_replicas();
        let mut released = 0;
        let mut pools = Vec::new();
        for id in catalog.live_replica_ids() {
            let i = id as usize;
            let idle =
                held.get(i).is_none_or(|&n| n == 0) && !reporting.get(i).copied().unwrap_or(false);
            if idle && self.routing.load.queued_us(id, now) < 1.0 {
                catalog.release_replica(id);
                pools.push(id);
                self.routing.load.forget(id);
                self.routing.tentative.forget_replica(id);
                released += 1;
            }
        }
        drop(catalog);
        // Its pool facts go with the id (reused one sweep later).
        let mut c = write(&self.store.counters);
        pools.into_iter().for_each(|id| c.forget_pool(id));
        released
    }

    /// Distinct replica ids currently known (holding entries or stats, or
    /// reported since the last sweep).
    pub fn live_replicas(&self) -> usize {
        read(&self.store.catalog).live_replicas()
    }

    /// The configured replica limit (0 = unbounded).
    pub fn max_replicas(&self) -> usize {
        self.settings.max_replicas
    }
}

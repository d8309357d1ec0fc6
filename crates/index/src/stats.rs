//! Replica stats: (tenant, model) → replica → the last reported stats.
//!
//! Lookups read them for the pressure factor, but most deployments of the
//! chain path (and `bench/peers`) report none: [`Stats::read_any`] then
//! answers from one flag, so a lookup takes no read lock (a shared cache
//! line every lookup thread writes) for a map it would find empty.

use crate::hashing::FoldBuild;
use crate::sync::{read, write};
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Stored replica stats.
#[derive(Debug, Clone)]
pub(crate) struct StatsEntry {
    pub(crate) cache_memory_bytes: i64,
    pub(crate) hit_rate: f32,
    pub(crate) pressure: f32,
    pub(crate) client_version: Arc<str>,
    pub(crate) t2_hit_tokens: i64,
    pub(crate) t2_query_tokens: i64,
    /// The engine's load (sanitized); `None` = the producer reports none.
    pub(crate) load: Option<crate::types::EngineLoad>,
    pub(crate) last_seen: i64,
    pub(crate) stats_reported: i64,
}

impl StatsEntry {
    /// The pressure the default ranking charges for: the reported one,
    /// unless the producer also reports the engine's load. Then the running
    /// and waiting requests are the replica's queue (`load.rs`), and our
    /// sidecar's pressure is those same counts over a ceiling: charged
    /// again, a scrape that caught one request running kept a replica
    /// 0.2 ms dearer for the whole interval after that request ended, so
    /// the room rule never saw the tie it breaks (issue 33).
    pub(crate) fn ranking_pressure(&self) -> f32 {
        if self.load.is_some() {
            0.0
        } else {
            self.pressure
        }
    }

    /// The public view of these stats under `replica_id` (aggregates and
    /// the export share it).
    pub(crate) fn view(&self, replica_id: Arc<str>) -> crate::types::ReplicaStatsView {
        crate::types::ReplicaStatsView {
            replica_id,
            cache_memory_bytes: self.cache_memory_bytes,
            hit_rate: self.hit_rate,
            pressure: self.pressure,
            client_version: self.client_version.clone(),
            t2_hit_tokens: self.t2_hit_tokens,
            t2_query_tokens: self.t2_query_tokens,
            load: self.load,
            last_seen_ns: self.last_seen,
            stats_reported_ns: self.stats_reported,
        }
    }
}

/// (tenant, model) id → replica id → stats.
pub(crate) type StatsMap = HashMap<u32, HashMap<u32, StatsEntry, FoldBuild>, FoldBuild>;

/// The stats map and whether it holds anything.
#[derive(Default)]
pub(crate) struct Stats {
    map: RwLock<StatsMap>,
    /// `!map.is_empty()`, published by every writer before it unlocks.
    any: AtomicBool,
}

impl Stats {
    /// The map, read-locked.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, StatsMap> {
        read(&self.map)
    }

    /// The map read-locked, or `None` without locking when it is empty.
    pub(crate) fn read_any(&self) -> Option<RwLockReadGuard<'_, StatsMap>> {
        self.any.load(Ordering::Acquire).then(|| self.read())
    }

    /// The map, write-locked; the guard republishes emptiness on drop.
    pub(crate) fn write(&self) -> StatsWrite<'_> {
        StatsWrite {
            guard: write(&self.map),
            any: &self.any,
        }
    }
}

/// A write lock on [`Stats`].
pub(crate) struct StatsWrite<'a> {
    guard: RwLockWriteGuard<'a, StatsMap>,
    any: &'a AtomicBool,
}

impl Deref for StatsWrite<'_> {
    type Target = StatsMap;
    fn deref(&self) -> &StatsMap {
        &self.guard
    }
}

impl DerefMut for StatsWrite<'_> {
    fn deref_mut(&mut self) -> &mut StatsMap {
        &mut self.guard
    }
}

impl Drop for StatsWrite<'_> {
    fn drop(&mut self) {
        // Still under the lock: a reader that sees `false` saw a map that
        // was empty at some point after its last writer. Written only when
        // it changes: every lookup reads this line.
        let any = !self.guard.is_empty();
        if self.any.load(Ordering::Relaxed) != any {
            self.any.store(any, Ordering::Release);
        }
    }
}

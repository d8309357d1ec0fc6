//! The fleet sets' data (`cold.rs` builds and reads them): what an
//! [`crate::index::Index`] holds and what ingest signals, kept apart from
//! the ranking so the index and its writers need not import it.

use crate::fleet::room_bucket;
use crate::hashing::FoldBuild;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// Bumped by every write a [`ColdSet`] is built from (stats, a scope's
/// membership): a set built before it is rebuilt. One counter for every
/// index in the process (an index's rebuilds caused by another's writes cost
/// time, never answers).
pub(crate) static FLEET_CHANGES: AtomicU64 = AtomicU64::new(0);

/// Something a [`ColdSet`] is built from changed.
#[inline]
pub(crate) fn fleet_changed() {
    FLEET_CHANGES.fetch_add(1, Ordering::Release);
}

/// The most sets kept (one per (tenant, model, scope, TTL) looked up); past
/// it they are all dropped and rebuilt as needed.
pub(crate) const MAX_SETS: usize = 256;

/// Members of equal pressure and room bucket, by name label.
pub(crate) struct Class {
    pub(crate) pressure: f32,
    pub(crate) room: Option<i32>,
    /// Rank of the first member: the classes' members, one after the other,
    /// are ranks `0..n` (a lookup marks excluded members in bitsets by rank).
    pub(crate) start: usize,
    /// (name label, replica id), ascending.
    pub(crate) members: Vec<(u64, u32)>,
}

impl Class {
    pub(crate) fn ranks(&self) -> (usize, usize) {
        (self.start, self.start + self.members.len())
    }
}

/// The live fleet of one (tenant, model, scope, TTL), ordered for the pick.
pub(crate) struct ColdSet {
    pub(crate) built_ns: i64,
    /// The first instant a member's stats stop being fresh.
    pub(crate) valid_until: i64,
    pub(crate) changes: u64,
    pub(crate) names_epoch: u64,
    /// Slot of the set's recent-count sum in the load tracker.
    pub(crate) slot: usize,
    /// Members.
    pub(crate) n: usize,
    pub(crate) members: Vec<u64>,
    /// By replica id: pressure, KV usage (NaN: none), rank.
    pub(crate) pressure: Vec<f32>,
    pub(crate) usage: Vec<f32>,
    pub(crate) rank_of: Vec<u32>,
    /// Ascending by (pressure, room bucket: reported first, lowest first).
    pub(crate) classes: Vec<Class>,
    /// A pressure is NaN: the one-pass ranking answers.
    pub(crate) exotic: bool,
}

impl ColdSet {
    #[inline]
    pub(crate) fn has(&self, id: u32) -> bool {
        self.members
            .get(id as usize / 64)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }

    pub(crate) fn valid(&self, now: i64, changes: u64, epoch: u64) -> bool {
        now >= self.built_ns
            && now < self.valid_until
            && changes == self.changes
            && epoch == self.names_epoch
    }
}

/// (tm, scope or `u32::MAX`, TTL).
pub(crate) type SetKey = (u32, u32, i64);

/// The sets by key.
pub(crate) struct ColdSets {
    pub(crate) map: RwLock<HashMap<SetKey, Arc<ColdSet>, FoldBuild>>,
    /// The shortest TTL any set was built for (never raised): a stats
    /// refresh of an entry younger than it changes no set.
    pub(crate) min_ttl: std::sync::atomic::AtomicI64,
}

impl Default for ColdSets {
    fn default() -> Self {
        Self {
            map: RwLock::default(),
            min_ttl: std::sync::atomic::AtomicI64::new(i64::MAX),
        }
    }
}

impl ColdSets {
    /// Whether a stats entry refreshed from `last_seen` to `ts` at `now`
    /// may have been stale for some set (then it may join one), or moves
    /// back in time (then it may leave one sooner than its set expects).
    pub(crate) fn may_have_been_stale(&self, last_seen: i64, ts: i64, now: i64) -> bool {
        let min_ttl = self.min_ttl.load(Ordering::SeqCst);
        ts < last_seen || last_seen.saturating_add(min_ttl) <= now
    }

    /// Whether replacing the stats entry `old` by `new` at `now` changes
    /// what a set reads: membership, pressure, KV room.
    pub(crate) fn stats_matter(
        &self,
        old: Option<&crate::stats::StatsEntry>,
        new: &crate::stats::StatsEntry,
        now: i64,
    ) -> bool {
        let Some(old) = old else {
            return true;
        };
        let room = |s: &crate::stats::StatsEntry| s.load.map(|l| room_bucket(l.kv_cache_usage));
        old.ranking_pressure()
            .total_cmp(&new.ranking_pressure())
            .is_ne()
            || room(old) != room(new)
            || self.may_have_been_stale(old.last_seen, new.last_seen, now)
            || self.may_have_been_stale(old.stats_reported, new.stats_reported, now)
    }
}

//! Sharded entry storage.
//!
//! 64 shards, each a `RwLock` over a bucket table (`table.rs`) of `u32`
//! positions into a dense array of slots (key and holders). A key's 64-bit
//! hash ([`KeyRef`]) is computed once and picks both the shard and the
//! bucket. No code path ever holds two shard write locks; a chain lookup may
//! hold several read locks, always taken in ascending shard order (see
//! `chain.rs`).

use crate::hashing::FoldBuild;
use crate::holder::{self, Holder, Holders};
use crate::holder_pool::{HolderPool, Marks};
use crate::key::{EntryKey, KeyRef, shard_of};
use crate::table::{MAX_SLOTS, Table};
use arrayvec::ArrayVec;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

/// One key and its holder, or the mark of its holders' block in the
/// shard's pool (`holder_pool.rs`): 32 bytes.
pub(crate) struct Slot {
    key: EntryKey,
    first: Holder,
}

impl Marks for [Slot] {
    fn mark(&mut self, pos: usize) -> Option<&mut Holder> {
        self.get_mut(pos).map(|s| &mut s.first)
    }
}

/// The table of one shard: 4-byte buckets over a dense array of slots, so a
/// key costs its 32-byte slot plus 4 bytes per bucket whatever the table's
/// load factor, and a key with several holders a block of the pool. Removal
/// swaps the last slot into the hole and repoints its bucket.
///
/// LFU counts live beside the slots in `credits`, keyed by (slot position,
/// replica), and only for holders flagged [`Holder::credited`]: most
/// holders are never credited, so none of them pays 4 bytes for a count.
/// The table is behind its own mutex because a credit arrives under the
/// shard's read lock; every path that moves or drops a slot or a holder
/// moves or drops its count with it.
#[derive(Default)]
pub(crate) struct ShardMap {
    table: Table,
    slots: Vec<Slot>,
    pool: HolderPool,
    credits: Mutex<Credits>,
}

type Credits = HashMap<u64, u32, FoldBuild>;

/// A credit-table key.
#[inline]
fn ckey(pos: usize, replica: u32) -> u64 {
    ((pos as u64) << 32) | u64::from(replica)
}

/// What [`ShardMap::upsert`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upsert {
    /// The replica already held the key: tokens, time and tier refreshed.
    Refreshed,
    /// A new holder of an existing key.
    Added,
    /// A new key.
    NewKey,
    /// A new key in a shard already at [`MAX_SLOTS`]: nothing stored.
    Full,
}

/// The holders of one key with what reading their LFU counts needs: the
/// slot table's per-shard credit table or the arena's side table.
pub(crate) struct Held<'a> {
    counts: Counts<'a>,
    holders: &'a [Holder],
}

enum Counts<'a> {
    Slot {
        map: &'a ShardMap,
        pos: usize,
    },
    Arena {
        credits: &'a crate::entries::Credits,
        part: u32,
        hash: u64,
    },
}

impl<'a> Held<'a> {
    /// The holders of arena block (`part`, `hash`), counted in `credits`.
    pub(crate) fn arena(
        holders: &'a [Holder],
        credits: &'a crate::entries::Credits,
        part: u32,
        hash: u64,
    ) -> Self {
        Self {
            counts: Counts::Arena {
                credits,
                part,
                hash,
            },
            holders,
        }
    }

    /// The LFU count of `h`, one of these holders.
    pub(crate) fn access(&self, h: &Holder) -> u64 {
        match self.counts {
            Counts::Slot { map, pos } => map.access_at(pos, h),
            Counts::Arena {
                credits,
                part,
                hash,
            } => credits.get(part, hash, h.replica()),
        }
    }
}

impl std::ops::Deref for Held<'_> {
    type Target = [Holder];
    #[inline]
    fn deref(&self) -> &[Holder] {
        self.holders
    }
}

/// The key hash of the slot at `i` (one folded multiply for an 8-byte
/// prefix hash; only rebuilds and the moved slot of a removal need it).
#[inline]
fn hash_at(slots: &[Slot], i: usize) -> u64 {
    slots.get(i).map_or(0, |s| s.key.as_ref().hash)
}

impl ShardMap {
    #[inline]
    fn find(&self, k: &KeyRef<'_>) -> Option<usize> {
        let slots = &self.slots;
        self.table.find(k.hash, |i| {
            slots.get(i).is_some_and(|s| s.key.matches(k.part, k.bytes))
        })
    }

    #[inline]
    pub(crate) fn get(&self, k: &KeyRef<'_>) -> Option<&[Holder]> {
        let i = self.find(k)?;
        self.slots.get(i).map(|s| self.pool.slice(&s.first))
    }

    /// The holders of the slot at `i` (empty past the end).
    fn get_slot(&self, i: usize) -> &[Holder] {
        self.slots.get(i).map_or(&[], |s| self.pool.slice(&s.first))
    }

    /// The holders of `k` with their LFU counts.
    pub(crate) fn held(&self, k: &KeyRef<'_>) -> Option<Held<'_>> {
        let pos = self.find(k)?;
        self.slots.get(pos).map(|s| Held {
            counts: Counts::Slot { map: self, pos },
            holders: self.pool.slice(&s.first),
        })
    }

    fn access_at(&self, pos: usize, h: &Holder) -> u64 {
        if !h.credited() {
            return 0;
        }
        lock(&self.credits)
            .get(&ckey(pos, h.replica()))
            .map_or(0, |&n| u64::from(n))
    }

    /// +1 delivered hit for `replica`'s holder of `k`, if it still exists
    /// (under the shard's read lock). Saturates at `u32::MAX`.
    pub(crate) fn credit(&self, k: &KeyRef<'_>, replica: u32) {
        let Some(pos) = self.find(k) else { return };
        let Some(h) = self
            .slots
            .get(pos)
            .and_then(|s| holder::find(self.pool.slice(&s.first), replica))
        else {
            return;
        };
        let mut credits = lock(&self.credits);
        let n = credits.entry(ckey(pos, replica)).or_insert(0);
        if !h.credited() {
            // Only a flagged holder owns its count (a count never outlives
            // its holder; this keeps even a stray one from carrying over).
            *n = 0;
        }
        *n = n.saturating_add(1);
        h.mark_credited();
    }

    /// Insert or refresh `h`'s replica as a holder of `k`; `access` > 0
    /// overwrites its LFU count (snapshot restore).
    pub(crate) fn upsert(&mut self, k: &KeyRef<'_>, h: Holder, access: u64) -> Upsert {
        let replica = h.replica();
        let (pos, done) = match self.find(k) {
            None => {
                if !self.insert_new(k, h) {
                    return Upsert::Full;
                }
                (self.slots.len() - 1, Upsert::NewKey)
            }
            Some(pos) => {
                let Self { slots, pool, .. } = self;
                let Some(first) = slots.get_mut(pos).map(|s| &mut s.first) else {
                    return Upsert::Full;
                };
                match holder::position(pool.slice(first), replica) {
                    Ok(i) => {
                        if let Some(old) = pool.slice_mut(first).get_mut(i) {
                            old.tokens = h.tokens;
                            old.last_seen = h.last_seen;
                            old.set_tier(h.tier());
                        }
                        (pos, Upsert::Refreshed)
                    }
                    Err(i) => {
                        pool.insert(slots.as_mut_slice(), pos, i, h);
                        (pos, Upsert::Added)
                    }
                }
            }
        };
        if access > 0 {
            let Self {
                slots,
                pool,
                credits,
                ..
            } = self;
            if let Some(h) = slots
                .get(pos)
                .and_then(|s| holder::find(pool.slice(&s.first), replica))
            {
                lock_mut(credits).insert(
                    ckey(pos, replica),
                    u32::try_from(access).unwrap_or(u32::MAX),
                );
                h.mark_credited();
            }
        }
        done
    }

    /// The first bucket a probe for `k` reads, loaded so that its cache miss
    /// starts now (a chain lookup's first stage; the value means nothing).
    #[inline]
    pub(crate) fn touch_bucket(&self, hash: u64) -> u32 {
        self.table.home(hash)
    }

    /// The slot position whose bucket tag matches `hash` first (unconfirmed),
    /// with its first word loaded so that the slot's miss starts now.
    #[inline]
    pub(crate) fn touch_slot(&self, hash: u64) -> Option<(usize, u32)> {
        let i = self.table.candidate(hash)?;
        let s = self.slots.get(i)?;
        Some((i, s.key.part()))
    }

    /// The holders of `k`, trying position `i` (from [`ShardMap::touch_slot`])
    /// before a full probe.
    #[inline]
    pub(crate) fn get_at(&self, i: usize, k: &KeyRef<'_>) -> Option<&[Holder]> {
        match self.slots.get(i) {
            Some(s) if s.key.matches(k.part, k.bytes) => Some(self.pool.slice(&s.first)),
            _ => self.get(k),
        }
    }

    /// Insert a key the caller has just seen absent, with one holder.
    /// `false` (nothing stored) only when the shard already holds
    /// [`MAX_SLOTS`] keys.
    #[inline]
    pub(crate) fn insert_new(&mut self, k: &KeyRef<'_>, h: Holder) -> bool {
        self.insert_within(k, h, MAX_SLOTS)
    }

    /// [`ShardMap::insert_new`] with the slot limit as a parameter (tests
    /// reach it without 33.5 M keys).
    #[inline]
    fn insert_within(&mut self, k: &KeyRef<'_>, h: Holder, limit: usize) -> bool {
        let i = self.slots.len();
        if i >= limit {
            return false;
        }
        let slots = &self.slots;
        self.table.reserve_one(i, |j| hash_at(slots, j));
        if i == self.slots.capacity() {
            // Grow by a quarter, not the doubling `push` would pick: a
            // shard's slot array is most of the index's memory, and a large
            // reallocation is a remap, not a copy, so growing more often
            // costs little (bytes per holding, BENCHMARKS.md).
            self.slots.reserve_exact((i / 4).max(16));
        }
        self.slots.push(Slot {
            key: k.to_key(),
            first: h,
        });
        self.table.insert(k.hash, i);
        true
    }

    /// Remove the slot at `i` whose bucket is already gone, with its
    /// holders: the last slot moves into the hole and its bucket is
    /// repointed.
    fn swap_out(&mut self, i: usize) -> Option<Holders> {
        if i >= self.slots.len() {
            return None;
        }
        let last = self.slots.len() - 1;
        let mut slot = self.slots.swap_remove(i);
        if let Some(moved) = self.slots.get(i) {
            self.pool.moved(&moved.first, i);
        }
        let holders = self
            .pool
            .take_detached(self.slots.as_mut_slice(), &mut slot.first);
        let credits = lock_mut(&mut self.credits);
        for h in holders.iter().filter(|h| h.credited()) {
            credits.remove(&ckey(i, h.replica()));
        }
        if i != last {
            let h = hash_at(&self.slots, i);
            self.table.repoint(h, last, i);
            if let Some(moved) = self.slots.get(i) {
                for h in self
                    .pool
                    .slice(&moved.first)
                    .iter()
                    .filter(|h| h.credited())
                {
                    if let Some(n) = credits.remove(&ckey(last, h.replica())) {
                        credits.insert(ckey(i, h.replica()), n);
                    }
                }
            }
        }
        Some(holders)
    }

    /// The bucket of `k` taken out of the table, with its position.
    fn take_bucket(&mut self, k: &KeyRef<'_>) -> Option<usize> {
        let slots = &self.slots;
        self.table.remove(k.hash, |i| {
            slots.get(i).is_some_and(|s| s.key.matches(k.part, k.bytes))
        })
    }

    pub(crate) fn remove(&mut self, k: &KeyRef<'_>) -> Option<Holders> {
        let i = self.take_bucket(k)?;
        self.swap_out(i)
    }

    /// Remove `replica` from the key with one probe. Returns the holder and
    /// the key's remaining holders (`None` when the key went with it).
    pub(crate) fn take_holder(
        &mut self,
        k: &KeyRef<'_>,
        replica: u32,
    ) -> Option<(Holder, Option<&[Holder]>)> {
        let i = self.find(k)?;
        let first = &self.slots.get(i)?.first;
        let j = holder::position(self.pool.slice(first), replica).ok()?;
        let h = self.pool.remove(self.slots.as_mut_slice(), i, j)?;
        if h.credited() {
            lock_mut(&mut self.credits).remove(&ckey(i, replica));
        }
        if self.get_slot(i).is_empty() {
            let i = self.take_bucket(k)?;
            self.swap_out(i);
            return Some((h, None));
        }
        Some((h, Some(self.get_slot(i))))
    }

    /// Every key as (partition id, hash bytes, holders).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &[u8], Held<'_>)> {
        self.slots.iter().enumerate().map(move |(pos, s)| {
            let held = Held {
                counts: Counts::Slot { map: self, pos },
                holders: self.pool.slice(&s.first),
            };
            (s.key.part(), s.key.hash_bytes(), held)
        })
    }

    /// Keep the keys for which `f(partition id, hash bytes, holders)` is true.
    /// Slots are visited in storage order; the table is rebuilt once if any
    /// key went (a sweep reads every slot anyway). Holders `f` removes lose
    /// their LFU counts; the kept ones' counts follow their slots.
    pub(crate) fn retain(&mut self, mut f: impl FnMut(u32, &[u8], &mut HoldersMut<'_>) -> bool) {
        let before = self.slots.len();
        let Self {
            slots,
            pool,
            credits,
            ..
        } = self;
        let credits = lock_mut(credits);
        // Counts follow their kept slots to their new positions.
        let mut old = (!credits.is_empty()).then(|| std::mem::take(credits));
        let (mut from, mut to) = (0usize, 0usize);
        slots.retain_mut(|s| {
            let keep = f(
                s.key.part(),
                s.key.hash_bytes(),
                &mut HoldersMut {
                    first: &mut s.first,
                    pool: &mut *pool,
                },
            );
            if !keep {
                // A dropped slot's block goes at the compaction below.
                pool.forget(&s.first);
            } else {
                pool.moved(&s.first, to);
                if let Some(old) = old.as_mut() {
                    for h in pool.slice(&s.first).iter().filter(|h| h.credited()) {
                        if let Some(n) = old.remove(&ckey(from, h.replica())) {
                            credits.insert(ckey(to, h.replica()), n);
                        }
                    }
                }
            }
            to += usize::from(keep);
            from += 1;
            keep
        });
        if self.slots.len() != before {
            let slots = &self.slots;
            self.table.rehash(slots.len(), |j| hash_at(slots, j));
        }
        self.compact_pool();
    }

    /// Rebuild the holder pool if a sweep left unused blocks (a sweep reads
    /// every slot anyway).
    fn compact_pool(&mut self) {
        if self.pool.is_dirty() {
            self.pool.compact(&mut self.slots, |s| &mut s.first);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    pub(crate) fn shrink_to(&mut self, n: usize) {
        let slots = &self.slots;
        self.table.shrink_to(n, slots.len(), |j| hash_at(slots, j));
        self.slots.shrink_to(n);
    }
}

/// The holders of one slot as a sweep's callback edits them.
pub(crate) struct HoldersMut<'a> {
    first: &'a mut Holder,
    pool: &'a mut HolderPool,
}

impl HoldersMut<'_> {
    /// Remove the holder at `i` (the slot goes when the callback says so).
    pub(crate) fn remove(&mut self, i: usize) -> Option<Holder> {
        self.pool.remove_in_place(self.first, i)
    }
}

impl std::ops::Deref for HoldersMut<'_> {
    type Target = [Holder];
    #[inline]
    fn deref(&self) -> &[Holder] {
        self.pool.slice(self.first)
    }
}

/// Lock attempts before a reader or writer blocks (about 10-30 us of spinning).
const LOCK_RETRIES: usize = 1_000;

/// Number of shards (power of two; [`KeyRef::shard`] takes 6 bits).
pub(crate) const SHARDS: usize = 64;

/// One shard's lock and table header on cache lines of its own: a writer
/// locking one shard never invalidates the line a reader of its neighbour
/// holds (the lock word and the header share a line, which the lock's own
/// read-modify-write brings into the reader's cache anyway). 128 bytes
/// because the adjacent-line prefetcher pairs 64-byte lines.
#[repr(align(128))]
struct Padded(RwLock<ShardMap>);

/// The shards.
pub(crate) struct Shards {
    shards: Box<[Padded]>,
}

impl Shards {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Padded(RwLock::new(ShardMap::default())))
                .collect(),
        }
    }

    /// A shard's read lock, retried like [`Shards::write`] before it blocks
    /// (a writer holds a shard for one key's update, well under the retries).
    #[inline]
    pub(crate) fn read(&self, i: usize) -> RwLockReadGuard<'_, ShardMap> {
        read_spinning(&self.shards[i % SHARDS].0)
    }

    /// A shard's write lock. A writer that finds the shard read-locked
    /// retries for a while before it blocks: a chain lookup holds a window's
    /// read locks for a microsecond or two, longer than the lock's own spin,
    /// and a writer that went to sleep costs that reader a wake-up system
    /// call on its unlock (most of a concurrent reader's p99, BENCHMARKS.md).
    /// After the retries it blocks as before, so a stream of readers cannot
    /// starve it.
    #[inline]
    pub(crate) fn write(&self, i: usize) -> RwLockWriteGuard<'_, ShardMap> {
        write_spinning(&self.shards[i % SHARDS].0)
    }

    pub(crate) fn len(&self) -> usize {
        SHARDS
    }

    /// The read guards of every shard the keys `hashes` live in
    /// ([`ReadSet`]).
    pub(crate) fn read_set(&self, hashes: &[u64]) -> ReadSet<'_> {
        let mut mask = 0u64;
        for &h in hashes {
            mask |= 1u64 << shard_of(h);
        }
        let mut set = ReadSet {
            guards: ArrayVec::new(),
            slot_of: [0u8; SHARDS],
        };
        while mask != 0 {
            let si = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            set.slot_of[si] = set.guards.len() as u8;
            set.guards.push(self.read(si));
        }
        set
    }

    /// Start the cache misses of these keys' buckets, then of their slots,
    /// before a writer's per-key passes need them: a run of writes then
    /// waits for memory about once instead of once per key (measured: a
    /// lock per touch instead of one [`ReadSet`] spent 18 % of a store
    /// burst in this function, BENCHMARKS.md). At most 64 keys.
    pub(crate) fn prefetch(&self, hashes: &[u64]) {
        let mut at = [usize::MAX; 64];
        self.read_set(hashes).touch(hashes, &mut at);
    }
}

/// The read guards of every shard a run of keys lives in, each taken once,
/// in ascending shard order (so two holders of several read locks can never
/// wait on each other through a queued writer), before any key is probed:
/// a lock is an atomic read-modify-write, which on x86 waits for every
/// earlier load, so a lock taken between two probes would queue their
/// misses one behind the other.
pub(crate) struct ReadSet<'a> {
    guards: ArrayVec<RwLockReadGuard<'a, ShardMap>, SHARDS>,
    /// Position in `guards` of each shard's guard.
    slot_of: [u8; SHARDS],
}

impl ReadSet<'_> {
    /// The shard of key hash `h` (one of the set's keys).
    #[inline]
    pub(crate) fn get(&self, h: u64) -> Option<&ShardMap> {
        self.guards
            .get(usize::from(self.slot_of[shard_of(h)]))
            .map(|g| &**g)
    }

    /// Two passes over `hashes` so that their cache misses overlap: load
    /// every key's first bucket; then, those lines in cache, find each
    /// key's tag-matching slot (its position into `at`, unconfirmed) and
    /// load its first word. The loaded values only feed `black_box` (they
    /// start the loads; nothing reads them).
    pub(crate) fn touch(&self, hashes: &[u64], at: &mut [usize]) {
        let mut touched = 0u64;
        for &h in hashes {
            if let Some(g) = self.get(h) {
                touched ^= u64::from(g.touch_bucket(h));
            }
        }
        for (a, &h) in at.iter_mut().zip(hashes) {
            if let Some((i, word)) = self.get(h).and_then(|g| g.touch_slot(h)) {
                *a = i;
                touched ^= u64::from(word);
            }
        }
        std::hint::black_box(touched);
    }
}

/// A read lock tried [`LOCK_RETRIES`] times before the caller blocks: a
/// lock held for a few microseconds is cheaper to wait out spinning than
/// asleep (a sleeping waiter costs the holder a wake-up system call).
#[inline]
pub(crate) fn read_spinning<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    spin(|| l.try_read(), || read(l))
}

/// [`read_spinning`] for the write lock.
#[inline]
pub(crate) fn write_spinning<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    spin(|| l.try_write(), || write(l))
}

/// `try_lock` up to [`LOCK_RETRIES`] times (a poisoned lock is taken as
/// it is), then `lock`.
#[inline]
fn spin<G>(try_lock: impl Fn() -> Result<G, TryLockError<G>>, lock: impl FnOnce() -> G) -> G {
    for _ in 0..LOCK_RETRIES {
        match try_lock() {
            Ok(g) => return g,
            Err(TryLockError::Poisoned(e)) => return e.into_inner(),
            Err(TryLockError::WouldBlock) => std::hint::spin_loop(),
        }
    }
    lock()
}

/// A read lock if it is free now (poison-tolerant), `None` if a writer
/// holds it: for a check that must not wait.
#[inline]
pub(crate) fn try_read_now<T>(l: &RwLock<T>) -> Option<RwLockReadGuard<'_, T>> {
    match l.try_read() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Poison-tolerant lock helpers (a panic elsewhere never wedges the index).
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// See [`read`].
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// A mutex's value through `&mut` (no locking), poison-tolerant.
fn lock_mut<T>(l: &mut Mutex<T>) -> &mut T {
    l.get_mut().unwrap_or_else(|e| e.into_inner())
}

/// See [`read`].
pub(crate) fn lock<T>(l: &Mutex<T>) -> MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Tier;

    fn one(r: u32) -> Holder {
        Holder::new(r, 0, Tier::T1, 0)
    }

    fn access(m: &ShardMap, k: &[u8; 8], replica: u32) -> Option<u64> {
        let held = m.held(&KeyRef::new(1, k))?;
        let h = held.iter().find(|h| h.replica() == replica)?;
        Some(held.access(h))
    }

    fn up(m: &mut ShardMap, k: &[u8; 8], replica: u32, access: u64) -> Upsert {
        m.upsert(
            &KeyRef::new(1, k),
            Holder::new(replica, 5, Tier::T2, 7),
            access,
        )
    }

    /// LFU counts follow their holders through every move a slot makes
    /// (a removal's swap, a sweep's compaction) and die with them.
    #[test]
    fn credits_follow_moved_slots_and_die_with_their_holders() {
        let keys: Vec<[u8; 8]> = (0u64..6).map(|i| i.to_le_bytes()).collect();
        let mut m = ShardMap::default();
        for k in &keys {
            assert_eq!(up(&mut m, k, 1, 0), Upsert::NewKey);
        }
        assert_eq!(up(&mut m, &keys[5], 2, 0), Upsert::Added);
        for _ in 0..3 {
            m.credit(&KeyRef::new(1, &keys[5]), 2);
        }
        m.credit(&KeyRef::new(1, &keys[4]), 1);
        m.credit(&KeyRef::new(1, &keys[4]), 9); // not a holder: ignored
        assert_eq!(access(&m, &keys[5], 2), Some(3));
        assert_eq!(access(&m, &keys[5], 1), Some(0));
        // The last slot (keys[5]) moves into keys[0]'s hole.
        assert!(m.remove(&KeyRef::new(1, &keys[0])).is_some());
        assert_eq!(access(&m, &keys[5], 2), Some(3));
        assert_eq!(access(&m, &keys[4], 1), Some(1));
        // A sweep that drops keys[1] and replica 2 of keys[5] compacts.
        m.retain(|_, hash, hs| {
            if hash == keys[5].as_slice() {
                hs.remove(1);
            }
            hash != keys[1].as_slice()
        });
        assert_eq!(access(&m, &keys[4], 1), Some(1));
        assert_eq!(access(&m, &keys[5], 1), Some(0));
        // Re-added, replica 2 starts from zero; a refresh keeps a count.
        assert_eq!(up(&mut m, &keys[5], 2, 0), Upsert::Added);
        assert_eq!(access(&m, &keys[5], 2), Some(0));
        assert_eq!(up(&mut m, &keys[4], 1, 0), Upsert::Refreshed);
        assert_eq!(access(&m, &keys[4], 1), Some(1));
        // A restore overwrites; taking the holder drops its count.
        assert_eq!(up(&mut m, &keys[2], 1, 40), Upsert::Refreshed);
        assert_eq!(access(&m, &keys[2], 1), Some(40));
        let (gone, rest) = m.take_holder(&KeyRef::new(1, &keys[4]), 1).unwrap();
        assert_eq!(
            (gone.replica(), gone.tier(), rest.is_none()),
            (1, Tier::T2, true)
        );
        let live: usize = m
            .iter()
            .map(|(_, _, hs)| hs.iter().filter(|h| h.credited()).count())
            .sum();
        assert_eq!(lock(&m.credits).len(), live);
        assert_eq!(live, 1);
    }

    #[test]
    fn a_slot_is_a_key_and_one_holder() {
        assert_eq!(std::mem::size_of::<Slot>(), 32);
    }

    /// Keys that gain and lose holders keep them through the pool, and the
    /// holders of a removed key come back whole.
    #[test]
    fn many_holders_live_in_the_pool_and_leave_with_their_key() {
        let keys: Vec<[u8; 8]> = (0u64..50).map(|i| i.to_le_bytes()).collect();
        let mut m = ShardMap::default();
        for (i, k) in keys.iter().enumerate() {
            for r in 0..(i % 6) as u32 + 1 {
                up(&mut m, k, r, 0);
            }
        }
        let ids = |m: &ShardMap, k: &[u8; 8]| -> Vec<u32> {
            m.get(&KeyRef::new(1, k))
                .map(|hs| hs.iter().map(Holder::replica).collect())
                .unwrap_or_default()
        };
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(ids(&m, k), (0..(i % 6) as u32 + 1).collect::<Vec<_>>());
        }
        let n = m.slots.len();
        m.pool.check(m.slots.as_mut_slice(), n);
        let gone = m.remove(&KeyRef::new(1, &keys[5])).unwrap();
        assert_eq!(
            gone.iter().map(Holder::replica).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4, 5]
        );
        let (h, rest) = m.take_holder(&KeyRef::new(1, &keys[4]), 2).unwrap();
        assert_eq!((h.replica(), rest.map(<[Holder]>::len)), (2, Some(4)));
        let n = m.slots.len();
        m.pool.check(m.slots.as_mut_slice(), n);
        m.retain(|_, _, hs| {
            while hs.len() > 1 {
                hs.remove(0);
            }
            true
        });
        for (i, k) in keys.iter().enumerate().filter(|(i, _)| *i != 5) {
            let top = (i % 6) as u32;
            assert_eq!(ids(&m, k), [top], "key {i}");
        }
        let n = m.slots.len();
        m.pool.check(m.slots.as_mut_slice(), n);
    }

    #[test]
    fn a_full_shard_refuses_a_new_key_and_keeps_the_rest() {
        let keys: Vec<[u8; 8]> = (0u64..5).map(|i| i.to_le_bytes()).collect();
        let mut m = ShardMap::default();
        for (i, k) in keys.iter().take(4).enumerate() {
            assert!(m.insert_within(&KeyRef::new(1, k), one(i as u32), 4));
        }
        assert!(!m.insert_within(&KeyRef::new(1, &keys[4]), one(4), 4));
        assert!(m.get(&KeyRef::new(1, &keys[4])).is_none());
        assert_eq!(m.len(), 4);
        for (i, k) in keys.iter().take(4).enumerate() {
            assert_eq!(
                m.get(&KeyRef::new(1, k)).map(|h| h[0].replica()),
                Some(i as u32)
            );
        }
    }

    #[test]
    fn removal_repoints_the_moved_slot() {
        let keys: Vec<[u8; 8]> = (0u64..200).map(|i| i.to_le_bytes()).collect();
        let mut m = ShardMap::default();
        for (i, k) in keys.iter().enumerate() {
            m.insert_new(&KeyRef::new(1, k), one(i as u32));
        }
        for k in keys.iter().step_by(3) {
            assert!(m.remove(&KeyRef::new(1, k)).is_some());
        }
        m.retain(|_, h, _| h[0] % 5 != 0);
        assert!(m.take_holder(&KeyRef::new(1, &keys[1]), 1).is_some());
        for (i, k) in keys.iter().enumerate() {
            let live = i % 3 != 0 && k[0] % 5 != 0 && i != 1;
            let got = m.get(&KeyRef::new(1, k)).map(|h| h[0].replica());
            assert_eq!(got, live.then_some(i as u32), "key {i}");
        }
        assert_eq!(m.len(), m.iter().count());
        m.shrink_to(0);
        assert_eq!(
            m.len(),
            keys.len()
                - keys
                    .iter()
                    .enumerate()
                    .filter(|(i, k)| i % 3 == 0 || k[0] % 5 == 0 || *i == 1)
                    .count()
        );
    }
}

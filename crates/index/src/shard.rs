//! Sharded entry storage.
//!
//! 64 shards, each a `RwLock` over a `hashbrown::HashTable` of slots (key and
//! holders). A key's 64-bit hash ([`KeyRef`]) is computed once and picks both
//! the shard and the bucket. No code path ever holds two shard write locks;
//! a chain lookup may hold several read locks, always taken in ascending
//! shard order (see `lookup.rs`).

use crate::holder::{Holder, Holders};
use crate::key::{EntryKey, KeyRef};
use hashbrown::HashTable;
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// One key and its holders: 48 bytes.
pub(crate) struct Slot {
    key: EntryKey,
    holders: Holders,
}

fn rehash(s: &Slot) -> u64 {
    s.key.as_ref().hash
}

/// The table of one shard.
#[derive(Default)]
pub(crate) struct ShardMap {
    table: HashTable<Slot>,
}

impl ShardMap {
    #[inline]
    pub(crate) fn get(&self, k: &KeyRef<'_>) -> Option<&Holders> {
        self.table
            .find(k.hash, |s| s.key.matches(k.part, k.bytes))
            .map(|s| &s.holders)
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, k: &KeyRef<'_>) -> Option<&mut Holders> {
        self.table
            .find_mut(k.hash, |s| s.key.matches(k.part, k.bytes))
            .map(|s| &mut s.holders)
    }

    /// Insert a key the caller has just seen absent.
    #[inline]
    pub(crate) fn insert_new(&mut self, k: &KeyRef<'_>, holders: Holders) {
        self.table.insert_unique(
            k.hash,
            Slot {
                key: k.to_key(),
                holders,
            },
            rehash,
        );
    }

    pub(crate) fn remove(&mut self, k: &KeyRef<'_>) -> Option<Holders> {
        self.table
            .find_entry(k.hash, |s| s.key.matches(k.part, k.bytes))
            .ok()
            .map(|e| e.remove().0.holders)
    }

    /// Remove `replica` from the key with one probe. Returns the holder and
    /// the key's remaining holders (`None` when the key went with it).
    pub(crate) fn take_holder(
        &mut self,
        k: &KeyRef<'_>,
        replica: u32,
    ) -> Option<(Holder, Option<&Holders>)> {
        let mut e = self
            .table
            .find_entry(k.hash, |s| s.key.matches(k.part, k.bytes))
            .ok()?;
        let holders = &mut e.get_mut().holders;
        let i = holders.binary_search_by_key(&replica, |h| h.replica).ok()?;
        let h = holders.remove(i)?;
        if holders.is_empty() {
            e.remove();
            return Some((h, None));
        }
        Some((h, Some(&e.into_mut().holders)))
    }

    /// Every key as (partition id, hash bytes, holders).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &[u8], &Holders)> {
        self.table
            .iter()
            .map(|s| (s.key.part(), s.key.hash_bytes(), &s.holders))
    }

    /// Keep the keys for which `f(partition id, hash bytes, holders)` is true.
    pub(crate) fn retain(&mut self, mut f: impl FnMut(u32, &[u8], &mut Holders) -> bool) {
        self.table
            .retain(|s| f(s.key.part(), s.key.hash_bytes(), &mut s.holders));
    }

    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    pub(crate) fn capacity(&self) -> usize {
        self.table.capacity()
    }

    pub(crate) fn shrink_to(&mut self, n: usize) {
        self.table.shrink_to(n, rehash);
    }
}

/// Number of shards (power of two; [`KeyRef::shard`] takes 6 bits).
pub(crate) const SHARDS: usize = 64;

/// The shards.
pub(crate) struct Shards {
    shards: Box<[RwLock<ShardMap>]>,
}

impl Shards {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(ShardMap::default()))
                .collect(),
        }
    }

    #[inline]
    pub(crate) fn read(&self, i: usize) -> RwLockReadGuard<'_, ShardMap> {
        read(&self.shards[i % SHARDS])
    }

    #[inline]
    pub(crate) fn write(&self, i: usize) -> RwLockWriteGuard<'_, ShardMap> {
        write(&self.shards[i % SHARDS])
    }

    pub(crate) fn len(&self) -> usize {
        SHARDS
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

/// See [`read`].
pub(crate) fn lock<T>(l: &Mutex<T>) -> MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

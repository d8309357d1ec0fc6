//! Sharded entry storage.
//!
//! 64 shards, each a `RwLock` over a `hashbrown::HashTable` whose buckets
//! hold the slots (key and holders). A key's 64-bit hash ([`KeyRef`]) is computed once and picks both
//! the shard and the bucket. No code path ever holds two shard write locks;
//! a chain lookup may hold several read locks, always taken in ascending
//! shard order (see `lookup.rs`).

use crate::holder::{Holder, Holders};
use crate::key::{EntryKey, KeyRef};
use hashbrown::HashTable;
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// One key and its holders: 48 bytes, stored in the hash table's own bucket.
pub(crate) struct Slot {
    key: EntryKey,
    holders: Holders,
}

/// The table of one shard: the 48-byte slots live in the hash table's
/// buckets, so a probe goes control byte -> slot (one dependent load less
/// per block than a table of positions over a separate slot array).
#[derive(Default)]
pub(crate) struct ShardMap {
    table: HashTable<Slot>,
}

/// The bucket hasher: a slot's key hash (one folded multiply for an 8-byte
/// prefix hash; only table growth and shrinking recompute it).
#[inline]
fn rehash(s: &Slot) -> u64 {
    s.key.as_ref().hash
}

impl ShardMap {
    // `get`, `get_mut` and `take_holder` each probe with their own closure: a
    // probe shared by several callers is one `RawTable::find` instance that
    // LLVM stops inlining (+13 % instructions on a refresh in callgrind).
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
        let e = self
            .table
            .find_entry(k.hash, |s| s.key.matches(k.part, k.bytes))
            .ok()?;
        Some(e.remove().0.holders)
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
        let j = holders.binary_search_by_key(&replica, |h| h.replica).ok()?;
        let h = holders.remove(j)?;
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
        self.table.retain(|s| {
            let Slot { key, holders } = s;
            f(key.part(), key.hash_bytes(), holders)
        });
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

/// One shard's lock and table on cache lines of its own: a writer locking
/// one shard never invalidates the line a reader of its neighbour holds
/// (the lock word and the table header share a line, which the lock's own
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

    #[inline]
    pub(crate) fn read(&self, i: usize) -> RwLockReadGuard<'_, ShardMap> {
        read(&self.shards[i % SHARDS].0)
    }

    #[inline]
    pub(crate) fn write(&self, i: usize) -> RwLockWriteGuard<'_, ShardMap> {
        write(&self.shards[i % SHARDS].0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Tier;

    fn one(r: u32) -> Holders {
        Holders::one(Holder::new(r, 0, Tier::T1, 0))
    }

    #[test]
    fn removal_keeps_every_other_slot() {
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
            let got = m.get(&KeyRef::new(1, k)).map(|h| h[0].replica);
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

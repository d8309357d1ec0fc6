//! Keys that are not 8 bytes long: a plain sharded map.
//!
//! Every engine's chain block is an 8-byte hash (the arena's); only legacy
//! `prefix_hash` keys of another length land here, so this store is built
//! for being obviously right, not for speed: per shard, a `HashMap` from
//! the key's 64-bit hash ([`KeyRef`]) to the keys with that hash (one,
//! barring a 64-bit collision), each with its holders sorted by replica id
//! and their LFU counts beside them (atomics: a credit comes under the
//! shard's read lock).

use super::Held;
use super::holder::{Holder, position};
use crate::hashing::FoldBuild;
use crate::key::{EntryKey, KeyRef, shard_of};
use crate::sync::{read, write};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Number of shards (a power of two).
const SHARDS: usize = 16;

/// What [`OddMap::upsert`] did (the arena's outcomes map onto it too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Upsert {
    /// The replica already held the key: tokens, time and tier refreshed.
    Refreshed,
    /// A new holder of an existing key.
    Added,
    /// A new key.
    NewKey,
    /// Nothing stored (the arena's shard table was full).
    Full,
}

/// One key, its holders (sorted by replica id) and their LFU counts.
struct Slot {
    key: EntryKey,
    holders: Vec<Holder>,
    access: Vec<AtomicU32>,
}

/// One shard's keys.
#[derive(Default)]
pub(crate) struct OddMap {
    map: HashMap<u64, Vec<Slot>, FoldBuild>,
    keys: usize,
}

/// The shards.
pub(crate) struct OddKeys {
    shards: Box<[RwLock<OddMap>]>,
}

impl OddKeys {
    pub(crate) fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| RwLock::default()).collect(),
        }
    }

    /// The shard a key hash lives in.
    #[inline]
    pub(crate) fn shard(k: &KeyRef<'_>) -> usize {
        shard_of(k.hash) % SHARDS
    }

    pub(crate) fn read(&self, i: usize) -> RwLockReadGuard<'_, OddMap> {
        read(&self.shards[i % SHARDS])
    }

    pub(crate) fn write(&self, i: usize) -> RwLockWriteGuard<'_, OddMap> {
        write(&self.shards[i % SHARDS])
    }

    /// Number of shards.
    pub(crate) fn len(&self) -> usize {
        SHARDS
    }
}

impl OddMap {
    fn slot(&self, k: &KeyRef<'_>) -> Option<&Slot> {
        self.map
            .get(&k.hash)?
            .iter()
            .find(|s| s.key.matches(k.part, k.bytes))
    }

    pub(crate) fn get(&self, k: &KeyRef<'_>) -> Option<&[Holder]> {
        self.slot(k).map(|s| s.holders.as_slice())
    }

    /// The holders of `k` with their LFU counts.
    pub(crate) fn held(&self, k: &KeyRef<'_>) -> Option<Held<'_>> {
        self.slot(k).map(|s| Held::odd(&s.holders, &s.access))
    }

    /// +1 delivered hit for `replica`'s holder of `k`, if it still exists
    /// (under the shard's read lock). Saturates at `u32::MAX`.
    pub(crate) fn credit(&self, k: &KeyRef<'_>, replica: u32) {
        let Some(s) = self.slot(k) else { return };
        if let Some(a) = position(&s.holders, replica)
            .ok()
            .and_then(|i| s.access.get(i))
        {
            let _ = a.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_add(1))
            });
        }
    }

    /// Insert or refresh `h`'s replica as a holder of `k`; `access` > 0
    /// overwrites its LFU count (snapshot restore).
    pub(crate) fn upsert(&mut self, k: &KeyRef<'_>, h: Holder, access: u64) -> Upsert {
        let count = u32::try_from(access).unwrap_or(u32::MAX);
        let same = self.map.entry(k.hash).or_default();
        let Some(s) = same.iter_mut().find(|s| s.key.matches(k.part, k.bytes)) else {
            same.push(Slot {
                key: k.to_key(),
                holders: vec![h],
                access: vec![AtomicU32::new(count)],
            });
            self.keys += 1;
            return Upsert::NewKey;
        };
        match position(&s.holders, h.replica()) {
            Ok(i) => {
                s.holders[i] = h;
                if access > 0 {
                    *s.access[i].get_mut() = count;
                }
                Upsert::Refreshed
            }
            Err(i) => {
                s.holders.insert(i, h);
                s.access.insert(i, AtomicU32::new(count));
                Upsert::Added
            }
        }
    }

    /// Removes `k` with its holders.
    pub(crate) fn remove(&mut self, k: &KeyRef<'_>) -> Option<Vec<Holder>> {
        let same = self.map.get_mut(&k.hash)?;
        let i = same.iter().position(|s| s.key.matches(k.part, k.bytes))?;
        let s = same.swap_remove(i);
        if same.is_empty() {
            self.map.remove(&k.hash);
        }
        self.keys -= 1;
        Some(s.holders)
    }

    /// Removes `replica` from the key. Returns the holder and the key's
    /// remaining holders (`None` when the key went with it).
    pub(crate) fn take_holder(
        &mut self,
        k: &KeyRef<'_>,
        replica: u32,
    ) -> Option<(Holder, Option<&[Holder]>)> {
        let same = self.map.get_mut(&k.hash)?;
        let si = same.iter().position(|s| s.key.matches(k.part, k.bytes))?;
        let s = &mut same[si];
        let i = position(&s.holders, replica).ok()?;
        let h = s.holders.remove(i);
        s.access.remove(i);
        if !s.holders.is_empty() {
            let s = self.map.get(&k.hash)?.get(si)?;
            return Some((h, Some(s.holders.as_slice())));
        }
        self.remove(k);
        Some((h, None))
    }

    /// Every key as (partition id, hash bytes, holders).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &[u8], Held<'_>)> {
        self.map.values().flatten().map(|s| {
            (
                s.key.part(),
                s.key.hash_bytes(),
                Held::odd(&s.holders, &s.access),
            )
        })
    }

    /// Keep the keys for which `f(partition id, hash bytes, holders)` is
    /// true; holders `f` removes lose their LFU counts with them.
    pub(crate) fn retain(&mut self, mut f: impl FnMut(u32, &[u8], &mut HoldersMut<'_>) -> bool) {
        let mut gone = 0;
        self.map.retain(|_, same| {
            same.retain_mut(|s| {
                let keep = f(
                    s.key.part(),
                    s.key.hash_bytes(),
                    &mut HoldersMut {
                        holders: &mut s.holders,
                        access: &mut s.access,
                    },
                );
                gone += usize::from(!keep);
                keep
            });
            !same.is_empty()
        });
        self.keys -= gone;
    }

    /// Number of keys.
    pub(crate) fn len(&self) -> usize {
        self.keys
    }

    /// Keys the map has room for without growing.
    pub(crate) fn capacity(&self) -> usize {
        self.map.capacity()
    }

    /// Gives memory back down to room for `n` keys.
    pub(crate) fn shrink_to(&mut self, n: usize) {
        self.map.shrink_to(n);
    }
}

/// The holders of one key as a sweep's callback edits them.
pub(crate) struct HoldersMut<'a> {
    holders: &'a mut Vec<Holder>,
    access: &'a mut Vec<AtomicU32>,
}

impl HoldersMut<'_> {
    /// Remove the holder at `i` with its LFU count (the key goes when the
    /// callback says so).
    pub(crate) fn remove(&mut self, i: usize) -> Option<Holder> {
        if i >= self.holders.len() {
            return None;
        }
        self.access.remove(i);
        Some(self.holders.remove(i))
    }
}

impl std::ops::Deref for HoldersMut<'_> {
    type Target = [Holder];
    #[inline]
    fn deref(&self) -> &[Holder] {
        self.holders
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Tier;

    fn up(m: &mut OddMap, k: &[u8], replica: u32, access: u64) -> Upsert {
        m.upsert(
            &KeyRef::new(1, k),
            Holder::new(replica, 5, Tier::T2, 7),
            access,
        )
    }

    fn access(m: &OddMap, k: &[u8], replica: u32) -> Option<u64> {
        let held = m.held(&KeyRef::new(1, k))?;
        let h = *held.iter().find(|h| h.replica() == replica)?;
        Some(held.access(&h))
    }

    /// LFU counts stay with their holders through inserts before them and
    /// removals, and die with them.
    #[test]
    fn counts_follow_their_holders_and_die_with_them() {
        let k = [1u8; 4];
        let mut m = OddMap::default();
        assert_eq!(up(&mut m, &k, 5, 0), Upsert::NewKey);
        for _ in 0..3 {
            m.credit(&KeyRef::new(1, &k), 5);
        }
        m.credit(&KeyRef::new(1, &k), 9); // not a holder: ignored
        assert_eq!(up(&mut m, &k, 2, 0), Upsert::Added);
        assert_eq!(access(&m, &k, 5), Some(3));
        assert_eq!(access(&m, &k, 2), Some(0));
        assert_eq!(up(&mut m, &k, 5, 0), Upsert::Refreshed);
        assert_eq!(access(&m, &k, 5), Some(3));
        assert_eq!(up(&mut m, &k, 5, 40), Upsert::Refreshed);
        assert_eq!(access(&m, &k, 5), Some(40));
        let (h, rest) = m.take_holder(&KeyRef::new(1, &k), 2).unwrap();
        assert_eq!((h.replica(), rest.map(<[Holder]>::len)), (2, Some(1)));
        assert_eq!(access(&m, &k, 5), Some(40));
        let (h, rest) = m.take_holder(&KeyRef::new(1, &k), 5).unwrap();
        assert_eq!((h.replica(), rest.is_none(), m.len()), (5, true, 0));
        assert_eq!(up(&mut m, &k, 5, 0), Upsert::NewKey);
        assert_eq!(access(&m, &k, 5), Some(0));
    }

    #[test]
    fn keys_of_any_length_live_apart() {
        let keys: Vec<Vec<u8>> = (0..40u8)
            .map(|n| vec![n; usize::from(n % 20) + 1])
            .collect();
        let mut m = OddMap::default();
        for (i, k) in keys.iter().enumerate() {
            for r in 0..(i % 4) as u32 + 1 {
                up(&mut m, k, r, 0);
            }
        }
        assert_eq!(m.len(), keys.len());
        assert_eq!(m.iter().count(), keys.len());
        let gone = m.remove(&KeyRef::new(1, &keys[3])).unwrap();
        assert_eq!(
            gone.iter().map(Holder::replica).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        m.retain(|_, hash, hs| {
            while hs.len() > 1 {
                hs.remove(0);
            }
            hash.len() != 5
        });
        for (i, k) in keys.iter().enumerate() {
            let want = (i != 3 && k.len() != 5).then_some((i % 4) as u32);
            let got = m.get(&KeyRef::new(1, k)).map(|h| h[0].replica());
            assert_eq!(got, want, "key {i}");
        }
        assert_eq!(m.len(), m.iter().count());
        m.shrink_to(0);
    }
}

//! Sharded entry storage.
//!
//! An entry key is `partition id (4 bytes LE) ‖ prefix hash bytes`, stored as a
//! boxed byte slice so lookups borrow a stack-built `[u8]` without allocating.
//! Each key maps to its holders (inline when single, else a `Vec<Holder>`), sorted by interned replica id
//! (chain lookups merge-join runs against it). Shards are independent
//! `RwLock`s; no code path ever holds two shard locks at once.

use crate::hashing::{FoldBuild, shard_hash};
use crate::types::Tier;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// One (prefix key, replica) entry: 32 bytes.
#[derive(Debug)]
pub(crate) struct Holder {
    pub(crate) replica: u32,
    pub(crate) tokens: i32,
    pub(crate) tier: Tier,
    pub(crate) last_seen: i64,
    /// LFU access count (delivered hits); never reset by refresh.
    pub(crate) access: AtomicU64,
}

impl Holder {
    pub(crate) fn access(&self) -> u64 {
        self.access.load(Ordering::Relaxed)
    }
}

/// Bytes of a key stored inline in the map slot (partition id + hashes up to
/// 18 bytes); longer keys go to the heap.
const INLINE_KEY: usize = 22;

/// A stored entry key: `partition id (4 bytes LE) ‖ hash`. Inline for the
/// usual 8-byte hashes, so a map probe touches no extra cache line.
#[derive(Clone)]
pub(crate) enum EntryKey {
    Inline { len: u8, buf: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl EntryKey {
    pub(crate) fn from_slice(s: &[u8]) -> Self {
        if s.len() <= INLINE_KEY {
            let mut buf = [0u8; INLINE_KEY];
            buf[..s.len()].copy_from_slice(s);
            EntryKey::Inline {
                len: s.len() as u8,
                buf,
            }
        } else {
            EntryKey::Heap(Box::from(s))
        }
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            EntryKey::Inline { len, buf } => &buf[..usize::from(*len)],
            EntryKey::Heap(b) => b,
        }
    }
}

impl std::fmt::Debug for EntryKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "EntryKey({:02x?})", self.as_slice())
    }
}

impl PartialEq for EntryKey {
    fn eq(&self, o: &Self) -> bool {
        self.as_slice() == o.as_slice()
    }
}

impl Eq for EntryKey {}

impl std::hash::Hash for EntryKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // Must match `<[u8] as Hash>` for `Borrow<[u8]>` lookups.
        self.as_slice().hash(state);
    }
}

impl std::borrow::Borrow<[u8]> for EntryKey {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

/// The holders of one key, sorted by replica id. A single holder (the common
/// case) lives inline in the map slot: no allocation, no pointer chase.
#[derive(Debug)]
pub(crate) enum Holders {
    One(Holder),
    Many(Vec<Holder>),
}

impl Holders {
    pub(crate) fn one(h: Holder) -> Self {
        Holders::One(h)
    }

    /// Insert at `i` (keeping the replica order).
    pub(crate) fn insert(&mut self, i: usize, h: Holder) {
        match self {
            Holders::Many(v) => v.insert(i.min(v.len()), h),
            Holders::One(_) => {
                let old = std::mem::replace(self, Holders::Many(Vec::with_capacity(2)));
                if let (Holders::One(first), Holders::Many(v)) = (old, &mut *self) {
                    v.push(first);
                    v.insert(i.min(1), h);
                }
            }
        }
    }

    /// Remove the holder at `i`. Removing the last one leaves an empty list.
    pub(crate) fn remove(&mut self, i: usize) -> Option<Holder> {
        match self {
            Holders::Many(v) => {
                if i >= v.len() {
                    return None;
                }
                let h = v.remove(i);
                if v.len() == 1 {
                    if let Some(last) = v.pop() {
                        *self = Holders::One(last);
                    }
                }
                Some(h)
            }
            Holders::One(_) => {
                if i != 0 {
                    return None;
                }
                match std::mem::replace(self, Holders::Many(Vec::new())) {
                    Holders::One(h) => Some(h),
                    Holders::Many(_) => None,
                }
            }
        }
    }
}

impl std::ops::Deref for Holders {
    type Target = [Holder];
    #[inline]
    fn deref(&self) -> &[Holder] {
        match self {
            Holders::One(h) => std::slice::from_ref(h),
            Holders::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Holders {
    #[inline]
    fn deref_mut(&mut self) -> &mut [Holder] {
        match self {
            Holders::One(h) => std::slice::from_mut(h),
            Holders::Many(v) => v,
        }
    }
}

/// Map of one shard.
pub(crate) type ShardMap = HashMap<EntryKey, Holders, FoldBuild>;

/// Number of shards (power of two).
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
    pub(crate) fn index_of(key: &[u8]) -> usize {
        (shard_hash(key) >> 58) as usize & (SHARDS - 1)
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

/// A key built on the stack (heap only for hashes longer than 60 bytes).
pub(crate) struct KeyBuf {
    inline: [u8; 64],
    len: usize,
    heap: Option<Vec<u8>>,
}

impl KeyBuf {
    #[inline]
    pub(crate) fn new(part: u32, hash: &[u8]) -> Self {
        let total = 4 + hash.len();
        let mut k = KeyBuf {
            inline: [0u8; 64],
            len: total,
            heap: None,
        };
        if total <= 64 {
            k.inline[..4].copy_from_slice(&part.to_le_bytes());
            k.inline[4..total].copy_from_slice(hash);
        } else {
            let mut v = Vec::with_capacity(total);
            v.extend_from_slice(&part.to_le_bytes());
            v.extend_from_slice(hash);
            k.heap = Some(v);
        }
        k
    }

    #[inline]
    pub(crate) fn as_slice(&self) -> &[u8] {
        match &self.heap {
            Some(v) => v,
            None => &self.inline[..self.len],
        }
    }

    pub(crate) fn to_entry_key(&self) -> EntryKey {
        EntryKey::from_slice(self.as_slice())
    }
}

/// Partition id and hash of a stored key.
#[inline]
pub(crate) fn split_key(key: &EntryKey) -> (u32, &[u8]) {
    let key = key.as_slice();
    match key {
        [a, b, c, d, rest @ ..] => (u32::from_le_bytes([*a, *b, *c, *d]), rest),
        _ => (u32::MAX, &[]),
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

    fn h(replica: u32) -> Holder {
        Holder {
            replica,
            tokens: 0,
            tier: Tier::T1,
            last_seen: 0,
            access: AtomicU64::new(0),
        }
    }

    fn ids(hs: &Holders) -> Vec<u32> {
        hs.iter().map(|x| x.replica).collect()
    }

    #[test]
    fn holders_spill_and_collapse_keep_order() {
        let mut hs = Holders::one(h(5));
        hs.insert(0, h(2));
        assert_eq!(ids(&hs), vec![2, 5]);
        hs.insert(2, h(9));
        hs.insert(1, h(3));
        assert_eq!(ids(&hs), vec![2, 3, 5, 9]);
        assert_eq!(hs.remove(0).map(|x| x.replica), Some(2));
        assert_eq!(hs.remove(1).map(|x| x.replica), Some(5));
        assert_eq!(hs.remove(0).map(|x| x.replica), Some(3));
        assert!(matches!(hs, Holders::One(_)));
        assert_eq!(ids(&hs), vec![9]);
        assert!(hs.remove(1).is_none());
        assert_eq!(hs.remove(0).map(|x| x.replica), Some(9));
        assert!(hs.is_empty());
        let mut one = Holders::one(h(1));
        one.insert(1, h(4));
        assert_eq!(ids(&one), vec![1, 4]);
    }

    #[test]
    fn entry_keys_inline_and_heap_hash_like_slices() {
        use std::hash::BuildHasher;
        for len in [0usize, 4, 12, 22, 23, 64] {
            let bytes: Vec<u8> = (0..len as u8).collect();
            let k = EntryKey::from_slice(&bytes);
            assert_eq!(k.as_slice(), &bytes[..]);
            assert_eq!(FoldBuild.hash_one(&k), FoldBuild.hash_one(&bytes[..]));
        }
    }
}

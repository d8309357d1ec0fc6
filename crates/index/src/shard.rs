//! Sharded entry storage.
//!
//! An entry key is `partition id (4 bytes LE) ‖ prefix hash bytes`, stored as a
//! boxed byte slice so lookups borrow a stack-built `[u8]` without allocating.
//! Each key maps to its holders: a `Vec<Holder>` sorted by interned replica id
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

/// Map of one shard.
pub(crate) type ShardMap = HashMap<EntryKey, Vec<Holder>, FoldBuild>;

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

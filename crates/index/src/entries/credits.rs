//! LFU counts of the arena's holdings: a side table keyed by (partition,
//! block hash, replica), which only credited holdings use (an LRU tenant's
//! never touch it; issue 14's "LFU count in a side table").
//!
//! A count is removed with its holding, under the run lock that removes the
//! holding (the arena's `take`, `take_block` and `retain` callbacks), and a
//! credit is added under the run read lock that found the holding, so a
//! count never outlives its holding nor carries over to a later one.

use crate::hashing::FoldBuild;
use crate::key::key_hash;
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Independent locks (by key hash): credits of concurrent lookups rarely meet.
const SHARDS: usize = 64;

type Map = HashMap<(u32, u64, u32), u32, FoldBuild>;

#[repr(align(128))]
#[derive(Default)]
struct Padded(Mutex<Map>);

/// The side table.
pub(crate) struct Credits {
    shards: Box<[Padded]>,
    /// Counts held: zero lets every read and removal skip the locks.
    len: AtomicUsize,
}

impl Default for Credits {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Padded::default()).collect(),
            len: AtomicUsize::new(0),
        }
    }
}

impl Credits {
    fn shard(&self, part: u32, hash: u64) -> &Mutex<Map> {
        let i = (key_hash(part, &hash.to_le_bytes()) as usize) % SHARDS;
        &self.shards[i].0
    }

    /// The count of (`part`, `hash`, `replica`); 0 when it has none.
    pub(crate) fn get(&self, part: u32, hash: u64, replica: u32) -> u64 {
        if self.len.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        lock(self.shard(part, hash))
            .get(&(part, hash, replica))
            .map_or(0, |&n| u64::from(n))
    }

    /// +1 (saturating at `u32::MAX`).
    pub(crate) fn bump(&self, part: u32, hash: u64, replica: u32) {
        let mut m = lock(self.shard(part, hash));
        let n = m.entry((part, hash, replica)).or_insert_with(|| {
            self.len.fetch_add(1, Ordering::Relaxed);
            0
        });
        *n = n.saturating_add(1);
    }

    /// Overwrites the count (a snapshot restore); 0 removes it.
    pub(crate) fn set(&self, part: u32, hash: u64, replica: u32, n: u64) {
        if n == 0 {
            self.clear(part, hash, replica);
            return;
        }
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        let mut m = lock(self.shard(part, hash));
        if m.insert((part, hash, replica), n).is_none() {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drops the count of a holding that went.
    pub(crate) fn clear(&self, part: u32, hash: u64, replica: u32) {
        if self.len.load(Ordering::Relaxed) == 0 {
            return;
        }
        if lock(self.shard(part, hash))
            .remove(&(part, hash, replica))
            .is_some()
        {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

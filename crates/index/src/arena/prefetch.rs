//! Loading a run of blocks' table lines before a writer needs them.
//!
//! A store of new blocks and a burst of removals probe one block table per
//! block, each probe a lock line and a bucket line (the bucket is the
//! block's entry, `block_table.rs`) that are almost never in cache (a
//! profile of the index's stores at scale 16 put 46 % of `store_with` on
//! the bucket load and 15 % on the lock word, BENCHMARKS.md). One by one, each miss waits for the one before: a lock
//! is an atomic read-modify-write, which on x86 waits for every earlier
//! load. So the
//! locks of every block shard a window touches are taken first, once each,
//! in ascending order; then every block's home bucket is loaded: those
//! misses overlap, and the writer's own probes find the lines in cache.
//!
//! Lock order: a caller may hold a run shard (level 1), as a store does
//! between two windows; the block shard read locks taken here are level 2
//! and taken in ascending shard order, and nobody waits for a level-1 lock
//! while holding a level-2 one, so no cycle can form.

use super::{Blocks, ChainArena, SHARDS, hash_of, shard_of, tag_of};
use crate::sync::{read_spinning as read, try_read_now};
use arrayvec::ArrayVec;
use std::sync::RwLockReadGuard;

/// Most blocks one prefetch covers (the caller windows longer runs).
pub(crate) const WINDOW: usize = 32;

impl ChainArena {
    /// Load the block-table lines of (`part`, `hash`) for the first
    /// [`WINDOW`] of `hashes`. Nothing changes; the lines are only read.
    pub(crate) fn prefetch(&self, part: u32, hashes: &[u64]) {
        let mut keys = [(0u32, 0u64); WINDOW];
        let n = hashes.len().min(WINDOW);
        for (k, &h) in keys.iter_mut().zip(hashes) {
            *k = (part, hash_of(part, h));
        }
        self.prefetch_keys(&keys[..n]);
    }

    /// [`ChainArena::prefetch`] for blocks of any partitions, given as
    /// (partition, key hash): at most [`WINDOW`] are read.
    pub(crate) fn prefetch_keys(&self, keys: &[(u32, u64)]) {
        let keys = &keys[..keys.len().min(WINDOW)];
        let mut mask = [0u64; SHARDS / 64];
        for &(_, kh) in keys {
            let s = shard_of(kh);
            mask[s / 64] |= 1 << (s % 64);
        }
        // Position in `guards` of each shard's guard.
        let mut slot_of = [0u8; SHARDS];
        let mut guards: ArrayVec<RwLockReadGuard<'_, Blocks>, WINDOW> = ArrayVec::new();
        for (w, bits) in mask.iter().enumerate() {
            let mut bits = *bits;
            while bits != 0 {
                let s = w * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                slot_of[s] = guards.len() as u8;
                guards.push(read(&self.shard(s).blocks.0));
            }
        }
        let blocks = |kh: u64| guards.get(usize::from(slot_of[shard_of(kh)]));
        let mut touched = 0u64;
        for &(part, kh) in keys {
            if let Some(t) = blocks(kh).and_then(|b| b.table(part)) {
                touched ^= u64::from(t.touch(tag_of(kh)));
            }
        }
        std::hint::black_box(touched);
    }

    /// Loads block (`part`, `hash`)'s home bucket if its block shard is
    /// free to read right now (never waits: the caller may hold a run
    /// shard's read lock).
    #[inline]
    pub(crate) fn touch(&self, part: u32, hash: u64) {
        let kh = hash_of(part, hash);
        if let Some(b) = try_read_now(&self.shard(shard_of(kh)).blocks.0) {
            std::hint::black_box(b.table(part).map_or(0, |t| t.touch(tag_of(kh))));
        }
    }
}

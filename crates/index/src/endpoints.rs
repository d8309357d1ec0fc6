//! Blocks a replica holds where a match may not END: hybrid models.
//!
//! A model with sliding-window layers (Gemma-3, Mistral's SWA variants,
//! ...) keeps, in those layers, only the blocks inside the window. vLLM
//! reuses a prefix only up to a point where every sliding-window layer
//! still holds the blocks its window needs just before it; past a long
//! prefill that is the last two or three blocks, so the full-attention
//! chain the index holds claims far more than the engine reuses. The
//! producer (our sidecar) knows which blocks are valid ends and says so per
//! entry (`PrefixEntry::no_match_end`); this side table keeps the blocks
//! that are held but not a valid end, per (partition, block hash, replica),
//! and a chain walk backs each replica's run off to its deepest valid end
//! ([`Endpoints::back_off`]).
//!
//! Cost: nothing for a scope whose producers never set the flag (every
//! full-attention model, every reference producer): the table stays empty
//! and each reader and removal skips it on one relaxed load. A mark is
//! dropped with its holding (the entry stores' removal paths, next to the
//! LFU side table's counts), and every report of the holding sets or clears
//! it, so a mark never outlives its holding nor carries over to a later one.
//!
//! Only 8-byte keys (the arena's, every engine's) carry marks; a producer
//! sending other lengths gets today's behaviour.

use crate::arena::RunMatch;
use crate::hashing::FoldBuild;
use crate::key::key_hash;
use crate::sync::{read, write};
use std::collections::HashSet;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Independent locks (by key hash).
const SHARDS: usize = 16;

type Set = HashSet<(u32, u64, u32), FoldBuild>;

#[repr(align(128))]
#[derive(Default)]
struct Padded(RwLock<Set>);

/// The side table of (partition, block hash, replica) holdings that are not
/// a valid match end.
pub(crate) struct Endpoints {
    shards: Box<[Padded]>,
    /// Marks held: zero lets every reader and removal skip the locks.
    len: AtomicUsize,
    /// Bit `part % 64` set once a partition got a mark (never cleared): a
    /// walk in a partition whose bit is clear (every full-attention scope,
    /// unless its id shares the bit with a hybrid one) skips the table.
    parts: AtomicU64,
}

impl Default for Endpoints {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Padded::default()).collect(),
            len: AtomicUsize::new(0),
            parts: AtomicU64::new(0),
        }
    }
}

impl Endpoints {
    fn shard(&self, part: u32, hash: u64) -> &RwLock<Set> {
        let i = (key_hash(part, &hash.to_le_bytes()) as usize) % SHARDS;
        &self.shards[i].0
    }

    /// No marks at all (no hybrid producer reports here).
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// Marks held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Records what a report said of `replica`'s holding of (`part`,
    /// `hash`): `no_end` marks it, `false` clears any mark.
    pub(crate) fn set(&self, part: u32, hash: u64, replica: u32, no_end: bool) {
        if no_end {
            self.parts.fetch_or(part_bit(part), Ordering::Relaxed);
            if write(self.shard(part, hash)).insert((part, hash, replica)) {
                self.len.fetch_add(1, Ordering::Relaxed);
            }
        } else {
            self.clear(part, hash, replica);
        }
    }

    /// Drops the mark of a holding that went (or became a valid end).
    pub(crate) fn clear(&self, part: u32, hash: u64, replica: u32) {
        if self.is_empty() {
            return;
        }
        if write(self.shard(part, hash)).remove(&(part, hash, replica)) {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Whether `replica`'s holding of (`part`, `hash`) is marked.
    pub(crate) fn marked(&self, part: u32, hash: u64, replica: u32) -> bool {
        !self.is_empty() && read(self.shard(part, hash)).contains(&(part, hash, replica))
    }

    /// Backs every run of `runs` (a walk's answer over a request whose
    /// block `i` has arena hash `key(i)`, `None` for a key of another
    /// length, and `counts[i]` tokens) off to its deepest block that is a
    /// valid end; a run with none left is dropped. Its `oldest` and `tier`
    /// stay those of the longer run (conservative).
    pub(crate) fn back_off(
        &self,
        part: u32,
        key: impl Fn(usize) -> Option<u64>,
        counts: &[i32],
        runs: &mut Vec<RunMatch>,
    ) {
        if self.is_empty() || self.parts.load(Ordering::Relaxed) & part_bit(part) == 0 {
            return;
        }
        for r in runs.iter_mut() {
            let mut end = r.blocks as usize;
            while end > 0 && key(end - 1).is_some_and(|h| self.marked(part, h, r.replica)) {
                end -= 1;
            }
            if end < r.blocks as usize {
                let cut = counts
                    .get(end..r.blocks as usize)
                    .unwrap_or_default()
                    .iter()
                    .fold(0i32, |a, &c| a.wrapping_add(c));
                r.matched = r.matched.wrapping_sub(cut);
                r.blocks = end as u32;
            }
        }
        runs.retain(|r| r.blocks > 0);
    }
}

fn part_bit(part: u32) -> u64 {
    1 << (part % 64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Tier;
    use proptest::prelude::*;

    fn run(replica: u32, blocks: u32, per_block: i32) -> RunMatch {
        RunMatch {
            replica,
            blocks,
            matched: blocks as i32 * per_block,
            oldest: 7,
            tier: Tier::T1,
        }
    }

    #[test]
    fn empty_table_changes_nothing() {
        let e = Endpoints::default();
        let mut runs = vec![run(1, 4, 32)];
        e.back_off(0, |i| Some(i as u64), &[32; 4], &mut runs);
        assert_eq!(runs, vec![run(1, 4, 32)]);
        assert!(e.is_empty());
    }

    #[test]
    fn a_run_backs_off_to_its_deepest_valid_end_per_replica() {
        let e = Endpoints::default();
        // Replica 1: blocks 2 and 3 are not ends; replica 2: only block 3.
        e.set(9, 2, 1, true);
        e.set(9, 3, 1, true);
        e.set(9, 3, 2, true);
        // Another partition's mark is not ours.
        e.set(8, 1, 1, true);
        let mut runs = vec![run(1, 4, 32), run(2, 4, 32), run(3, 4, 32)];
        e.back_off(9, |i| Some(i as u64), &[32; 4], &mut runs);
        assert_eq!(runs, vec![run(1, 2, 32), run(2, 3, 32), run(3, 4, 32)]);
        // A run shorter than the marks is untouched.
        let mut short = vec![run(1, 2, 32)];
        e.back_off(9, |i| Some(i as u64), &[32; 4], &mut short);
        assert_eq!(short, vec![run(1, 2, 32)]);
    }

    #[test]
    fn a_run_without_a_valid_end_is_dropped_and_clearing_restores_it() {
        let e = Endpoints::default();
        e.set(0, 0, 1, true);
        e.set(0, 1, 1, true);
        let mut runs = vec![run(1, 2, 16)];
        e.back_off(0, |i| Some(i as u64), &[16; 2], &mut runs);
        assert!(runs.is_empty());
        e.set(0, 1, 1, false);
        assert_eq!(e.len(), 1);
        let mut runs = vec![run(1, 2, 16)];
        e.back_off(0, |i| Some(i as u64), &[16; 2], &mut runs);
        assert_eq!(runs, vec![run(1, 2, 16)]);
        e.clear(0, 0, 1);
        e.clear(0, 0, 1);
        assert!(e.is_empty());
    }

    #[test]
    fn keys_of_another_length_are_valid_ends() {
        let e = Endpoints::default();
        e.set(0, 1, 1, true);
        let mut runs = vec![run(1, 2, 16)];
        e.back_off(0, |_| None, &[16; 2], &mut runs);
        assert_eq!(runs, vec![run(1, 2, 16)]);
    }

    proptest! {
        /// The back-off equals the model: the deepest `end <= blocks` whose
        /// block `end - 1` is unmarked, matched = the counts summed to it
        /// (a run holds at least one block: the walk makes no empty ones).
        #[test]
        fn back_off_matches_the_model(
            marks in proptest::collection::vec(any::<bool>(), 1..24),
            blocks in 1usize..24,
            counts in proptest::collection::vec(1i32..64, 24),
        ) {
            let e = Endpoints::default();
            for (i, &m) in marks.iter().enumerate() {
                e.set(3, i as u64, 5, m);
            }
            let blocks = blocks.min(marks.len());
            let matched: i32 = counts[..blocks].iter().sum();
            let mut runs = vec![RunMatch { replica: 5, blocks: blocks as u32, matched, oldest: 0, tier: Tier::T1 }];
            e.back_off(3, |i| Some(i as u64), &counts, &mut runs);
            let want = (0..=blocks).rev().find(|&end| end == 0 || !marks[end - 1]).unwrap_or(0);
            if want == 0 {
                prop_assert!(runs.is_empty());
            } else {
                prop_assert_eq!(runs[0].blocks as usize, want);
                prop_assert_eq!(runs[0].matched, counts[..want].iter().sum::<i32>());
            }
        }
    }
}

//! One partition's blocks in one shard: open addressing with linear probing
//! over 12-byte buckets that are the entries themselves (tag, run, offset).
//!
//! Why not 4-byte buckets pointing into a dense entry array (the layout
//! of the slot table this store replaced, docs/decisions.md): a probe there reads a bucket
//! line and then an entry line, two misses per block a lookup or a writer
//! probes (one of the five a lookup paid per run, BENCHMARKS.md "The index
//! around the walk"). Here a probe reads the bucket line and has the place.
//! The memory is about the same: 12 bytes a bucket at a load between 2/5 and
//! 4/5, against 4 bytes a bucket plus a 12-byte entry grown by a quarter.
//!
//! A new block's bucket is the one the probe before it just read, so an
//! insert writes a line already in cache (the block lock's release then
//! waits for no miss). Removal leaves a tombstone unless the next bucket is
//! empty; tombstones count towards the load and a rebuild at the same size
//! clears them. The table hashes an entry by its 32-bit tag alone, so it
//! grows without reading runs (which live under other locks).

use super::{Candidates, RunPos, table_hash};

/// Most blocks one shard's table of one partition holds (the limit the
/// slot table had per shard: 2^25 - 2 positions).
const MAX_SLOTS: usize = (1 << 25) - 2;
/// Smallest non-empty table.
const MIN_BUCKETS: usize = 16;

/// Buckets for `n` blocks at a load of at most 4/5 (a power of two).
fn buckets_for(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    (n.saturating_mul(5) / 4 + 1)
        .next_power_of_two()
        .max(MIN_BUCKETS)
}

/// `off` of a bucket never used since the last rebuild: a probe stops here.
const EMPTY: u32 = u32::MAX;
/// `off` of a bucket whose block was removed: a probe goes on past it.
/// (No run reaches 4 billion blocks: its hashes alone would be 32 GiB.)
const TOMB: u32 = u32::MAX - 1;

/// One distinct block of a partition: the low 32 bits of its key hash and
/// its place, 12 bytes. Two blocks of one shard and partition share 32 key
/// hash bits about once in 4 billion probes per stored block: the
/// confirmation in the run (`Run::is`, which holds the full hash) then
/// picks the right one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Entry {
    pub(super) tag: u32,
    pub(super) run: u32,
    pub(super) off: u32,
}

const FREE: Entry = Entry {
    tag: 0,
    run: 0,
    off: EMPTY,
};

impl Entry {
    pub(super) fn pos(&self) -> RunPos {
        RunPos {
            run: self.run,
            off: self.off,
        }
    }

    #[inline]
    fn live(&self) -> bool {
        self.off < TOMB
    }
}

/// `repr(C)` with the buckets first: the shard's first table sits on its
/// lock's line (`Blocks`), and a probe needs only the buckets' address.
#[repr(C)]
#[derive(Default)]
pub(super) struct BlockTable {
    buckets: Box<[Entry]>,
    live: usize,
    tombs: usize,
}

impl BlockTable {
    #[inline]
    fn home(&self, tag: u32) -> usize {
        (table_hash(tag) as usize) & self.buckets.len().wrapping_sub(1)
    }

    /// Number of blocks.
    pub(super) fn len(&self) -> usize {
        self.live
    }

    /// Whether another block may be inserted ([`MAX_SLOTS`]).
    pub(super) fn has_room(&self) -> bool {
        self.live < MAX_SLOTS
    }

    /// The run id in the bucket a probe for `tag` reads first, for a
    /// writer to load the line ahead of its probe (0 when empty).
    #[inline]
    pub(super) fn touch(&self, tag: u32) -> u32 {
        self.buckets.get(self.home(tag)).map_or(0, |e| e.run)
    }

    /// The first `Some` of `f` over the live buckets whose tag is `tag`
    /// (given their index), in probe order, up to the first empty bucket.
    #[inline]
    fn probe<R>(&self, tag: u32, mut f: impl FnMut(usize, &Entry) -> Option<R>) -> Option<R> {
        let mask = self.buckets.len().wrapping_sub(1);
        let mut i = self.home(tag);
        // At most every bucket once: the load limit keeps an empty bucket
        // in every table, the bound only guards against a broken invariant.
        for _ in 0..self.buckets.len() {
            let e = self.buckets.get(i)?;
            if e.off == EMPTY {
                return None;
            }
            if e.live() && e.tag == tag {
                if let Some(r) = f(i, e) {
                    return Some(r);
                }
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// The first `Some` of `f` over the places whose tag is `tag`, in
    /// probe order.
    #[inline]
    pub(super) fn find_map<R>(
        &self,
        tag: u32,
        mut f: impl FnMut(RunPos) -> Option<R>,
    ) -> Option<R> {
        self.probe(tag, |_, e| f(e.pos()))
    }

    /// Every place whose tag is `tag`, in probe order (unconfirmed).
    #[inline]
    pub(super) fn candidates(&self, tag: u32, out: &mut Candidates) {
        self.find_map(tag, |p| {
            out.push(p);
            None::<()>
        });
    }

    /// Inserts a block the caller has just seen absent (under this
    /// table's lock).
    pub(super) fn insert(&mut self, e: Entry) {
        let n = self.buckets.len();
        if (self.live + self.tombs + 1) * 5 > n * 4 {
            // Tombstones alone over the limit: rebuild in place; else grow.
            let size = if (self.live + 1) * 5 <= n * 2 {
                n
            } else {
                buckets_for(self.live + 1).max(n * 2)
            };
            self.rebuild(size);
        }
        self.place(e);
    }

    /// Puts `e` in the first free bucket of its probe (room checked).
    fn place(&mut self, e: Entry) {
        let mask = self.buckets.len().wrapping_sub(1);
        let mut i = self.home(e.tag);
        for _ in 0..self.buckets.len() {
            let Some(b) = self.buckets.get_mut(i) else {
                return;
            };
            if !b.live() {
                if b.off == TOMB {
                    self.tombs -= 1;
                }
                *b = e;
                self.live += 1;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    fn rebuild(&mut self, size: usize) {
        let old = std::mem::replace(&mut self.buckets, vec![FREE; size].into_boxed_slice());
        self.live = 0;
        self.tombs = 0;
        for e in old.iter().filter(|e| e.live()) {
            self.place(*e);
        }
    }

    /// The bucket holding `tag` at `pos`.
    fn find(&self, tag: u32, pos: RunPos) -> Option<usize> {
        self.probe(tag, |i, e| (e.pos() == pos).then_some(i))
    }

    /// Removes the block's entry if it still points at `pos`.
    pub(super) fn remove(&mut self, tag: u32, pos: RunPos) {
        let Some(i) = self.find(tag, pos) else {
            return;
        };
        let mask = self.buckets.len().wrapping_sub(1);
        self.live -= 1;
        if self.live == 0 {
            // The last block: the memory goes with it.
            *self = Self::default();
            return;
        }
        // Followed by an empty bucket, the hole (and the tombstones just
        // before it) ends every probe that reached it anyway: make them
        // empty.
        if self
            .buckets
            .get((i + 1) & mask)
            .is_some_and(|b| b.off == EMPTY)
        {
            self.buckets[i] = FREE;
            let mut j = i.wrapping_sub(1) & mask;
            while self.buckets.get(j).is_some_and(|b| b.off == TOMB) {
                self.buckets[j] = FREE;
                self.tombs -= 1;
                j = j.wrapping_sub(1) & mask;
            }
        } else {
            self.buckets[i].off = TOMB;
            self.tombs += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn candidates(t: &BlockTable, tag: u32) -> BTreeSet<(u32, u32)> {
        let mut out = Candidates::default();
        t.candidates(tag, &mut out);
        out.into_iter().map(|p| (p.run, p.off)).collect()
    }

    proptest! {
        /// The table against a set of entries: every tag's candidates are
        /// exactly the entries with that tag, through inserts, removals
        /// (tombstones, empties), rebuilds and emptying; tags collide often.
        #[test]
        fn block_table_matches_a_set(
            ops in proptest::collection::vec((any::<bool>(), 0u32..6, 0u32..40, 0u32..3), 1..500)
        ) {
            let mut t = BlockTable::default();
            let mut model: BTreeSet<(u32, u32, u32)> = BTreeSet::new();
            for (ins, tag, run, off) in ops {
                let e = Entry { tag, run, off };
                if ins {
                    if !model.iter().any(|&(_, r, o)| (r, o) == (run, off)) {
                        t.insert(e);
                        model.insert((tag, run, off));
                    }
                } else {
                    t.remove(tag, e.pos());
                    model.remove(&(tag, run, off));
                }
                prop_assert_eq!(t.len(), model.len());
                for tag in 0..6 {
                    let want: BTreeSet<(u32, u32)> = model
                        .iter()
                        .filter(|m| m.0 == tag)
                        .map(|&(_, r, o)| (r, o))
                        .collect();
                    prop_assert_eq!(candidates(&t, tag), want);
                }
                prop_assert!(t.buckets.is_empty() || (t.live + t.tombs) * 5 <= t.buckets.len() * 4);
            }
        }
    }
}

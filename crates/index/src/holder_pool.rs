//! Holder arrays of keys with two or more holders, pooled per shard.
//!
//! A slot has room for one 16-byte holder. When a second replica holds the
//! key, its holders move into a block of this shard's pool and the slot's
//! holder becomes a *pool mark*: a holder whose replica id is [`POOL_MARK`]
//! (an id the catalog never hands out), whose `last_seen` is the block's
//! reference and whose `tokens` is the number of holders (0 for a key whose
//! last holder just went). A key back at one holder moves it inline again
//! and frees its block.
//!
//! Why a pool and not a `Vec` per key (issue 14, "holder arrays pooled per
//! shard, no per-key allocation header"): a `Vec` needs 24 bytes in every
//! slot (the one-holder slot paid for the pointer it did not use) and every
//! spilled key paid the allocator's header and the `Vec`'s doubling. Here a
//! slot is 32 bytes and a block carries no header.
//!
//! Blocks come in size classes of 2, 3, 4, 6, 8, 12, ... holders (each at
//! most 1.5x the last); a class is one `Vec<Holder>` of equal blocks, kept
//! dense: a freed block is filled with the class's last block, whose slot
//! (each block records its slot's position in `owners`) gets its mark
//! repointed, so a pool never holds free blocks (a free list did: keys that
//! all grew 1 -> 2 -> 3 -> 4 holders left the blocks of classes 2 and 3
//! unused, 61 B per extra holder in the memory benchmark). A key that grows
//! past its block moves to the next class; one that shrinks to a class two
//! below moves down (hysteresis, so a key that gains and loses one holder
//! does not move every time).
//!
//! A sweep edits holders while it compacts the slot array, so it cannot
//! repoint other slots: there, removals stay inside their blocks
//! ([`HolderPool::remove_in_place`]) and the sweep rebuilds the pool from
//! the surviving slots at its end ([`HolderPool::compact`]).

use crate::holder::{Holder, Holders, POOL_MARK};
use crate::types::Tier;

/// Holders a block of class `c` has room for: 2, 3, 4, 6, 8, 12, ...
#[inline]
fn class_cap(c: usize) -> usize {
    let k = c / 2;
    if c % 2 == 0 { 2 << k } else { 3 << k }
}

/// The smallest class whose blocks hold `n` (at least 2) holders.
#[inline]
fn class_for(n: usize) -> usize {
    let n = n.max(2);
    // p = floor(log2(n - 1)): 2^(p+1) >= n always; 3 * 2^(p-1) may be enough.
    let p = (usize::BITS - 1 - (n - 1).leading_zeros()) as usize;
    if p >= 1 && 3 << (p - 1) >= n {
        2 * p - 1
    } else {
        2 * p
    }
}

/// A block reference as a pool mark's `last_seen`: class (top 16 bits) and
/// block number.
#[inline]
fn pack(class: usize, block: usize) -> i64 {
    ((class as u64) << 48 | block as u64) as i64
}

#[inline]
fn unpack(r: i64) -> (usize, usize) {
    let r = r as u64;
    ((r >> 48) as usize, (r & ((1 << 48) - 1)) as usize)
}

/// A pool mark for `len` holders in `block` of `class` (len 0: no block).
fn mark(class: usize, block: usize, len: usize) -> Holder {
    Holder::new(
        POOL_MARK,
        i32::try_from(len).unwrap_or(i32::MAX),
        Tier::UNSPECIFIED,
        pack(class, block),
    )
}

/// What a slot's holder stands for.
enum Set {
    /// No holder (a key about to be removed).
    Empty,
    /// The holder itself.
    One,
    /// `len` (two or more) holders in `block` of `class`.
    Pooled {
        class: usize,
        block: usize,
        len: usize,
    },
}

#[inline]
fn set_of(first: &Holder) -> Set {
    if first.replica() != POOL_MARK {
        return Set::One;
    }
    match usize::try_from(first.tokens).unwrap_or(0) {
        0 => Set::Empty,
        len => {
            let (class, block) = unpack(first.last_seen);
            Set::Pooled { class, block, len }
        }
    }
}

/// A slot's holder for a key with no holders.
pub(crate) fn empty() -> Holder {
    mark(0, 0, 0)
}

/// The slots' holders, by slot position: what a block's move repoints.
pub(crate) trait Marks {
    /// The holder (or pool mark) of the slot at `pos`.
    fn mark(&mut self, pos: usize) -> Option<&mut Holder>;
}

impl Marks for [Holder] {
    fn mark(&mut self, pos: usize) -> Option<&mut Holder> {
        self.get_mut(pos)
    }
}

/// Holders per chunk of a class's blocks (1 KiB). Every class allocates
/// chunks of about this size, so memory that one class gives back is what
/// the next class asks for: with one array per class, keys that all grew
/// 1 -> 2 -> 3 -> 4 holders left the freed arrays of the smaller classes in
/// the allocator's heap, not reused (resident memory per extra holder 49 B
/// instead of 22 B, BENCHMARKS.md). Small, because each class of each shard
/// has one partly used chunk: 4 KiB chunks cost 50.5 B per holding at
/// `bench/peers` scale 1, 1 KiB chunks 46.2 B.
const CHUNK: usize = 64;

/// One class: equal blocks in fixed-size chunks, kept dense, and each
/// block's slot position.
struct Class {
    /// Holders per block.
    cap: usize,
    /// Blocks per chunk: `1 << shift`, the largest power of two that fits
    /// [`CHUNK`] (one for larger blocks), so a lookup finds a block with a
    /// shift, not a division.
    shift: u32,
    per_chunk: usize,
    chunks: Vec<Box<[Holder]>>,
    owners: Vec<u32>,
}

impl Class {
    fn new(class: usize) -> Self {
        let cap = class_cap(class);
        let shift = (CHUNK / cap).max(1).ilog2();
        Self {
            cap,
            shift,
            per_chunk: 1 << shift,
            chunks: Vec::new(),
            owners: Vec::new(),
        }
    }

    /// Where block `b` starts: (chunk, offset).
    #[inline]
    fn at(&self, b: usize) -> (usize, usize) {
        (b >> self.shift, (b & (self.per_chunk - 1)) * self.cap)
    }

    #[inline]
    fn block(&self, b: usize, len: usize) -> Option<&[Holder]> {
        let (c, o) = self.at(b);
        self.chunks.get(c)?.get(o..o + len.min(self.cap))
    }

    #[inline]
    fn block_mut(&mut self, b: usize, len: usize) -> Option<&mut [Holder]> {
        let (c, o) = self.at(b);
        let len = len.min(self.cap);
        self.chunks.get_mut(c)?.get_mut(o..o + len)
    }

    /// A new block at the end for the slot at `owner` (its holders are
    /// whatever a freed block left: callers write before they mark).
    fn push(&mut self, owner: usize) -> usize {
        let b = self.owners.len();
        if b / self.per_chunk >= self.chunks.len() {
            self.chunks
                .push((0..self.per_chunk * self.cap).map(|_| empty()).collect());
        }
        self.owners.push(owner as u32);
        b
    }

    /// Removes block `b`: the last block's holders move into it. Returns
    /// the moved block's slot position, if a block moved.
    fn remove(&mut self, b: usize) -> Option<u32> {
        let last = self.owners.len().checked_sub(1)?;
        if b > last {
            return None;
        }
        let mut moved = None;
        if b < last {
            let ((cb, ob), (cl, ol), cap) = (self.at(b), self.at(last), self.cap);
            let pair = if cb == cl {
                self.chunks.get_mut(cb).and_then(|c| {
                    let (lo, hi) = c.split_at_mut(ol);
                    Some((lo.get_mut(ob..ob + cap)?, hi.get_mut(..cap)?))
                })
            } else {
                let (lo, hi) = self.chunks.split_at_mut(cl);
                lo.get_mut(cb)
                    .and_then(|c| c.get_mut(ob..ob + cap))
                    .zip(hi.first_mut().and_then(|c| c.get_mut(ol..ol + cap)))
            };
            if let Some((dst, src)) = pair {
                dst.swap_with_slice(src);
            }
            let owner = self.owners.get(last).copied().unwrap_or(0);
            if let Some(o) = self.owners.get_mut(b) {
                *o = owner;
            }
            moved = Some(owner);
        }
        self.owners.truncate(last);
        // A chunk no block uses goes back to the allocator at once.
        self.chunks.truncate(last.div_ceil(self.per_chunk));
        if self.owners.capacity() > 2 * last + 64 {
            self.owners.shrink_to(last + last / 4);
        }
        moved
    }
}

/// What [`HolderPool::take`] left of a pooled key: its class, its block
/// and the number of holders still its (1: the holder is back inline and
/// the block is unused). `None` for a key that was not pooled.
type Left = Option<(usize, usize, usize)>;

/// The holder blocks of one shard.
#[derive(Default)]
pub(crate) struct HolderPool {
    classes: Vec<Class>,
    /// A sweep left blocks no slot uses ([`HolderPool::remove_in_place`],
    /// [`HolderPool::forget`]): the next [`HolderPool::compact`] is due.
    dirty: bool,
}

impl HolderPool {
    /// The holders of a slot whose holder is `first`, sorted by replica.
    #[inline]
    pub(crate) fn slice<'a>(&'a self, first: &'a Holder) -> &'a [Holder] {
        match set_of(first) {
            Set::One => std::slice::from_ref(first),
            Set::Empty => &[],
            Set::Pooled { class, block, len } => self
                .classes
                .get(class)
                .and_then(|c| c.block(block, len))
                .unwrap_or(&[]),
        }
    }

    /// [`HolderPool::slice`], mutable.
    #[inline]
    pub(crate) fn slice_mut<'a>(&'a mut self, first: &'a mut Holder) -> &'a mut [Holder] {
        match set_of(first) {
            Set::One => std::slice::from_mut(first),
            Set::Empty => &mut [],
            Set::Pooled { class, block, len } => self.run(class, block, len),
        }
    }

    /// The `len` holders of a block.
    fn run(&mut self, class: usize, block: usize, len: usize) -> &mut [Holder] {
        self.classes
            .get_mut(class)
            .and_then(|c| c.block_mut(block, len))
            .unwrap_or(&mut [])
    }

    /// A new block of `class` for the slot at `owner`.
    fn alloc(&mut self, class: usize, owner: usize) -> usize {
        while self.classes.len() <= class {
            let next = self.classes.len();
            self.classes.push(Class::new(next));
        }
        self.classes.get_mut(class).map_or(0, |c| c.push(owner))
    }

    /// Frees `block` of `class` (its holders already moved out): the
    /// class's last block moves into it and its slot's mark follows.
    fn free<M: Marks + ?Sized>(&mut self, marks: &mut M, class: usize, block: usize) {
        let Some(owner) = self.classes.get_mut(class).and_then(|c| c.remove(block)) else {
            return;
        };
        if let Some(m) = marks.mark(owner as usize) {
            if let Set::Pooled { len, .. } = set_of(m) {
                *m = mark(class, block, len);
            }
        }
    }

    /// Moves the slot at `pos`'s `len` holders from their block to a new
    /// block of `to_class`, repoints its mark and frees the old block.
    fn relocate<M: Marks + ?Sized>(
        &mut self,
        marks: &mut M,
        pos: usize,
        from: (usize, usize),
        to_class: usize,
        len: usize,
    ) -> usize {
        let to = self.alloc(to_class, pos);
        let (fc, fb) = from;
        let (src, dst) = if fc < to_class {
            let (lo, hi) = self.classes.split_at_mut(to_class);
            (lo.get_mut(fc), hi.first_mut())
        } else {
            let (lo, hi) = self.classes.split_at_mut(fc);
            (hi.first_mut(), lo.get_mut(to_class))
        };
        if let (Some(src), Some(dst)) = (
            src.and_then(|c| c.block_mut(fb, len)),
            dst.and_then(|c| c.block_mut(to, len)),
        ) {
            src.swap_with_slice(dst);
        }
        if let Some(m) = marks.mark(pos) {
            *m = mark(to_class, to, len);
        }
        self.free(marks, fc, fb);
        to
    }

    /// Insert `h` at position `i` of the holders of the slot at `pos` (the
    /// caller keeps the replica order).
    pub(crate) fn insert<M: Marks + ?Sized>(
        &mut self,
        marks: &mut M,
        pos: usize,
        i: usize,
        h: Holder,
    ) {
        let Some(first) = marks.mark(pos) else {
            return;
        };
        match set_of(first) {
            Set::Empty => *first = h,
            Set::One => {
                let old = std::mem::replace(first, empty());
                let block = self.alloc(0, pos);
                let (a, b) = if i == 0 { (h, old) } else { (old, h) };
                if let [x, y] = self.run(0, block, 2) {
                    *x = a;
                    *y = b;
                }
                if let Some(m) = marks.mark(pos) {
                    *m = mark(0, block, 2);
                }
            }
            Set::Pooled { class, block, len } => {
                let (class, block) = if len < class_cap(class) {
                    (class, block)
                } else {
                    let to = class_for(len + 1);
                    (to, self.relocate(marks, pos, (class, block), to, len))
                };
                let run = self.run(class, block, len + 1);
                if let Some(last) = run.last_mut() {
                    *last = h;
                    run[i.min(len)..].rotate_right(1);
                }
                if let Some(m) = marks.mark(pos) {
                    *m = mark(class, block, len + 1);
                }
            }
        }
    }

    /// Remove the holder at `i` of the slot at `pos`; a key left with one
    /// holder has it inline again (its block freed), one left with none is
    /// [`empty`], one that shrank to a class two below moves down.
    pub(crate) fn remove<M: Marks + ?Sized>(
        &mut self,
        marks: &mut M,
        pos: usize,
        i: usize,
    ) -> Option<Holder> {
        let (out, left) = self.take(marks.mark(pos)?, i)?;
        match left {
            Some((class, block, 1)) => self.free(marks, class, block),
            Some((class, block, len)) if class >= 2 && len <= class_cap(class - 2) => {
                self.relocate(marks, pos, (class, block), class_for(len), len);
            }
            _ => {}
        }
        Some(out)
    }

    /// [`HolderPool::remove`] that never moves a block (a sweep's edit):
    /// the holders shift inside theirs, and a key left with one holder has
    /// it inline and leaves its block unused until [`HolderPool::compact`].
    pub(crate) fn remove_in_place(&mut self, first: &mut Holder, i: usize) -> Option<Holder> {
        let (out, left) = self.take(first, i)?;
        self.dirty |= matches!(left, Some((_, _, 1)));
        Some(out)
    }

    /// Takes out the holder at `i`, the rest shifting inside their block; a
    /// key left with one holder has it inline (its block now unused). For a
    /// pooled key, also returns its block and how many holders are left.
    fn take(&mut self, first: &mut Holder, i: usize) -> Option<(Holder, Left)> {
        match set_of(first) {
            Set::Empty => None,
            Set::One => (i == 0).then(|| (std::mem::replace(first, empty()), None)),
            Set::Pooled { class, block, len } => {
                let run = self.run(class, block, len);
                let out = std::mem::replace(run.get_mut(i)?, empty());
                run[i..].rotate_left(1);
                let len = len - 1;
                *first = if len == 1 {
                    std::mem::replace(&mut run[0], empty())
                } else {
                    mark(class, block, len)
                };
                Some((out, Some((class, block, len))))
            }
        }
    }

    /// Every holder of a slot just taken out of the slot array (`first` is
    /// its holder, no longer among `marks`), moved out; its block is freed.
    pub(crate) fn take_detached<M: Marks + ?Sized>(
        &mut self,
        marks: &mut M,
        first: &mut Holder,
    ) -> Holders {
        match set_of(first) {
            Set::Empty => Holders::Many(Vec::new()),
            Set::One => Holders::One(std::mem::replace(first, empty())),
            Set::Pooled { class, block, len } => {
                let out = self
                    .run(class, block, len)
                    .iter_mut()
                    .map(|h| std::mem::replace(h, empty()))
                    .collect();
                *first = empty();
                self.free(marks, class, block);
                Holders::Many(out)
            }
        }
    }

    /// A sweep dropped the slot whose holder is `first`: its block, if it
    /// has one, is left for [`HolderPool::compact`].
    pub(crate) fn forget(&mut self, first: &Holder) {
        if let Set::Pooled { .. } = set_of(first) {
            self.dirty = true;
        }
    }

    /// Whether a sweep left unused blocks behind.
    pub(crate) fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Records that the slot owning the block `first` marks now sits at
    /// `pos` (the slot array moved it).
    pub(crate) fn moved(&mut self, first: &Holder, pos: usize) {
        if let Set::Pooled { class, block, .. } = set_of(first) {
            if let Some(o) = self
                .classes
                .get_mut(class)
                .and_then(|c| c.owners.get_mut(block))
            {
                *o = pos as u32;
            }
        }
    }

    /// Rebuilds the pool with only the blocks the slots' holders (`first`
    /// of each item, at its position) use, and repoints the marks.
    pub(crate) fn compact<T>(&mut self, items: &mut [T], first: impl Fn(&mut T) -> &mut Holder) {
        let mut fresh = HolderPool::default();
        for (pos, it) in items.iter_mut().enumerate() {
            let f = first(it);
            if let Set::Pooled { class, block, len } = set_of(f) {
                let to = fresh.alloc(class, pos);
                if let (Some(src), Some(dst)) = (
                    self.classes
                        .get_mut(class)
                        .and_then(|c| c.block_mut(block, len)),
                    fresh
                        .classes
                        .get_mut(class)
                        .and_then(|c| c.block_mut(to, len)),
                ) {
                    src.swap_with_slice(dst);
                }
                *f = mark(class, to, len);
            }
        }
        *self = fresh;
    }

    /// Holders the pool has room for, used or not (tests).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.classes
            .iter()
            .map(|c| c.chunks.iter().map(|k| k.len()).sum::<usize>())
            .sum()
    }

    /// Every block is owned by the slot whose mark points at it, every
    /// pooled slot's block is owned by it, and no chunk is unused (tests).
    #[cfg(test)]
    pub(crate) fn check<M: Marks + ?Sized>(&self, marks: &mut M, slots: usize) {
        let mut owned = 0;
        for (ci, c) in self.classes.iter().enumerate() {
            assert_eq!(c.chunks.len(), c.owners.len().div_ceil(c.per_chunk));
            for (b, &o) in c.owners.iter().enumerate() {
                let m = marks.mark(o as usize).expect("owner slot");
                match set_of(m) {
                    Set::Pooled { class, block, .. } => assert_eq!((class, block), (ci, b)),
                    _ => panic!("block {b} of class {ci} owned by unpooled slot {o}"),
                }
                owned += 1;
            }
        }
        let pooled = (0..slots)
            .filter(|&p| {
                marks
                    .mark(p)
                    .is_some_and(|m| matches!(set_of(m), Set::Pooled { .. }))
            })
            .count();
        assert_eq!(owned, pooled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(replica: u32) -> Holder {
        Holder::new(replica, replica as i32, Tier::T1, i64::from(replica))
    }

    fn ids(pool: &HolderPool, first: &Holder) -> Vec<u32> {
        pool.slice(first).iter().map(Holder::replica).collect()
    }

    #[test]
    fn classes_grow_by_at_most_half_and_fit_their_sizes() {
        for c in 0..40 {
            assert!(class_cap(c + 1) > class_cap(c));
            assert!(2 * class_cap(c + 1) <= 3 * class_cap(c));
        }
        for n in 2..5000 {
            let want = (0..).find(|&c| class_cap(c) >= n).unwrap();
            assert_eq!(class_for(n), want, "n = {n}");
        }
        assert_eq!(unpack(pack(45, (1 << 48) - 1)), (45, (1 << 48) - 1));
    }

    #[test]
    fn holders_spill_and_collapse_keep_order() {
        let mut pool = HolderPool::default();
        let marks: &mut [Holder] = &mut [h(5)];
        pool.insert(marks, 0, 0, h(2));
        assert_eq!(ids(&pool, &marks[0]), vec![2, 5]);
        pool.insert(marks, 0, 2, h(9));
        pool.insert(marks, 0, 1, h(3));
        assert_eq!(ids(&pool, &marks[0]), vec![2, 3, 5, 9]);
        pool.check(marks, 1);
        assert_eq!(pool.remove(marks, 0, 0).map(|x| x.replica()), Some(2));
        assert_eq!(pool.remove(marks, 0, 1).map(|x| x.replica()), Some(5));
        assert_eq!(pool.remove(marks, 0, 0).map(|x| x.replica()), Some(3));
        // Back inline: the holder itself, with its fields.
        let f = &marks[0];
        assert_eq!((f.replica(), f.tokens, f.last_seen), (9, 9, 9));
        assert!(pool.remove(marks, 0, 1).is_none());
        assert_eq!(pool.remove(marks, 0, 0).map(|x| x.replica()), Some(9));
        assert!(pool.slice(&marks[0]).is_empty());
        pool.insert(marks, 0, 0, h(4));
        assert_eq!(ids(&pool, &marks[0]), vec![4]);
        // No block is left behind.
        assert!(
            pool.classes
                .iter()
                .all(|c| c.chunks.is_empty() && c.owners.is_empty())
        );
    }

    /// Keys that all grow 1 -> 2 -> 3 -> 4 holders (a replica at a time)
    /// keep only their last blocks: the pool stays dense.
    #[test]
    fn growth_in_waves_leaves_no_unused_blocks() {
        let mut pool = HolderPool::default();
        let marks: &mut [Holder] = &mut (0..1000).map(|_| h(0)).collect::<Vec<_>>();
        for r in 1..4 {
            for pos in 0..marks.len() {
                pool.insert(marks, pos, r, h(r as u32));
            }
        }
        pool.check(marks, 1000);
        let used: usize = pool.classes.iter().map(|c| c.owners.len() * c.cap).sum();
        assert_eq!(used, 1000 * class_cap(class_for(4)));
        // Only the last class keeps chunks.
        assert!(
            pool.classes[..class_for(4)]
                .iter()
                .all(|c| c.chunks.is_empty())
        );
        assert!(marks.iter().all(|f| ids(&pool, f) == [0, 1, 2, 3]));
    }

    #[test]
    fn a_sweep_edits_in_place_and_compacts_after() {
        let mut pool = HolderPool::default();
        let marks: &mut [Holder] = &mut (0..5000).map(|k| h(k * 10)).collect::<Vec<_>>();
        for pos in 0..marks.len() {
            for j in 1..=(pos % 7) as u32 {
                let at = pool.slice(&marks[pos]).len();
                pool.insert(marks, pos, at, h(pos as u32 * 10 + j));
            }
        }
        // Most keys drop back to one holder, their blocks left in place.
        for (k, f) in marks.iter_mut().enumerate() {
            if k % 5 != 0 {
                while pool.slice(f).len() > 1 {
                    pool.remove_in_place(f, 1);
                }
            }
        }
        let before = pool.capacity();
        let want: Vec<Vec<u32>> = marks.iter().map(|f| ids(&pool, f)).collect();
        pool.compact(marks, |f| f);
        let n = marks.len();
        pool.check(marks, n);
        assert!(pool.capacity() * 3 < before);
        let got: Vec<Vec<u32>> = marks.iter().map(|f| ids(&pool, f)).collect();
        assert_eq!(got, want);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Add(usize, u32),
        Remove(usize, u32),
        /// A sweep removes replica r from every key, then compacts.
        Sweep(u32),
        /// The key at a position leaves the slot array (swap removal).
        Drop(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0usize..6, 0u32..40).prop_map(|(k, r)| Op::Add(k, r)),
            6 => (0usize..6, 0u32..40).prop_map(|(k, r)| Op::Remove(k, r)),
            1 => (0u32..40).prop_map(Op::Sweep),
            1 => (0usize..6).prop_map(Op::Drop),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Slots sharing one pool behave like sorted vectors through every
        /// edit, block move and compaction, and every block stays owned by
        /// the slot that marks it.
        #[test]
        fn slots_in_one_pool_match_sorted_vectors(ops in proptest::collection::vec(op(), 1..300)) {
            let mut pool = HolderPool::default();
            let mut marks: Vec<Holder> = (0..6).map(|_| empty()).collect();
            let mut model: Vec<Vec<u32>> = vec![Vec::new(); 6];
            for op in ops {
                match op {
                    Op::Add(k, r) if k < marks.len() => {
                        if let Err(i) = model[k].binary_search(&r) {
                            model[k].insert(i, r);
                            pool.insert(marks.as_mut_slice(), k, i, h(r));
                        }
                    }
                    Op::Remove(k, r) if k < marks.len() => {
                        if let Ok(i) = model[k].binary_search(&r) {
                            model[k].remove(i);
                            let got = pool.remove(marks.as_mut_slice(), k, i).map(|x| x.replica());
                            prop_assert_eq!(got, Some(r));
                        }
                    }
                    Op::Sweep(r) => {
                        for (f, m) in marks.iter_mut().zip(&mut model) {
                            if let Ok(i) = m.binary_search(&r) {
                                m.remove(i);
                                prop_assert_eq!(pool.remove_in_place(f, i).map(|x| x.replica()), Some(r));
                            }
                        }
                        pool.compact(&mut marks, |f| f);
                    }
                    Op::Drop(k) if k < marks.len() => {
                        let last = marks.len() - 1;
                        let mut gone = marks.swap_remove(k);
                        let want = model.swap_remove(k);
                        if k != last {
                            pool.moved(&marks[k], k);
                        }
                        let all = pool.take_detached(marks.as_mut_slice(), &mut gone);
                        prop_assert_eq!(all.iter().map(Holder::replica).collect::<Vec<_>>(), want);
                        marks.push(empty());
                        model.push(Vec::new());
                    }
                    _ => {}
                }
                let n = marks.len();
                pool.check(marks.as_mut_slice(), n);
                for (f, m) in marks.iter().zip(&model) {
                    prop_assert_eq!(&ids(&pool, f), m);
                    for x in pool.slice(f) {
                        prop_assert_eq!(x.tokens as u32, x.replica());
                    }
                }
            }
        }
    }
}

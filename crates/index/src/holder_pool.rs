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
//! most 1.5x the last); a class is one `Vec<Holder>` of equal blocks with a
//! free list. A key that grows past its block moves to the next class; one
//! that shrinks to a class two below moves down (hysteresis, so a key that
//! gains and loses one holder does not move every time). Freed blocks are
//! reused first; a sweep or a shrink compacts a pool that is more than half
//! free ([`HolderPool::compact`]).

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

/// One class: equal blocks in one array, and the blocks free for reuse.
#[derive(Default)]
struct Class {
    holders: Vec<Holder>,
    free: Vec<usize>,
}

/// The holder blocks of one shard.
#[derive(Default)]
pub(crate) struct HolderPool {
    classes: Vec<Class>,
}

impl HolderPool {
    /// The holders of a slot whose holder is `first`, sorted by replica.
    #[inline]
    pub(crate) fn slice<'a>(&'a self, first: &'a Holder) -> &'a [Holder] {
        match set_of(first) {
            Set::One => std::slice::from_ref(first),
            Set::Empty => &[],
            Set::Pooled { class, block, len } => {
                let base = block * class_cap(class);
                self.classes
                    .get(class)
                    .and_then(|c| c.holders.get(base..base + len))
                    .unwrap_or(&[])
            }
        }
    }

    /// [`HolderPool::slice`], mutable.
    #[inline]
    pub(crate) fn slice_mut<'a>(&'a mut self, first: &'a mut Holder) -> &'a mut [Holder] {
        match set_of(first) {
            Set::One => std::slice::from_mut(first),
            Set::Empty => &mut [],
            Set::Pooled { class, block, len } => {
                let base = block * class_cap(class);
                self.classes
                    .get_mut(class)
                    .and_then(|c| c.holders.get_mut(base..base + len))
                    .unwrap_or(&mut [])
            }
        }
    }

    /// A free block of `class`, its array grown by a quarter when none is
    /// free (the slot array's policy: most of the index's memory).
    fn alloc(&mut self, class: usize) -> usize {
        if self.classes.len() <= class {
            self.classes.resize_with(class + 1, Class::default);
        }
        let cap = class_cap(class);
        let Some(c) = self.classes.get_mut(class) else {
            return 0;
        };
        if let Some(b) = c.free.pop() {
            return b;
        }
        let block = c.holders.len() / cap;
        if c.holders.capacity() - c.holders.len() < cap {
            c.holders.reserve_exact((c.holders.len() / 4).max(cap * 4));
        }
        c.holders.extend((0..cap).map(|_| empty()));
        block
    }

    fn free(&mut self, class: usize, block: usize) {
        if let Some(c) = self.classes.get_mut(class) {
            c.free.push(block);
        }
    }

    /// Moves `len` holders from one block to a block of another class and
    /// frees the first; returns the new block.
    fn relocate(&mut self, from: (usize, usize), to_class: usize, len: usize) -> usize {
        let to = self.alloc(to_class);
        let (fc, fb) = from;
        let (fbase, tbase) = (fb * class_cap(fc), to * class_cap(to_class));
        let (src, dst) = if fc < to_class {
            let (lo, hi) = self.classes.split_at_mut(to_class);
            (lo.get_mut(fc), hi.first_mut())
        } else {
            let (lo, hi) = self.classes.split_at_mut(fc);
            (hi.first_mut(), lo.get_mut(to_class))
        };
        if let (Some(src), Some(dst)) = (src, dst) {
            let src = src.holders.get_mut(fbase..fbase + len).unwrap_or(&mut []);
            let dst = dst.holders.get_mut(tbase..tbase + len).unwrap_or(&mut []);
            for (s, d) in src.iter_mut().zip(dst) {
                std::mem::swap(s, d);
            }
        }
        self.free(fc, fb);
        to
    }

    /// Insert `h` at position `i` of the slot's holders (the caller keeps
    /// the replica order).
    pub(crate) fn insert(&mut self, first: &mut Holder, i: usize, h: Holder) {
        match set_of(first) {
            Set::Empty => *first = h,
            Set::One => {
                let block = self.alloc(0);
                let old = std::mem::replace(first, mark(0, block, 2));
                let (a, b) = if i == 0 { (h, old) } else { (old, h) };
                if let Some(dst) = self
                    .classes
                    .get_mut(0)
                    .and_then(|c| c.holders.get_mut(block * 2..block * 2 + 2))
                {
                    dst[0] = a;
                    dst[1] = b;
                }
            }
            Set::Pooled { class, block, len } => {
                let (class, block) = if len < class_cap(class) {
                    (class, block)
                } else {
                    let to = class_for(len + 1);
                    (to, self.relocate((class, block), to, len))
                };
                let base = block * class_cap(class);
                if let Some(run) = self
                    .classes
                    .get_mut(class)
                    .and_then(|c| c.holders.get_mut(base..base + len + 1))
                {
                    run[len] = h;
                    run[i.min(len)..].rotate_right(1);
                }
                *first = mark(class, block, len + 1);
            }
        }
    }

    /// Remove the holder at `i`; a key left with one holder has it inline
    /// again, one left with none is [`empty`].
    pub(crate) fn remove(&mut self, first: &mut Holder, i: usize) -> Option<Holder> {
        match set_of(first) {
            Set::Empty => None,
            Set::One => (i == 0).then(|| std::mem::replace(first, empty())),
            Set::Pooled { class, block, len } => {
                if i >= len {
                    return None;
                }
                let base = block * class_cap(class);
                let run = self
                    .classes
                    .get_mut(class)
                    .and_then(|c| c.holders.get_mut(base..base + len))?;
                let out = std::mem::replace(&mut run[i], empty());
                run[i..].rotate_left(1);
                let len = len - 1;
                if len == 1 {
                    *first = std::mem::replace(&mut run[0], empty());
                    self.free(class, block);
                } else if class >= 2 && len <= class_cap(class - 2) {
                    let to = class_for(len);
                    let b = self.relocate((class, block), to, len);
                    *first = mark(to, b, len);
                } else {
                    *first = mark(class, block, len);
                }
                Some(out)
            }
        }
    }

    /// Every holder of the slot, moved out; the slot is left [`empty`] and
    /// its block free.
    pub(crate) fn take_all(&mut self, first: &mut Holder) -> Holders {
        match set_of(first) {
            Set::Empty => Holders::Many(Vec::new()),
            Set::One => Holders::One(std::mem::replace(first, empty())),
            Set::Pooled { class, block, .. } => {
                let out = self
                    .slice_mut(first)
                    .iter_mut()
                    .map(|h| std::mem::replace(h, empty()))
                    .collect();
                self.free(class, block);
                *first = empty();
                Holders::Many(out)
            }
        }
    }

    /// Frees the slot's block, if it has one (the slot is being dropped).
    pub(crate) fn release(&mut self, first: &Holder) {
        if let Set::Pooled { class, block, .. } = set_of(first) {
            self.free(class, block);
        }
    }

    /// Whether more than half of the pool's holders (and at least 4,096)
    /// sit in free blocks or unused capacity.
    pub(crate) fn is_sparse(&self) -> bool {
        let (mut idle, mut total) = (0usize, 0usize);
        for (i, c) in self.classes.iter().enumerate() {
            idle += c.free.len() * class_cap(i) + (c.holders.capacity() - c.holders.len());
            total += c.holders.capacity();
        }
        idle >= 4096 && 2 * idle > total
    }

    /// Rebuilds the pool with only the blocks the slots' holders (`first`
    /// of each item) use, each class sized exactly, and repoints the marks.
    pub(crate) fn compact<T>(&mut self, items: &mut [T], first: impl Fn(&mut T) -> &mut Holder) {
        let mut blocks = vec![0usize; self.classes.len()];
        for it in items.iter_mut() {
            if let Set::Pooled { class, .. } = set_of(first(it)) {
                if let Some(n) = blocks.get_mut(class) {
                    *n += 1;
                }
            }
        }
        let mut fresh = HolderPool {
            classes: blocks
                .iter()
                .enumerate()
                .map(|(i, &n)| Class {
                    holders: Vec::with_capacity(n * class_cap(i)),
                    free: Vec::new(),
                })
                .collect(),
        };
        for it in items.iter_mut() {
            let f = first(it);
            if let Set::Pooled { class, block, len } = set_of(f) {
                let cap = class_cap(class);
                let (Some(old), Some(new)) =
                    (self.classes.get_mut(class), fresh.classes.get_mut(class))
                else {
                    continue;
                };
                let nb = new.holders.len() / cap;
                let base = block * cap;
                if let Some(src) = old.holders.get_mut(base..base + cap) {
                    new.holders
                        .extend(src.iter_mut().map(|h| std::mem::replace(h, empty())));
                }
                *f = mark(class, nb, len);
            }
        }
        *self = fresh;
    }

    /// Holders the pool has room for, used or not (tests and memory figures).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.classes.iter().map(|c| c.holders.capacity()).sum()
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
        let mut first = h(5);
        pool.insert(&mut first, 0, h(2));
        assert_eq!(ids(&pool, &first), vec![2, 5]);
        pool.insert(&mut first, 2, h(9));
        pool.insert(&mut first, 1, h(3));
        assert_eq!(ids(&pool, &first), vec![2, 3, 5, 9]);
        assert_eq!(pool.remove(&mut first, 0).map(|x| x.replica()), Some(2));
        assert_eq!(pool.remove(&mut first, 1).map(|x| x.replica()), Some(5));
        assert_eq!(pool.remove(&mut first, 0).map(|x| x.replica()), Some(3));
        // Back inline: the holder itself, with its fields.
        assert_eq!((first.replica(), first.tokens, first.last_seen), (9, 9, 9));
        assert!(pool.remove(&mut first, 1).is_none());
        assert_eq!(pool.remove(&mut first, 0).map(|x| x.replica()), Some(9));
        assert!(pool.slice(&first).is_empty());
        pool.insert(&mut first, 0, h(4));
        assert_eq!(ids(&pool, &first), vec![4]);
        // Every block went back to its free list.
        assert!(
            pool.classes
                .iter()
                .enumerate()
                .all(|(i, c)| c.free.len() * class_cap(i) == c.holders.len())
        );
    }

    #[test]
    fn a_sparse_pool_compacts_and_keeps_every_key() {
        let mut pool = HolderPool::default();
        let mut firsts: Vec<Holder> = (0..5000).map(|k| h(k * 10)).collect();
        for (k, f) in firsts.iter_mut().enumerate() {
            for j in 1..=(k % 7) as u32 {
                let at = pool.slice(f).len();
                pool.insert(f, at, h(k as u32 * 10 + j));
            }
        }
        // Most keys drop back to one holder.
        for (k, f) in firsts.iter_mut().enumerate() {
            if k % 5 != 0 {
                while pool.slice(f).len() > 1 {
                    pool.remove(f, 1);
                }
            }
        }
        let before = pool.capacity();
        assert!(pool.is_sparse());
        let want: Vec<Vec<u32>> = firsts.iter().map(|f| ids(&pool, f)).collect();
        pool.compact(&mut firsts, |f| f);
        assert!(!pool.is_sparse());
        assert!(pool.capacity() * 3 < before);
        let got: Vec<Vec<u32>> = firsts.iter().map(|f| ids(&pool, f)).collect();
        assert_eq!(got, want);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Several keys sharing one pool behave like sorted vectors.
        #[test]
        fn keys_in_one_pool_match_sorted_vectors(
            ops in proptest::collection::vec((0usize..4, any::<bool>(), 0u32..40), 1..400)
        ) {
            let mut pool = HolderPool::default();
            let mut firsts: Vec<Holder> = (0..4).map(|_| empty()).collect();
            let mut model: Vec<Vec<u32>> = vec![Vec::new(); 4];
            for (k, add, r) in ops {
                let (f, m) = (&mut firsts[k], &mut model[k]);
                match (m.binary_search(&r), add) {
                    (Err(i), true) => { m.insert(i, r); pool.insert(f, i, h(r)); }
                    (Ok(i), false) => {
                        m.remove(i);
                        prop_assert_eq!(pool.remove(f, i).map(|x| x.replica()), Some(r));
                    }
                    _ => {}
                }
                if k == 0 && r % 13 == 0 {
                    pool.compact(&mut firsts, |f| f);
                }
                for (f, m) in firsts.iter().zip(&model) {
                    prop_assert_eq!(&ids(&pool, f), m);
                    for x in pool.slice(f) {
                        prop_assert_eq!(x.tokens as u32, x.replica());
                    }
                }
            }
            for f in &mut firsts {
                let all = pool.take_all(f);
                prop_assert!(all.iter().all(|x| x.tokens as u32 == x.replica()));
                prop_assert!(pool.slice(f).is_empty());
            }
        }
    }
}

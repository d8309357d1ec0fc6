//! The bucket table of one shard: open addressing with linear probing over
//! 4-byte buckets, each a 7-bit tag and a 25-bit position into the shard's
//! dense slot array.
//!
//! Why not `hashbrown::HashTable<u32>` (which this replaced): a chain lookup
//! wants to start every block's memory loads before it needs any of them
//! (`chain.rs`), and that needs the bucket's address from the key hash alone
//! and a bucket that says, without touching the slot, whether the slot is
//! probably the key's. hashbrown hides the first and stores its tag in a
//! separate control array (a second line per probe). Here a probe reads one
//! bucket line; the tag (the hash's top 7 bits) rejects 127 of 128 foreign
//! slots before they are touched; the key compare on the slot confirms.
//!
//! Memory is what hashbrown's cost: 4 bytes a bucket at a load of at most
//! 4/5 (hashbrown: 5 bytes at 7/8). Removal leaves a tombstone (no slot is
//! read to re-home a cluster); tombstones count towards the load and a
//! rehash at the same size clears them.

/// Bits of a bucket that hold the slot position.
const POS_BITS: u32 = 25;
const POS_MASK: u32 = (1 << POS_BITS) - 1;
/// A bucket never used since the last rebuild: a probe stops here.
const EMPTY: u32 = u32::MAX;
/// A bucket whose key was removed: a probe goes on past it.
const TOMB: u32 = u32::MAX - 1;
/// Most slots one shard can address (64 shards: about 2.1 billion keys).
pub(crate) const MAX_SLOTS: usize = (POS_MASK - 1) as usize;
/// Smallest non-empty table.
const MIN_BUCKETS: usize = 16;

/// The tag of a key hash: its top 7 bits (the shard uses bits 51..57, the
/// home bucket the low bits).
#[inline]
fn tag_of(hash: u64) -> u32 {
    (hash >> 57) as u32
}

/// `true` for a bucket that holds a position (not empty, not a tombstone).
#[inline]
fn live(b: u32) -> bool {
    b < TOMB
}

#[inline]
fn pos_of(b: u32) -> usize {
    (b & POS_MASK) as usize
}

/// Buckets needed to hold `n` keys under the load limit.
pub(crate) fn buckets_for(n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    (n.saturating_mul(5) / 4 + 1)
        .next_power_of_two()
        .max(MIN_BUCKETS)
}

#[derive(Default)]
pub(crate) struct Table {
    buckets: Box<[u32]>,
    live: usize,
    tombs: usize,
}

impl Table {
    #[inline]
    fn mask(&self) -> usize {
        self.buckets.len().wrapping_sub(1)
    }

    /// The bucket a probe for `hash` reads first, for the caller to load
    /// ahead of the probe (0 when the table is empty).
    #[inline]
    pub(crate) fn home(&self, hash: u64) -> u32 {
        self.buckets
            .get((hash as usize) & self.mask())
            .copied()
            .unwrap_or(0)
    }

    /// The positions whose tag matches `hash`, in probe order, until the
    /// first empty bucket: `is_key(pos)` picks the key's own.
    #[inline]
    pub(crate) fn find(&self, hash: u64, is_key: impl FnMut(usize) -> bool) -> Option<usize> {
        self.find_bucket(hash, is_key).map(|(_, p)| p)
    }

    /// The first position whose tag matches `hash`, unconfirmed (the caller
    /// checks the slot and falls back to [`Table::find`] on a mismatch).
    #[inline]
    pub(crate) fn candidate(&self, hash: u64) -> Option<usize> {
        self.find_bucket(hash, |_| true).map(|(_, p)| p)
    }

    #[inline]
    fn find_bucket(
        &self,
        hash: u64,
        mut is_key: impl FnMut(usize) -> bool,
    ) -> Option<(usize, usize)> {
        let mask = self.mask();
        let tag = tag_of(hash);
        let mut i = (hash as usize) & mask;
        // At most every bucket once: the load limit keeps an empty bucket
        // in every table, the bound only guards against a broken invariant.
        for _ in 0..self.buckets.len() {
            let b = *self.buckets.get(i)?;
            if b == EMPTY {
                return None;
            }
            if live(b) && b >> POS_BITS == tag && is_key(pos_of(b)) {
                return Some((i, pos_of(b)));
            }
            i = (i + 1) & mask;
        }
        None
    }

    /// Make room for one more key; `hash_at(pos)` rehashes a stored slot.
    pub(crate) fn reserve_one(&mut self, slots: usize, hash_at: impl Fn(usize) -> u64) {
        let n = self.buckets.len();
        if (self.live + self.tombs + 1) * 5 <= n * 4 {
            return;
        }
        // Tombstones alone over the limit: rehash in place; else grow.
        let size = if (self.live + 1) * 5 <= n * 2 {
            n
        } else {
            buckets_for(self.live + 1).max(n * 2)
        };
        self.rebuild(size, slots, hash_at);
    }

    /// Point a free bucket of `hash` at `pos` (the caller has just seen the
    /// key absent and called [`Table::reserve_one`]).
    pub(crate) fn insert(&mut self, hash: u64, pos: usize) {
        let mask = self.mask();
        let mut i = (hash as usize) & mask;
        for _ in 0..self.buckets.len() {
            let Some(b) = self.buckets.get_mut(i) else {
                return;
            };
            if !live(*b) {
                if *b == TOMB {
                    self.tombs -= 1;
                }
                *b = (tag_of(hash) << POS_BITS) | (pos as u32 & POS_MASK);
                self.live += 1;
                return;
            }
            i = (i + 1) & mask;
        }
    }

    /// Remove the key's bucket; returns its position.
    pub(crate) fn remove(&mut self, hash: u64, is_key: impl FnMut(usize) -> bool) -> Option<usize> {
        let (i, pos) = self.find_bucket(hash, is_key)?;
        let mask = self.mask();
        // Followed by an empty bucket, the hole (and the tombstones just
        // before it) ends every probe that reached it anyway: make them empty.
        if self.buckets.get((i + 1) & mask) == Some(&EMPTY) {
            self.buckets[i] = EMPTY;
            let mut j = i.wrapping_sub(1) & mask;
            while self.buckets.get(j) == Some(&TOMB) {
                self.buckets[j] = EMPTY;
                self.tombs -= 1;
                j = j.wrapping_sub(1) & mask;
            }
        } else {
            self.buckets[i] = TOMB;
            self.tombs += 1;
        }
        self.live -= 1;
        Some(pos)
    }

    /// Repoint the bucket of the slot at `from` (hash `hash`) to `to`.
    pub(crate) fn repoint(&mut self, hash: u64, from: usize, to: usize) {
        if let Some((i, _)) = self.find_bucket(hash, |p| p == from) {
            let b = &mut self.buckets[i];
            *b = (*b & !POS_MASK) | (to as u32 & POS_MASK);
        }
    }

    /// Rebuild at `size` buckets from the slots `0..slots`.
    pub(crate) fn rebuild(&mut self, size: usize, slots: usize, hash_at: impl Fn(usize) -> u64) {
        let size = size.max(buckets_for(slots));
        self.buckets = vec![EMPTY; size].into_boxed_slice();
        self.live = 0;
        self.tombs = 0;
        for p in 0..slots {
            self.insert(hash_at(p), p);
        }
    }

    /// Rebuild at the current size (clears the tombstones; a sweep that
    /// removed keys calls it once).
    pub(crate) fn rehash(&mut self, slots: usize, hash_at: impl Fn(usize) -> u64) {
        self.rebuild(self.buckets.len(), slots, hash_at);
    }

    /// Keys the table holds before it must grow.
    pub(crate) fn capacity(&self) -> usize {
        self.buckets.len() * 4 / 5
    }

    /// Shrink to the smallest size that holds `n` keys (at least the live ones).
    pub(crate) fn shrink_to(&mut self, n: usize, slots: usize, hash_at: impl Fn(usize) -> u64) {
        let size = buckets_for(n.max(self.live));
        if size < self.buckets.len() {
            self.rebuild(size, slots, hash_at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// Hashes chosen to collide: few distinct low bits and tags.
    fn h(x: u16) -> u64 {
        let x = u64::from(x);
        ((x % 3) << 57) | (x.wrapping_mul(7) & 0xff) | (x << 20)
    }

    proptest! {
        /// The table against a map: every key stays findable through
        /// inserts, removals (tombstones, empties) and rebuilds.
        #[test]
        fn table_matches_a_map(ops in proptest::collection::vec((any::<bool>(), 0u16..300), 1..600)) {
            let mut t = Table::default();
            // slots[pos] = key; model: key -> pos
            let mut slots: Vec<u16> = Vec::new();
            let mut model: HashMap<u16, usize> = HashMap::new();
            for (ins, k) in ops {
                let found = t.find(h(k), |p| slots[p] == k);
                prop_assert_eq!(found, model.get(&k).copied());
                if ins && found.is_none() {
                    let s = slots.clone();
                    t.reserve_one(slots.len(), |p| h(s[p]));
                    t.insert(h(k), slots.len());
                    model.insert(k, slots.len());
                    slots.push(k);
                } else if !ins && found.is_some() {
                    let pos = t.remove(h(k), |p| slots[p] == k);
                    prop_assert_eq!(pos, found);
                    let pos = pos.unwrap_or_default();
                    model.remove(&k);
                    let last = slots.len() - 1;
                    slots.swap_remove(pos);
                    if pos != last {
                        let moved = slots[pos];
                        t.repoint(h(moved), last, pos);
                        model.insert(moved, pos);
                    }
                }
                prop_assert!(t.live == model.len());
                prop_assert!((t.live + t.tombs) * 5 <= t.buckets.len() * 4 || t.buckets.is_empty());
            }
            for (k, &p) in &model {
                prop_assert_eq!(t.find(h(*k), |q| slots[q] == *k), Some(p));
                let c = t.candidate(h(*k));
                prop_assert!(c.is_some());
            }
            let s = slots.clone();
            t.shrink_to(0, slots.len(), |p| h(s[p]));
            for (k, &p) in &model {
                prop_assert_eq!(t.find(h(*k), |q| slots[q] == *k), Some(p));
            }
            t.rehash(slots.len(), |p| h(s[p]));
            prop_assert_eq!(t.tombs, 0);
            for (k, &p) in &model {
                prop_assert_eq!(t.find(h(*k), |q| slots[q] == *k), Some(p));
            }
        }
    }

    #[test]
    fn empty_table_finds_nothing() {
        let t = Table::default();
        assert_eq!(t.find(5, |_| true), None);
        assert_eq!(t.candidate(5), None);
        assert_eq!(t.home(5), 0);
        assert_eq!(t.capacity(), 0);
    }
}

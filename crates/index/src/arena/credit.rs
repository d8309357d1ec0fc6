//! Delivered hits credited to their holdings (the LFU count, `tally.rs`),
//! run by run as the walk reads a chain: one probe, one run read lock and
//! one tally lock per run the hit spans, and one count edit per run and
//! replica, where crediting block by block cost a probe, a span search and
//! a locked map update per (block, replica). Hits are taken in replica
//! order (sorted here when they are not: the default ranking's answer
//! order is by estimate) and credited in one forward pass over each run's
//! spans and counts, not a search and a piece edit per replica (at 64
//! matched replicas the searches were 8 % of a default lookup, issue 36).

use super::ChainArena;
use super::tally::Cursor;
use std::cell::RefCell;

thread_local! {
    /// Per replica id, 1 + the blocks of its hit (0: none) while
    /// [`order_by_replica`] runs; all 0 between calls.
    static SLOTS: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Puts `hits` in replica order. Replica ids are interned densely, so a
/// table indexed by id orders a lookup's hits in O(hits + largest id): a
/// comparison sort of 64 hits cost half of what crediting them did. Sparse
/// ids, or one replica hit twice (credited twice), take the sort.
fn order_by_replica(hits: &mut [Credit]) {
    if hits.is_sorted_by_key(|h| h.replica) {
        return;
    }
    let largest = hits.iter().map(|h| h.replica as usize).max().unwrap_or(0);
    if largest > 4 * hits.len() + 256 {
        hits.sort_unstable_by_key(|h| h.replica);
        return;
    }
    crate::scratch::with(&SLOTS, |slots| {
        if slots.len() <= largest {
            slots.resize(largest + 1, 0);
        }
        let mut twice = false;
        for h in hits.iter() {
            let slot = &mut slots[h.replica as usize];
            twice |= *slot != 0;
            *slot = u64::from(h.blocks) + 1;
        }
        if twice {
            for h in hits.iter() {
                slots[h.replica as usize] = 0;
            }
            hits.sort_unstable_by_key(|h| h.replica);
            return;
        }
        let mut k = 0;
        for (replica, slot) in slots[..=largest].iter_mut().enumerate() {
            if *slot != 0 {
                hits[k] = Credit {
                    replica: replica as u32,
                    blocks: (*slot - 1) as u32,
                };
                *slot = 0;
                k += 1;
            }
        }
    });
}

/// One replica's delivered hit: it is credited on the first `blocks`
/// blocks of the chain (those it still holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credit {
    /// Interned replica id.
    pub replica: u32,
    /// Leading blocks of the chain the hit covers.
    pub blocks: u32,
}

impl ChainArena {
    /// +1 on every holding of `hits` over the chain whose `n` block hashes
    /// `key` gives: replica `r` of a hit is credited on each of the first
    /// `blocks` blocks it holds now. A block no replica holds any more is
    /// skipped, like a holding that went. `hits` is left in replica order.
    pub fn credit(&self, part: u32, n: usize, key: impl Fn(usize) -> u64, hits: &mut [Credit]) {
        // Credits commute, so their order is free: replica order lets one
        // cursor pass each run (`Run::credit_held_from`).
        order_by_replica(hits);
        let hits = &*hits;
        let depth = hits
            .iter()
            .map(|h| h.blocks as usize)
            .max()
            .unwrap_or(0)
            .min(n);
        let mut pos = 0;
        while pos < depth {
            let Some((at, g)) = self.locate(part, key(pos)) else {
                pos += 1;
                continue;
            };
            let Some(run) = g.get(at) else {
                pos += 1;
                continue;
            };
            let m = run.agreeing(at.off as usize, pos, depth, &key);
            g.tallies.edit(at.local() as u32, |pieces| {
                let mut cur = Cursor::default();
                for h in hits.iter().filter(|h| h.blocks as usize > pos) {
                    let k = (h.blocks as usize - pos).min(m) as u32;
                    run.credit_held_from(&mut cur, pieces, h.replica, at.off, at.off + k);
                }
            });
            pos += m;
        }
    }

    /// Sets `replica`'s count of block (`part`, `hash`) to `n` (a snapshot
    /// restore) if it holds the block; 0 clears it.
    pub fn set_access(&self, part: u32, hash: u64, replica: u32, n: u64) {
        let Some((at, g)) = self.locate(part, hash) else {
            return;
        };
        let Some(run) = g.get(at) else {
            return;
        };
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        g.tallies.edit(at.local() as u32, |pieces| {
            run.set_held(pieces, replica, at.off, n)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The table's order is the sort's, for dense and sparse ids and
        /// replicas hit twice, and the table is left clear.
        #[test]
        fn hits_are_put_in_replica_order(
            raw in proptest::collection::vec((0u32..80, 0u32..40), 0..70),
            sparse in any::<bool>(),
        ) {
            let mut hits: Vec<Credit> = raw
                .iter()
                .map(|&(r, b)| Credit { replica: if sparse { r * 1000 } else { r }, blocks: b })
                .collect();
            let mut want = hits.clone();
            want.sort_unstable_by_key(|h| (h.replica, h.blocks));
            order_by_replica(&mut hits);
            prop_assert!(hits.is_sorted_by_key(|h| h.replica));
            hits.sort_by_key(|h| (h.replica, h.blocks));
            prop_assert_eq!(hits, want);
            prop_assert!(SLOTS.with(|s| s.borrow().iter().all(|&x| x == 0)));
        }
    }
}

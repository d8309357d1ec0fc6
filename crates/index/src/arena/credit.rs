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
        if !hits.is_sorted_by_key(|h| h.replica) {
            hits.sort_unstable_by_key(|h| h.replica);
        }
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

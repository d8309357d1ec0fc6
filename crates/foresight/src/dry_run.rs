//! The dry run: which leading blocks of a claim survive the allocations of
//! the requests queued ahead of it, by vLLM's rules ([`crate::pool`]).
//!
//! Both routers run the same dry run over their own view of an engine's
//! free queue ([`FreeQueue`]): the gateway over its simulated [`Pool`]
//! (it sees its requests start and end), the server over what the engine's
//! own store and removal events say it holds (it sees neither).
//!
//! [`Pool`]: crate::Pool

use crate::pool::{blocks_needed, hit_cap};
use std::collections::HashSet;
use std::hash::Hash;

/// An engine's free queue as a router models it.
pub trait FreeQueue {
    /// A physical block's identity in the model.
    type Block: Copy + Eq + Hash;
    /// Blank free blocks: the front of the free queue (popped first).
    fn blank_free(&self) -> usize;
    /// The free blocks that carry a hash, in eviction order.
    fn eviction_order(&self) -> impl Iterator<Item = Self::Block> + '_;
    /// The blocks holding `hash`, the one vLLM hits first first.
    fn copies(&self, hash: u64) -> &[Self::Block];
    /// Whether `block` is free (in the free queue, so a hit must touch it).
    fn is_free(&self, block: Self::Block) -> bool;
    /// Whether the model saw `hash`'s last copy evicted (and not stored
    /// since): an eviction the index may not have heard of yet.
    fn gone(&self, hash: u64) -> bool;
}

/// A request queued ahead of the claim: sent to the engine, not scheduled
/// as far as the model knows.
#[derive(Debug, Clone, Copy)]
pub struct Ahead<'a> {
    /// Its prompt's whole blocks (chain hashes).
    pub chain: &'a [u64],
    /// Its prompt length in tokens.
    pub prompt_tokens: u64,
}

/// Of `claim` (the leading blocks of a chain the index says the engine
/// holds), how many it will still hold when it schedules a request sent
/// now, behind `ahead` (in the order the engine schedules them: first come,
/// first served).
///
/// Each request ahead touches its hits (out of the free queue before
/// anything is popped for it) and pops the blocks it still needs, blank
/// ones first, then in eviction order; the claim ends at the first of its
/// blocks whose every copy was popped, or that the model saw evicted.
/// Blocks the model never saw keep the index's word: the dry run only ever
/// shortens a claim. When the free queue runs dry the engine would wait
/// for blocks to be freed, which is past what the model knows: it stops
/// popping.
pub fn claimable<'a, Q: FreeQueue>(
    q: &Q,
    block_size: u32,
    ahead: impl IntoIterator<Item = Ahead<'a>>,
    claim: &[u64],
) -> usize {
    // Free blocks the queued requests hit, blocks they popped, and the
    // hashes their new blocks will hold.
    let mut touched: HashSet<Q::Block> = HashSet::new();
    let mut popped: HashSet<Q::Block> = HashSet::new();
    let mut stored: HashSet<u64> = HashSet::new();
    let mut blank = q.blank_free();
    let mut order = q.eviction_order();
    for a in ahead {
        let cap = hit_cap(a.prompt_tokens, block_size, a.chain.len());
        let mut hits = 0;
        for &h in &a.chain[..cap] {
            if stored.contains(&h) {
                hits += 1;
                continue;
            }
            match q.copies(h).iter().find(|id| !popped.contains(id)) {
                Some(&id) => {
                    if q.is_free(id) {
                        touched.insert(id);
                    }
                    hits += 1;
                }
                None => break,
            }
        }
        stored.extend(a.chain.iter().skip(hits).copied());
        let total = blocks_needed(a.prompt_tokens, block_size).max(a.chain.len());
        let mut need = total.saturating_sub(hits);
        let from_blank = need.min(blank);
        blank -= from_blank;
        need -= from_blank;
        while need > 0 {
            match order.next() {
                None => break,
                Some(id) if touched.contains(&id) => {}
                Some(id) => {
                    popped.insert(id);
                    need -= 1;
                }
            }
        }
    }
    for (i, &h) in claim.iter().enumerate() {
        if stored.contains(&h) {
            continue;
        }
        let copies = q.copies(h);
        if copies.iter().any(|id| !popped.contains(id)) {
            continue;
        }
        if !copies.is_empty() || q.gone(h) {
            // Evicted by a queued request, or by one already scheduled
            // whose removal the index has not heard of yet.
            return i;
        }
        // Never seen by the model: the index's word stands.
    }
    claim.len()
}

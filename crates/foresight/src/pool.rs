//! A model of one vLLM engine's KV block pool, driven by the requests sent
//! to it (the gateway's model: it sees every request it routes start and end).
//!
//! vLLM 0.32's `BlockPool` (`vllm/v1/core/block_pool.py`,
//! `kv_cache_manager.py`, `single_type_kv_cache_manager.py`), as far as it
//! decides what a new request evicts:
//!
//! - A free queue (`FreeKVCacheBlockQueue`) holds every block no request
//!   uses. `get_new_blocks` pops from its front; a popped block that still
//!   carries a hash is evicted (`BlockRemoved`).
//! - A finished request's blocks are freed in reverse order (its tail
//!   first). Blocks with a hash are appended to the back (LRU), blocks
//!   without one (the partial last block) prepended to the front (reused
//!   first). So the free queue is always blank blocks, then cached blocks
//!   from least to most recently freed.
//! - Scheduling a request finds its longest cached prefix (at most
//!   `prompt - 1` tokens: the last token is always computed), *touches*
//!   those blocks (out of the free queue, reference count up) and only then
//!   pops new blocks for the rest of the prompt, so its own allocation never
//!   evicts its own hit. A new full block gets its hash at once, even when
//!   another copy holds the same hash (both stay cached).
//!
//! Blocks are modelled by the router's own block chain hashes (the
//! fingerprint's `chain`, as u64): the model never needs the engine's. Blank
//! free blocks are a count; only blocks with a hash, or in use, exist
//! individually, so memory follows what is cached, not the capacity.

use crate::dry_run::FreeQueue;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// A modelled physical block.
#[derive(Debug, Clone, Copy, Default)]
struct Block {
    /// Its chain hash (`None`: blank, or a partial / decode block).
    hash: Option<u64>,
    /// Requests using it.
    refs: u32,
    /// Its place in the free queue's cached part (while free).
    seq: Option<u64>,
}

/// How many hashes the model remembers having evicted (per engine).
const GONE_MEMORY: usize = 1 << 16;

/// One engine's block pool.
#[derive(Debug)]
pub struct Pool {
    block_size: u32,
    /// Usable blocks.
    capacity: usize,
    /// Blank free blocks: the front of the free queue.
    blank_free: usize,
    /// Free blocks with a hash, in eviction order (`seq` → block id).
    lru: BTreeMap<u64, u32>,
    next_seq: u64,
    blocks: Vec<Block>,
    /// Block ids not in use by the model (recycled).
    spare: Vec<u32>,
    /// Cached blocks (free or in use) by hash, oldest copy first (vLLM hits
    /// the first copy it finds).
    by_hash: HashMap<u64, Vec<u32>>,
    /// Hashes the model evicted (their last copy popped), bounded.
    gone: HashSet<u64>,
    gone_order: VecDeque<u64>,
    /// Allocations that found fewer free blocks than they needed (the
    /// model and the engine disagree: traffic the router did not route, a
    /// capacity read wrong).
    pub shortfalls: u64,
}

/// What a request got when it was scheduled.
#[derive(Debug, Default, Clone)]
pub struct Allocation {
    /// Its blocks in allocation order (hits first).
    pub blocks: Vec<u32>,
}

/// The leading blocks of `chain` a `prompt_tokens`-token prompt may reuse:
/// vLLM matches at most `prompt_tokens - 1` tokens.
pub fn hit_cap(prompt_tokens: u64, block_size: u32, chain_len: usize) -> usize {
    let cap = prompt_tokens.saturating_sub(1) / u64::from(block_size.max(1));
    chain_len.min(usize::try_from(cap).unwrap_or(usize::MAX))
}

/// Blocks a `prompt_tokens`-token request holds once scheduled: the prompt
/// and the slot of the first generated token (its KV is written at the
/// first decode step). Later decode blocks are not modelled.
pub fn blocks_needed(prompt_tokens: u64, block_size: u32) -> usize {
    let n = prompt_tokens / u64::from(block_size.max(1)) + 1;
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl Pool {
    /// An engine with `capacity` usable blocks (vLLM's `num_gpu_blocks`
    /// less its null block), all blank.
    pub fn new(capacity: usize, block_size: u32) -> Self {
        Self {
            block_size: block_size.max(1),
            capacity,
            blank_free: capacity,
            lru: BTreeMap::new(),
            next_seq: 0,
            blocks: Vec::new(),
            spare: Vec::new(),
            by_hash: HashMap::new(),
            gone: HashSet::new(),
            gone_order: VecDeque::new(),
            shortfalls: 0,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Usable blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Free blocks (blank and cached).
    pub fn free(&self) -> usize {
        self.blank_free + self.lru.len()
    }

    /// Whether the model holds `hash` cached (free or in use).
    pub fn cached(&self, hash: u64) -> bool {
        self.by_hash.get(&hash).is_some_and(|v| !v.is_empty())
    }

    /// Whether the model saw `hash`'s last copy evicted (and not stored
    /// since).
    pub fn gone(&self, hash: u64) -> bool {
        self.gone.contains(&hash)
    }

    /// Copies of `hash`, oldest first.
    pub fn copies(&self, hash: u64) -> &[u32] {
        self.by_hash.get(&hash).map_or(&[], Vec::as_slice)
    }

    /// Whether block `id` is free (in the free queue).
    pub fn is_free(&self, id: u32) -> bool {
        self.blocks.get(id as usize).is_some_and(|b| b.refs == 0)
    }

    /// Blank free blocks, then the free cached blocks in eviction order.
    pub fn blank_free(&self) -> usize {
        self.blank_free
    }

    /// The free cached blocks in eviction order: (block id, hash).
    pub fn eviction_order(&self) -> impl Iterator<Item = (u32, Option<u64>)> + '_ {
        self.lru
            .values()
            .map(|&id| (id, self.blocks[id as usize].hash))
    }

    /// Schedules a request: touches its cached prefix, then allocates the
    /// rest (evicting from the free queue's front).
    pub fn schedule(&mut self, chain: &[u64], prompt_tokens: u64) -> Allocation {
        let cap = hit_cap(prompt_tokens, self.block_size, chain.len());
        let mut out = Allocation::default();
        for &h in &chain[..cap] {
            let Some(&id) = self.by_hash.get(&h).and_then(|v| v.first()) else {
                break;
            };
            let b = &mut self.blocks[id as usize];
            if b.refs == 0 {
                if let Some(seq) = b.seq.take() {
                    self.lru.remove(&seq);
                }
            }
            b.refs += 1;
            out.blocks.push(id);
        }
        let hits = out.blocks.len();
        let total = blocks_needed(prompt_tokens, self.block_size).max(chain.len());
        for k in hits..total {
            let Some(id) = self.pop_free() else {
                self.shortfalls += 1;
                break;
            };
            let hash = chain.get(k).copied();
            self.blocks[id as usize] = Block {
                hash,
                refs: 1,
                seq: None,
            };
            if let Some(h) = hash {
                self.by_hash.entry(h).or_default().push(id);
                if self.gone.remove(&h) {
                    self.gone_order.retain(|x| *x != h);
                }
            }
            out.blocks.push(id);
        }
        out
    }

    /// Frees a finished request's blocks, tail first.
    pub fn release(&mut self, a: &Allocation) {
        for &id in a.blocks.iter().rev() {
            let Some(b) = self.blocks.get_mut(id as usize) else {
                continue;
            };
            b.refs = b.refs.saturating_sub(1);
            if b.refs > 0 {
                continue;
            }
            if b.hash.is_some() {
                b.seq = Some(self.next_seq);
                self.lru.insert(self.next_seq, id);
                self.next_seq += 1;
            } else {
                // Blank: to the front, anonymous.
                *b = Block::default();
                self.spare.push(id);
                self.blank_free += 1;
            }
        }
    }

    fn pop_free(&mut self) -> Option<u32> {
        if self.blank_free > 0 {
            self.blank_free -= 1;
            return Some(self.new_id());
        }
        let (_, id) = self.lru.pop_first()?;
        let b = std::mem::take(&mut self.blocks[id as usize]);
        if let Some(h) = b.hash {
            self.evict(h, id);
        }
        Some(id)
    }

    fn evict(&mut self, h: u64, id: u32) {
        let Some(v) = self.by_hash.get_mut(&h) else {
            return;
        };
        v.retain(|x| *x != id);
        if v.is_empty() {
            self.by_hash.remove(&h);
            if self.gone.insert(h) {
                self.gone_order.push_back(h);
                if self.gone_order.len() > GONE_MEMORY {
                    if let Some(old) = self.gone_order.pop_front() {
                        self.gone.remove(&old);
                    }
                }
            }
        }
    }

    fn new_id(&mut self) -> u32 {
        if let Some(id) = self.spare.pop() {
            return id;
        }
        self.blocks.push(Block::default());
        u32::try_from(self.blocks.len() - 1).unwrap_or(u32::MAX)
    }
}

impl FreeQueue for Pool {
    type Block = u32;

    fn blank_free(&self) -> usize {
        self.blank_free
    }

    fn eviction_order(&self) -> impl Iterator<Item = u32> + '_ {
        self.lru.values().copied()
    }

    fn copies(&self, hash: u64) -> &[u32] {
        Pool::copies(self, hash)
    }

    fn is_free(&self, block: u32) -> bool {
        Pool::is_free(self, block)
    }

    fn gone(&self, hash: u64) -> bool {
        Pool::gone(self, hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u32 = 4;

    /// A chain of `n` blocks starting at hash `from`.
    fn chain(from: u64, n: u64) -> Vec<u64> {
        (from..from + n).collect()
    }

    #[test]
    fn a_request_takes_its_prompt_and_one_decode_slot() {
        let mut p = Pool::new(10, BS);
        // 9 tokens: 2 full blocks + a partial one (which also takes the
        // first decode slot).
        let a = p.schedule(&chain(1, 2), 9);
        assert_eq!(a.blocks.len(), 3);
        assert_eq!(p.free(), 7);
        // Block-aligned: 2 full blocks + the decode slot.
        let b = p.schedule(&chain(10, 2), 8);
        assert_eq!(b.blocks.len(), 3);
        p.release(&a);
        p.release(&b);
        assert_eq!(p.free(), 10);
        // The blank blocks went to the front, the cached ones stay.
        assert_eq!(p.blank_free(), 6);
        assert!(p.cached(1) && p.cached(2) && p.cached(10) && p.cached(11));
    }

    #[test]
    fn the_tail_of_a_finished_prefix_is_evicted_first() {
        let mut p = Pool::new(6, BS);
        let a = p.schedule(&chain(1, 5), 21);
        p.release(&a);
        // Free queue: blank, then 5, 4, 3, 2, 1 (tail first).
        let order: Vec<Option<u64>> = p.eviction_order().map(|(_, h)| h).collect();
        assert_eq!(order, [Some(5), Some(4), Some(3), Some(2), Some(1)]);
        // Three new blocks: the blank one, then 5 and 4.
        let b = p.schedule(&chain(100, 2), 9);
        assert_eq!(b.blocks.len(), 3);
        assert!(p.gone(5) && p.gone(4) && !p.gone(3));
        assert!(p.cached(1) && p.cached(3));
    }

    #[test]
    fn a_hit_is_touched_before_the_request_allocates() {
        let mut p = Pool::new(6, BS);
        let a = p.schedule(&chain(1, 5), 21);
        p.release(&a);
        // The same prefix again, longer: blocks 1..5 hit (touched), then 2
        // new blocks come from the blank one and ... nothing else is free
        // but the touched ones, so the model counts a shortfall rather than
        // evicting its own hit.
        let b = p.schedule(&chain(1, 6), 25);
        assert_eq!(b.blocks.len(), 6);
        assert_eq!(p.shortfalls, 1);
        assert!((1..=6).all(|h| p.cached(h)));
    }

    #[test]
    fn the_last_token_is_always_computed() {
        let mut p = Pool::new(8, BS);
        let a = p.schedule(&chain(1, 2), 8);
        p.release(&a);
        // A fully cached, block-aligned prompt hits one block and computes
        // the last again (a second copy of hash 2).
        let b = p.schedule(&chain(1, 2), 8);
        assert_eq!(p.copies(2).len(), 2);
        assert_eq!(p.copies(1).len(), 1);
        p.release(&b);
        assert_eq!(hit_cap(8, BS, 2), 1);
        assert_eq!(hit_cap(9, BS, 2), 2);
        assert_eq!(hit_cap(0, BS, 2), 0);
    }

    #[test]
    fn a_copy_in_use_is_not_evicted() {
        let mut p = Pool::new(4, BS);
        let a = p.schedule(&chain(1, 2), 9); // 3 blocks, in use
        let b = p.schedule(&chain(50, 0), 1); // 1 blank block
        p.release(&b);
        // Only one block is free (blank): a 2-block request falls short
        // rather than evict blocks 1 and 2, which are in use.
        let c = p.schedule(&[], 5);
        assert_eq!((c.blocks.len(), p.shortfalls), (1, 1));
        assert!(p.cached(1) && p.cached(2));
        p.release(&a);
    }
}

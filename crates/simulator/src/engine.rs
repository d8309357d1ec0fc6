//! A simulated engine replica: a prefix-aware LRU KV cache, a prefill queue
//! and the requests in flight.
//!
//! The cache keys blocks by their positional fingerprint. Touching a chain
//! refreshes it from the tail to the head, so a block is never older than its
//! descendants and LRU eviction always removes leaves first (vLLM frees a
//! finished request's blocks tail first for the same reason). The cached set
//! therefore stays prefix-closed: a request's cached blocks are a leading run
//! and its new blocks a suffix.

use crate::service_model::ServiceModel;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

/// An LRU cache of KV blocks keyed by prefix hash.
#[derive(Debug, Clone)]
pub struct BlockCache {
    capacity: usize,
    tick: u64,
    last_use: HashMap<u64, u64>,
    by_age: BTreeMap<u64, u64>,
}

impl BlockCache {
    /// A cache of at most `capacity` blocks (at least one).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            tick: 0,
            last_use: HashMap::new(),
            by_age: BTreeMap::new(),
        }
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.last_use.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.last_use.is_empty()
    }

    /// True when the block is cached.
    pub fn contains(&self, block: u64) -> bool {
        self.last_use.contains_key(&block)
    }

    /// Length of the leading run of `chain` that is cached.
    pub fn cached_prefix(&self, chain: &[u64]) -> usize {
        chain.iter().take_while(|b| self.contains(**b)).count()
    }

    /// Caches `chain` (refreshing blocks already held) and evicts the least
    /// recently used blocks beyond capacity. Returns the evicted blocks in
    /// eviction order.
    pub fn insert_chain(&mut self, chain: &[u64]) -> Vec<u64> {
        for &block in chain.iter().rev() {
            self.tick += 1;
            if let Some(old) = self.last_use.insert(block, self.tick) {
                self.by_age.remove(&old);
            }
            self.by_age.insert(self.tick, block);
        }
        let mut evicted = Vec::new();
        while self.last_use.len() > self.capacity {
            let Some((_, block)) = self.by_age.pop_first() else {
                break;
            };
            self.last_use.remove(&block);
            evicted.push(block);
        }
        evicted
    }
}

/// What happened when a request was placed on a replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Leading full blocks found in the cache.
    pub cached_blocks: usize,
    /// Prompt tokens served from the cache.
    pub cached_tokens: u32,
    /// Arrival to first token, µs.
    pub ttft_us: u64,
    /// When the prefill finished (and the blocks became visible to the
    /// engine's event stream), µs of simulated time.
    pub prefill_done_us: u64,
    /// Blocks evicted to make room, in order.
    pub evicted: Vec<u64>,
}

/// One simulated engine.
#[derive(Debug, Clone)]
pub struct Replica {
    cache: BlockCache,
    prefill_free_at_us: u64,
    in_flight: BinaryHeap<Reverse<u64>>,
    requests: u64,
}

impl Replica {
    /// An idle replica with an empty cache of `cache_blocks` blocks.
    pub fn new(cache_blocks: usize) -> Self {
        Self {
            cache: BlockCache::new(cache_blocks),
            prefill_free_at_us: 0,
            in_flight: BinaryHeap::new(),
            requests: 0,
        }
    }

    /// The KV cache.
    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    /// Requests placed here so far.
    pub fn requests(&self) -> u64 {
        self.requests
    }

    /// Requests queued or running (prefill or decode) at `now_us`.
    pub fn queue_depth(&mut self, now_us: u64) -> usize {
        while self.in_flight.peek().is_some_and(|Reverse(t)| *t <= now_us) {
            self.in_flight.pop();
        }
        self.in_flight.len()
    }

    /// Places a request arriving at `now_us` whose full blocks are `chain`.
    pub fn place(
        &mut self,
        now_us: u64,
        chain: &[u64],
        input_length: u32,
        output_length: u32,
        block_size: usize,
        model: &ServiceModel,
    ) -> Placement {
        let cached_blocks = self.cache.cached_prefix(chain);
        let cached_tokens = u32::try_from(cached_blocks * block_size)
            .unwrap_or(u32::MAX)
            .min(input_length);
        let start = now_us.max(self.prefill_free_at_us);
        let prefill_done_us = start + model.prefill_us(input_length - cached_tokens);
        self.prefill_free_at_us = prefill_done_us;
        self.in_flight
            .push(Reverse(prefill_done_us + model.decode_us(output_length)));
        self.requests += 1;
        // The blocks enter the local cache now: this replica is FIFO, so any
        // later request placed here starts after this prefill has finished.
        let evicted = self.cache.insert_chain(chain);
        Placement {
            cached_blocks,
            cached_tokens,
            ttft_us: prefill_done_us - now_us,
            prefill_done_us,
            evicted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_leaves_first_and_keeps_prefixes_closed() {
        let mut c = BlockCache::new(4);
        assert!(c.insert_chain(&[1, 2, 3]).is_empty());
        // [1, 4, 5] shares block 1; the oldest leaves (3, then 2) go.
        assert_eq!(c.insert_chain(&[1, 4, 5]), vec![3]);
        assert_eq!(c.cached_prefix(&[1, 2, 3]), 2);
        assert_eq!(c.insert_chain(&[1, 6]), vec![2]);
        assert_eq!(c.cached_prefix(&[1, 4, 5]), 3);
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn fifo_prefill_and_queue_depth() {
        let m = ServiceModel {
            prefill_overhead_us: 0.0,
            prefill_us_per_token: 1.0,
            decode_us_per_token: 10.0,
        };
        let mut r = Replica::new(100);
        let a = r.place(0, &[1, 2], 20, 3, 10, &m);
        assert_eq!((a.cached_tokens, a.ttft_us), (0, 20));
        // Arrives while the first prefill runs: waits 15 µs, then 5 uncached tokens.
        let b = r.place(5, &[1, 2, 3], 35, 1, 10, &m);
        assert_eq!((b.cached_blocks, b.cached_tokens, b.ttft_us), (2, 20, 30));
        assert_eq!(r.queue_depth(21), 2);
        assert_eq!(r.queue_depth(35), 1);
        assert_eq!(r.queue_depth(40), 0);
    }
}

//! One replica's model: what its engine holds in eviction order, and the
//! hinted requests that have not been seen to start.

use super::running::Running;
use inferencecache_foresight::{Ahead, FreeQueue, blocks_needed};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Most hinted requests kept waiting per replica (past this the oldest go).
const MAX_QUEUED: usize = 256;
/// A hinted request not seen to start by then is forgotten (it went
/// elsewhere, failed, or hit everything and stored nothing).
pub(crate) const MAX_QUEUED_AGE: Duration = Duration::from_secs(30);
/// A request hinted this recently may not have reached the engine when its
/// load was scraped (the report says when it arrived, not when the scrape
/// ran; the sidecar scrapes every second): a load report does not prune it.
pub(crate) const LOAD_GRACE: Duration = Duration::from_secs(1);
/// Blocks kept per replica beyond its capacity before the oldest are
/// forgotten (the engine can hold no more than its capacity; producers
/// whose reports say otherwise must not grow the model without bound).
const SLACK_BLOCKS: usize = 1024;

/// A held block: its hash and its place in the eviction order.
#[derive(Debug, Clone, Copy)]
struct Held {
    hash: u64,
    key: u64,
}

/// A hinted request not seen to start.
#[derive(Debug)]
struct Queued {
    chain: Vec<u64>,
    prompt_tokens: u64,
    at: Instant,
}

/// One replica's engine as the server sees it (see the module docs of
/// `foresight`).
#[derive(Debug, Default)]
pub(crate) struct Model {
    block_size: u32,
    /// Usable blocks; 0 = not known yet (the model is inert).
    capacity: usize,
    held: HashMap<u64, Held>,
    /// Held blocks in eviction order (key → hash).
    lru: BTreeMap<u64, u64>,
    next_key: u64,
    queued: VecDeque<Queued>,
    /// Requests running at the last load report, less the hinted ones
    /// not seen to start that it may have counted: each holds a block
    /// without a hash (its partial last block) that is not blank.
    running: usize,
    /// Requests started since that report's scrape.
    begun: Running,
    /// A hybrid model (its producer marked blocks a match may not end
    /// at): every KV-cache group draws on one pool, which this model does
    /// not follow, so it stays inert and claims are the index's.
    hybrid: bool,
}

impl Model {
    /// The engine's pool: `capacity_tokens` (vLLM `num_gpu_blocks` x block
    /// size, as the producer reports it) in blocks of `block_size`. True
    /// when the model just became active.
    pub(crate) fn set_pool(&mut self, capacity_tokens: u64, block_size: u32) -> bool {
        if self.hybrid || block_size == 0 || capacity_tokens < 2 * u64::from(block_size) {
            return false;
        }
        let blocks = capacity_tokens / u64::from(block_size);
        // vLLM keeps one null block out of `num_gpu_blocks`.
        let usable = usize::try_from(blocks - 1).unwrap_or(usize::MAX);
        let was = self.capacity;
        self.capacity = usable;
        self.block_size = block_size;
        was == 0
    }

    /// Whether the model knows the pool.
    pub(crate) fn active(&self) -> bool {
        self.capacity > 0
    }

    /// The replica serves a hybrid model: the model goes inert for good
    /// (its sliding-window groups take blocks from the same pool, freed
    /// and evicted in an order the full-attention chain does not show; a
    /// model of the chain alone predicted evictions the engine did not
    /// make). True when it just did.
    pub(crate) fn set_hybrid(&mut self) -> bool {
        if self.hybrid {
            return false;
        }
        self.hybrid = true;
        self.capacity = 0;
        self.held.clear();
        self.lru.clear();
        self.queued.clear();
        true
    }

    /// Blocks the engine stored, in report order: `(hash, depth)` where a
    /// deeper block (more tokens before it) of one prompt is freed, so
    /// evicted, before a shallower one. The oldest hinted request whose
    /// chain names a stored block has started, and (first come, first
    /// served) every request hinted before it: their blocks take the
    /// back of the eviction order, tail first, as vLLM frees them.
    pub(crate) fn stored(&mut self, blocks: &[(u64, u64)], now: Instant) {
        if blocks.is_empty() {
            return;
        }
        // Blocks of traffic the model did not see hinted: most recent,
        // deepest first.
        let max_depth = blocks.iter().map(|b| b.1).max().unwrap_or(0);
        let base = self.next_key;
        for &(h, depth) in blocks {
            self.touch(h, base + (max_depth - depth));
        }
        self.next_key = base + max_depth + 1;
        let started = blocks
            .iter()
            .filter_map(|(h, _)| self.queued.iter().position(|q| q.chain.contains(h)))
            .max();
        if let Some(last) = started {
            for q in self.queued.drain(..=last).collect::<Vec<_>>() {
                self.started(&q.chain);
                self.begun.started(now, self.aligned(q.prompt_tokens));
            }
        }
        self.bound();
    }

    /// Of the blocks just `stored` (before [`Self::stored`] applies them),
    /// those no hinted request waiting here ends with: stores this model
    /// cannot explain, so possibly a request hinted to another replica
    /// whose caller sent it here (a failed-open lookup).
    pub(crate) fn unexplained(&self, blocks: &[(u64, u64)]) -> Vec<u64> {
        blocks
            .iter()
            .map(|&(h, _)| h)
            .filter(|h| !self.queued.iter().any(|q| q.chain.last() == Some(h)))
            .collect()
    }

    /// Takes back the oldest hinted request still waiting here whose chain
    /// ends with `last`: another replica stored that block, so its caller
    /// sent it there (a phantom here otherwise: a request that never
    /// starts, shortening claims until a load report or its age drops it).
    pub(crate) fn retire(&mut self, last: u64) -> Option<Vec<u64>> {
        let i = self
            .queued
            .iter()
            .position(|q| q.chain.last() == Some(&last))?;
        self.queued.remove(i).map(|q| q.chain)
    }

    /// A request this model was not hinted for started here (its blocks
    /// were reported stored): what it hit moves to the back of the eviction
    /// order with them, as for a hinted one. Its prompt length is not
    /// known here, so no decode block is counted for it (`running.rs`).
    pub(crate) fn arrived(&mut self, chain: &[u64]) {
        self.started(chain);
        self.bound();
    }

    /// A request with `chain` started: what it holds of it moves to the
    /// back of the eviction order, tail first.
    fn started(&mut self, chain: &[u64]) {
        let n = chain.len() as u64;
        let base = self.next_key;
        for (i, &h) in chain.iter().enumerate() {
            if self.held.contains_key(&h) {
                self.touch(h, base + (n - 1 - i as u64));
            }
        }
        self.next_key = base + n;
    }

    fn touch(&mut self, hash: u64, key: u64) {
        if let Some(old) = self.held.insert(hash, Held { hash, key }) {
            self.lru.remove(&old.key);
        }
        self.lru.insert(key, hash);
    }

    /// Forgets the oldest blocks past the bound.
    fn bound(&mut self) {
        let limit = self.capacity.max(1).saturating_add(SLACK_BLOCKS);
        while self.held.len() > limit {
            let Some((_, h)) = self.lru.pop_first() else {
                break;
            };
            self.held.remove(&h);
        }
    }

    /// The engine removed `hash`.
    pub(crate) fn removed(&mut self, hash: u64) {
        if let Some(old) = self.held.remove(&hash) {
            self.lru.remove(&old.key);
        }
    }

    /// The engine cleared its cache (or restarted): nothing held, nothing
    /// known to be waiting.
    pub(crate) fn cleared(&mut self) {
        self.held.clear();
        self.lru.clear();
        self.begun.clear();
        self.queued.clear();
    }

    /// A hint named this replica for a request with `chain` and
    /// `prompt_tokens` (the caller sends it here next). False when the
    /// model is inert (nothing recorded).
    pub(crate) fn delivered(&mut self, chain: Vec<u64>, prompt_tokens: u64, now: Instant) -> bool {
        if !self.active() {
            return false;
        }
        self.expire(now);
        if self.queued.len() >= MAX_QUEUED {
            self.queued.pop_front();
        }
        self.queued.push_back(Queued {
            chain,
            prompt_tokens,
            at: now,
        });
        true
    }

    /// The engine's load as scraped just before `now`: `running` and
    /// `waiting` requests. Of the hinted requests not seen to start that
    /// the scrape could see (hinted more than [`LOAD_GRACE`] ago), at most
    /// `waiting` (the newest: first come, first served) can still be
    /// ahead. A running one has been scheduled, and vLLM allocates and
    /// stores a request's blocks when it schedules it, publishing both
    /// (with the evictions its allocation made) at the end of that step,
    /// before the step's stats: a running request never seen to start
    /// stored nothing (a full hit: its allocation is made), or it is not
    /// the hinted one, which went elsewhere or never came (a lookup its
    /// caller did not follow). Counted among the running, such a request
    /// stayed "ahead" for as long as other traffic kept the engine busy
    /// (`real_vllm`'s lookup-order step: its probes left one on the small
    /// cache, which then withheld a prompt's surviving blocks).
    pub(crate) fn load(&mut self, running: u32, waiting: u32, now: Instant) {
        self.expire(now);
        self.begun.reported(now, LOAD_GRACE);
        let visible = self
            .queued
            .iter()
            .filter(|q| now.saturating_duration_since(q.at) >= LOAD_GRACE)
            .count();
        // Those hinted too recently to be sure the scrape missed them may
        // be among its running (their partial block is then taken in the
        // dry run); requests hinted after the report cannot be.
        self.running = (running as usize).saturating_sub(self.queued.len() - visible);
        let keep = waiting as usize;
        for _ in 0..visible.saturating_sub(keep) {
            self.queued.pop_front();
        }
    }

    fn expire(&mut self, now: Instant) {
        while self
            .queued
            .front()
            .is_some_and(|q| now.saturating_duration_since(q.at) > MAX_QUEUED_AGE)
        {
            self.queued.pop_front();
        }
    }

    /// Whether the requests waiting could evict anything: they need more
    /// blocks (at most their whole prompts) than are blank.
    pub(crate) fn pressure(&self) -> bool {
        let decode = self.begun.pending();
        if !self.active() || (self.queued.is_empty() && decode == 0) || self.lru.is_empty() {
            return false;
        }
        let need: usize = self
            .queued
            .iter()
            .map(|q| blocks_needed(q.prompt_tokens, self.block_size).max(q.chain.len()))
            .sum();
        need + decode > self.blank()
    }

    /// Blank free blocks: what is not held, less a partial block per
    /// running request as last reported. Subtracting every waiting
    /// request from the report's running (as before session 48) counted a
    /// running request's partial block blank whenever one was hinted after
    /// the report: one of run B1's over-claims.
    fn blank(&self) -> usize {
        let partial = self.running;
        self.capacity
            .saturating_sub(self.held.len())
            .saturating_sub(partial)
    }

    /// Whether a `prompt_tokens`-token prompt fills its last block (its
    /// first generated token then takes a new block at the first decode step).
    fn aligned(&self, prompt_tokens: u64) -> bool {
        prompt_tokens > 0 && prompt_tokens % u64::from(self.block_size.max(1)) == 0
    }

    /// Of `claim` (leading blocks the index says the engine holds), how
    /// many survive the waiting requests' allocations.
    pub(crate) fn claimable(&self, claim: &[u64]) -> usize {
        if !self.active() {
            return claim.len();
        }
        // A block-aligned request started since the last report takes one
        // block at its first decode step: ahead of the queued ones.
        let decode = (0..self.begun.pending()).map(|_| Ahead {
            chain: &[],
            prompt_tokens: 1,
        });
        let ahead = decode.chain(self.queued.iter().map(|q| Ahead {
            chain: &q.chain,
            prompt_tokens: q.prompt_tokens,
        }));
        inferencecache_foresight::claimable(self, self.block_size, ahead, claim)
    }

    /// Hinted requests not seen to start (tests, status).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.queued.len()
    }
}

impl FreeQueue for Model {
    type Block = u64;

    fn blank_free(&self) -> usize {
        self.blank()
    }

    fn eviction_order(&self) -> impl Iterator<Item = u64> + '_ {
        self.lru.values().copied()
    }

    fn copies(&self, hash: u64) -> &[u64] {
        self.held
            .get(&hash)
            .map_or(&[], |h| std::slice::from_ref(&h.hash))
    }

    // Which blocks running requests use is not seen: every held block
    // counts as free (a hit on it protects it all the same).
    fn is_free(&self, _block: u64) -> bool {
        true
    }

    // What the engine removed the index no longer claims.
    fn gone(&self, _hash: u64) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u32 = 4;

    /// A replica of `blocks` usable blocks.
    fn replica(blocks: u64) -> Model {
        let mut m = Model::default();
        assert!(m.set_pool((blocks + 1) * u64::from(BS), BS));
        m
    }

    /// `n` blocks from hash `from`, with their depths.
    fn blocks(from: u64, n: u64) -> Vec<(u64, u64)> {
        (0..n).map(|i| (from + i, i)).collect()
    }

    fn chain(from: u64, n: u64) -> Vec<u64> {
        (from..from + n).collect()
    }

    /// A system prompt `sys` (8 blocks from hash 1) then a question of `q`
    /// blocks from `qbase`, plus one token.
    fn prompt(qbase: u64, q: u64) -> (Vec<u64>, u64) {
        let mut c = chain(1, 8);
        c.extend(qbase..qbase + q);
        (c, (8 + q) * u64::from(BS) + 1)
    }

    #[test]
    fn an_inert_model_keeps_every_claim() {
        let mut m = Model::default();
        m.stored(&blocks(1, 8), Instant::now());
        m.delivered(chain(100, 20), 81, Instant::now());
        assert!(!m.pressure());
        assert_eq!(m.claimable(&chain(1, 8)), 8);
    }

    #[test]
    fn a_hinted_request_that_evicts_the_prefix_tail_shortens_the_claim() {
        // 12 blocks: A (system prompt + 1 question block) is held, tail
        // first at the front of the eviction order after the 3 blank ones.
        let mut m = replica(12);
        m.stored(&blocks(1, 9), Instant::now());
        assert!(!m.pressure());
        // B, a fresh 5-block prompt (+1 token: 6 blocks), was hinted here
        // and has not started: 3 blank blocks, then 9, 8, 7.
        let now = Instant::now();
        m.delivered(chain(200, 5), 21, now);
        assert!(m.pressure());
        assert_eq!(m.claimable(&prompt(400, 1).0[..8]), 6);
        // B started (its blocks stored; the engine removed 9, 8, 7): the
        // index now claims 6 blocks, and nothing waits.
        for h in [9, 8, 7] {
            m.removed(h);
        }
        m.stored(&blocks(200, 5), Instant::now());
        assert_eq!(m.queued(), 0);
        assert!(!m.pressure());
        assert_eq!(m.claimable(&chain(1, 6)), 6);
    }

    #[test]
    fn a_hinted_request_sharing_the_prefix_protects_it() {
        let mut m = replica(12);
        m.stored(&blocks(1, 9), Instant::now());
        // B repeats the system prompt: it touches blocks 1..=8 before it
        // takes its 4 new blocks (3 blank, then 9).
        let b = prompt(500, 3);
        m.delivered(b.0, b.1, Instant::now());
        assert!(m.pressure());
        assert_eq!(m.claimable(&chain(1, 8)), 8);
    }

    #[test]
    fn recently_used_prefixes_are_evicted_last() {
        // 20 blocks: X (hashes 1..=8) then Y (101..=108) stored, then a
        // request on X started: Y is now the least recently used.
        // Seconds apart: each request ended before the next started.
        let mut m = replica(20);
        let t0 = Instant::now();
        let apart = Duration::from_secs(3);
        m.stored(&blocks(1, 8), t0);
        m.stored(&blocks(101, 8), t0 + apart);
        let now = t0 + apart * 2;
        let x = prompt(50, 1);
        m.delivered(x.0.clone(), x.1, now);
        m.stored(&[(50, 8)], now);
        assert_eq!(m.queued(), 0);
        // The engine's report once it has ended.
        let now = now + LOAD_GRACE + Duration::from_millis(10);
        m.load(0, 0, now);
        // A fresh 6-block prompt waits: 3 blank blocks, then Y's tail.
        m.delivered(chain(300, 5), 21, now);
        assert_eq!(m.claimable(&chain(101, 8)), 5);
        assert_eq!(m.claimable(&chain(1, 8)), 8);
    }

    #[test]
    fn a_start_also_starts_every_request_hinted_before_it() {
        let mut m = replica(64);
        let now = Instant::now();
        m.delivered(chain(100, 2), 9, now);
        m.delivered(chain(200, 2), 9, now);
        m.delivered(chain(300, 2), 9, now);
        m.stored(&blocks(200, 2), Instant::now());
        assert_eq!(m.queued(), 1);
        // Blocks nobody was hinted for start nothing.
        m.stored(&blocks(900, 2), Instant::now());
        assert_eq!(m.queued(), 1);
    }

    #[test]
    fn load_reports_and_age_forget_requests_that_ended_unseen() {
        let mut m = replica(64);
        let t0 = Instant::now();
        for i in 0..3 {
            m.delivered(chain(100 * (i + 1), 2), 9, t0);
        }
        // Hinted just now: the scrape may not have seen them.
        m.load(0, 0, t0 + Duration::from_millis(500));
        assert_eq!(m.queued(), 3);
        // One request waits in the engine: only the newest can be it.
        m.load(2, 1, t0 + LOAD_GRACE);
        assert_eq!(m.queued(), 1);
        m.delivered(
            chain(900, 2),
            9,
            t0 + MAX_QUEUED_AGE + Duration::from_secs(1),
        );
        assert_eq!(m.queued(), 1, "the old one expired");
    }

    #[test]
    fn a_running_request_not_seen_to_start_is_not_ahead() {
        // A lookup its caller never followed (a probe), then the engine
        // busy with traffic the server did not hint: one request runs at
        // every report, none waits. vLLM stores a request's blocks when it
        // schedules it, so the one running is not the hinted one: it no
        // longer shortens claims.
        let mut m = replica(12);
        let t0 = Instant::now();
        m.stored(&blocks(1, 9), Instant::now());
        m.delivered(chain(200, 5), 21, t0);
        assert_eq!(m.claimable(&chain(1, 8)), 6);
        m.load(1, 0, t0 + LOAD_GRACE / 2);
        assert_eq!(m.claimable(&chain(1, 8)), 6, "the scrape may predate it");
        m.stored(&blocks(300, 2), Instant::now());
        m.load(1, 0, t0 + LOAD_GRACE);
        assert_eq!(m.queued(), 0);
        assert!(!m.pressure());
        assert_eq!(m.claimable(&chain(1, 8)), 8);
    }

    #[test]
    fn running_requests_hold_a_partial_block_each() {
        // 12 blocks, 9 held: 3 blank, less the partial blocks of the 3
        // requests the load report says are running, one of which may be
        // B (hinted just before it; 6 blocks, waiting as far as the model
        // knows): B takes 1 blank block, then 9, 8, 7, 6, 5.
        let mut m = replica(12);
        let t0 = Instant::now();
        m.stored(&blocks(1, 9), t0);
        m.delivered(chain(200, 5), 21, t0);
        m.load(3, 0, t0);
        assert_eq!(m.claimable(&chain(1, 8)), 4);
        // One hinted after the report cannot be among its running: all 3
        // hold a partial block, and B pops 6.
        let mut m = replica(12);
        m.stored(&blocks(1, 9), t0);
        m.load(3, 0, t0);
        m.delivered(chain(200, 5), 21, t0);
        assert_eq!(m.claimable(&chain(1, 8)), 3);
    }

    #[test]
    fn a_request_stored_elsewhere_is_retired_by_its_last_block() {
        let mut a = replica(64);
        let now = Instant::now();
        a.delivered(chain(100, 3), 13, now);
        a.delivered(chain(200, 3), 13, now);
        // Replica B stores 100..103: nothing hinted to B ends with 102.
        let mut b = replica(64);
        assert_eq!(b.unexplained(&blocks(100, 3)), vec![100, 101, 102]);
        b.delivered(chain(300, 2), 9, now);
        assert_eq!(b.unexplained(&blocks(300, 2)), vec![300]);
        // A gives the request up (the one ending with 102, not the first
        // hinted nor the other), B counts it started.
        assert_eq!(a.retire(101), None);
        assert_eq!(a.retire(102), Some(chain(100, 3)));
        assert_eq!(a.queued(), 1);
        b.stored(&blocks(100, 3), Instant::now());
        b.arrived(&chain(100, 3));
        assert_eq!(b.queued(), 1, "B's own hinted request has not started");
    }

    #[test]
    fn a_block_aligned_request_takes_a_block_at_its_first_decode_step() {
        // 12 blocks: P (100..=103) held, then A (8 blocks of tokens exactly)
        // started and filled the pool. vLLM allocates A's first generated
        // token's block at its first decode step, evicting P's tail with
        // nothing queued.
        let mut m = replica(12);
        let t0 = Instant::now();
        m.load(0, 0, t0);
        m.stored(&blocks(100, 4), t0);
        m.delivered(chain(1, 8), 8 * u64::from(BS), t0);
        m.stored(&blocks(1, 8), t0 + Duration::from_millis(100));
        assert_eq!(m.queued(), 0);
        assert!(m.pressure());
        assert_eq!(m.claimable(&chain(100, 4)), 3);
        // A report scraped after A's start counts its block.
        m.load(1, 0, t0 + Duration::from_millis(1200));
        assert!(!m.pressure());
        assert_eq!(m.claimable(&chain(100, 4)), 4);
    }

    #[test]
    fn a_clear_forgets_everything() {
        let mut m = replica(12);
        m.stored(&blocks(1, 9), Instant::now());
        m.delivered(chain(200, 5), 21, Instant::now());
        m.cleared();
        assert!(!m.pressure());
        assert_eq!(m.queued(), 0);
        assert_eq!(m.claimable(&chain(1, 8)), 8);
    }

    #[test]
    fn the_model_is_bounded_by_the_capacity() {
        let mut m = replica(4);
        m.stored(&blocks(1, 5000), Instant::now());
        assert!(m.held.len() <= 4 + SLACK_BLOCKS);
        assert_eq!(m.held.len(), m.lru.len());
    }
}

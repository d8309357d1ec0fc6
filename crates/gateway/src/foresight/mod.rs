//! Eviction foresight: which of the blocks the index says an engine holds
//! will still be there when the engine gets to this request.
//!
//! The index is right about the moment of the lookup (up to the engine's
//! event lag), but a request is scheduled later: behind the requests the
//! gateway already sent that engine. Each of those allocates blocks for the
//! part of its prompt it does not find cached, from the front of vLLM's free
//! queue, and that front holds the least recently freed prefixes, tail block
//! first ([`inferencecache_foresight::pool`]). On a small cache under
//! concurrency those are exactly the last blocks of a prefix the index just
//! promised: the hint claims
//! them, the engine has evicted them by the time it schedules the request,
//! and reuses less (issue 33's "after the hint" over-claims).
//!
//! The gateway knows everything that decides it, for the traffic it routes:
//! what it sent each engine (block chains, prompt lengths), in which order,
//! when each was scheduled (its first output byte: the engine allocated it
//! by then) and when it finished (its blocks freed). So each engine keeps a
//! model of its block pool ([`Pool`], capacity read once from the
//! engine's `vllm:cache_config_info`), the requests dispatched and not yet
//! scheduled in dispatch order (vLLM schedules first come, first served),
//! and the scheduled ones' blocks. A claim is checked by a dry run (the
//! server's model shares it: [`inferencecache_foresight::claimable`]): the
//! queued requests touch their hits and pop their new blocks off the
//! model's free queue, in order; the claim ends at the first of its blocks
//! the dry run (or an allocation already applied) evicted. Blocks the model
//! never saw (traffic it did not route, a cache older than the gateway)
//! keep the index's word: the foresight only ever shortens a claim, and
//! only for blocks it watched come and go. An engine back from down is
//! forgotten ([`Foresight::reset`]): it may have restarted empty.
//!
//! Not modelled: decode blocks past the first generated token, chunked
//! prefills that interleave with later requests' scheduling, an engine that
//! waits for free blocks (the dry run stops popping when the model's free
//! queue runs dry), hybrid models' per-group pools (the capacity read
//! refuses them), and requests that reach the engine some other way. Each
//! makes the model miss an eviction (today's behaviour: the index's claim)
//! or, rarely, predict one that does not happen (a claim a block short).

use inferencecache_foresight::{Ahead, Allocation, Pool};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// Most requests kept queued per engine (a request that never got a byte
/// stays until its dispatch ends; past this the oldest are forgotten).
const MAX_QUEUED: usize = 4096;

/// One engine's foresight; inert until [`Foresight::start`].
#[derive(Debug, Default)]
pub struct Foresight {
    inner: Mutex<Option<Model>>,
}

#[derive(Debug)]
struct Model {
    pool: Pool,
    /// Dispatched, not known to be scheduled, in dispatch order.
    queued: VecDeque<Queued>,
    /// Scheduled and not finished: their blocks.
    running: HashMap<u64, Allocation>,
}

#[derive(Debug)]
struct Queued {
    owner: u64,
    chain: Vec<u64>,
    prompt_tokens: u64,
}

/// The engine's KV block pool as its `/metrics` describe it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvPool {
    /// Blocks requests can use (vLLM's `num_gpu_blocks` less its null block).
    pub usable_blocks: usize,
    /// Tokens per block.
    pub block_size: u32,
}

/// Reads the pool from a vLLM `/metrics` exposition
/// (`vllm:cache_config_info{num_gpu_blocks=..,block_size=..}`). `Err` says
/// why foresight cannot run: no such series (not vLLM, or too old), or a
/// hybrid model (its `kv_cache_size_tokens` is not blocks × block size:
/// several KV-cache groups share the pool, which this model does not
/// simulate).
pub fn kv_pool(metrics: &str) -> Result<KvPool, &'static str> {
    let (samples, _) = inferencecache_subscriber::stats::exposition::parse(metrics);
    let info = samples
        .iter()
        .find(|s| s.name == "vllm:cache_config_info")
        .ok_or("no vllm:cache_config_info series")?;
    let num = |k: &str| info.label(k).and_then(|v| v.parse::<u64>().ok());
    let blocks = num("num_gpu_blocks").ok_or("no num_gpu_blocks label")?;
    let block_size = num("block_size").ok_or("no block_size label")?;
    if let Some(tokens) = num("kv_cache_size_tokens") {
        if tokens != blocks.saturating_mul(block_size) {
            return Err("a hybrid model (several KV-cache groups share the pool)");
        }
    }
    if blocks < 2 || block_size == 0 {
        return Err("an empty pool");
    }
    Ok(KvPool {
        usable_blocks: usize::try_from(blocks - 1).map_err(|_| "a pool too large")?,
        block_size: u32::try_from(block_size).map_err(|_| "a block size too large")?,
    })
}

impl Foresight {
    /// Starts modelling an engine whose pool is `p` (all blank: what the
    /// gateway has not seen is not claimed away).
    pub fn start(&self, p: KvPool) {
        if let Ok(mut g) = self.inner.lock() {
            *g = Some(Model {
                pool: Pool::new(p.usable_blocks, p.block_size),
                queued: VecDeque::new(),
                running: HashMap::new(),
            });
        }
    }

    /// Forgets what the model knew (the engine came back after being down
    /// and may have restarted): an empty pool of the same size.
    pub fn reset(&self) {
        if let Ok(mut g) = self.inner.lock() {
            if let Some(m) = g.as_mut() {
                m.pool = Pool::new(m.pool.capacity(), m.pool.block_size());
                m.queued.clear();
                m.running.clear();
            }
        }
    }

    /// The pool's size in tokens (blocks × block size), when the engine is
    /// modelled.
    pub fn capacity_tokens(&self) -> Option<u64> {
        let g = self.inner.lock().ok()?;
        let m = g.as_ref()?;
        let blocks = u64::try_from(m.pool.capacity()).ok()?;
        Some(blocks.saturating_mul(u64::from(m.pool.block_size())))
    }

    /// Whether the engine is modelled.
    pub fn active(&self) -> bool {
        self.inner.lock().is_ok_and(|g| g.is_some())
    }

    /// Request `owner` (a `prompt_tokens`-token prompt whose whole blocks
    /// are `chain`) was sent to the engine.
    pub fn dispatched(&self, owner: u64, chain: &[u64], prompt_tokens: u64) {
        let Ok(mut g) = self.inner.lock() else { return };
        let Some(m) = g.as_mut() else { return };
        if m.queued.len() >= MAX_QUEUED {
            m.queued.pop_front();
        }
        m.queued.push_back(Queued {
            owner,
            chain: chain.to_vec(),
            prompt_tokens,
        });
    }

    /// `owner` produced its first byte: the engine scheduled it, and
    /// (first come, first served) everything sent before it.
    pub fn scheduled(&self, owner: u64) {
        let Ok(mut g) = self.inner.lock() else { return };
        let Some(m) = g.as_mut() else { return };
        if !m.queued.iter().any(|q| q.owner == owner) {
            return;
        }
        while let Some(q) = m.queued.pop_front() {
            let a = m.pool.schedule(&q.chain, q.prompt_tokens);
            m.running.insert(q.owner, a);
            if q.owner == owner {
                break;
            }
        }
    }

    /// `owner`'s request ended: its blocks are freed (tail first), or, if
    /// it never got a byte, it is forgotten (it may never have been
    /// scheduled).
    pub fn finished(&self, owner: u64) {
        let Ok(mut g) = self.inner.lock() else { return };
        let Some(m) = g.as_mut() else { return };
        if let Some(a) = m.running.remove(&owner) {
            m.pool.release(&a);
        } else if let Some(i) = m.queued.iter().position(|q| q.owner == owner) {
            m.queued.remove(i);
        }
    }

    /// Of the first `claimed` blocks of `chain` (what the index or the
    /// gateway's pending record says the engine holds), how many it will
    /// still hold when it schedules a request sent now. `claimed` itself
    /// when the engine is not modelled.
    pub fn claimable(&self, chain: &[u64], claimed: usize) -> usize {
        let claimed = claimed.min(chain.len());
        if claimed == 0 {
            return claimed;
        }
        let Ok(g) = self.inner.lock() else {
            return claimed;
        };
        let Some(m) = g.as_ref() else { return claimed };
        m.claimable(&chain[..claimed])
    }

    /// Requests dispatched and not yet scheduled, as modelled (tests, status).
    pub fn queued(&self) -> usize {
        self.inner
            .lock()
            .ok()
            .and_then(|g| g.as_ref().map(|m| m.queued.len()))
            .unwrap_or(0)
    }
}

impl Model {
    /// The dry run (see the module docs): how many leading blocks of
    /// `claim` survive the queued requests' allocations.
    fn claimable(&self, claim: &[u64]) -> usize {
        let ahead = self.queued.iter().map(|q| Ahead {
            chain: &q.chain,
            prompt_tokens: q.prompt_tokens,
        });
        inferencecache_foresight::claimable(&self.pool, self.pool.block_size(), ahead, claim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BS: u32 = 4;

    fn engine(blocks: usize) -> Foresight {
        let f = Foresight::default();
        f.start(KvPool {
            usable_blocks: blocks,
            block_size: BS,
        });
        f
    }

    /// A prompt: a system prompt of `sys` blocks (hashes `base..`) and a
    /// question of `q` blocks of its own (hashes `qbase..`), plus 1 token.
    fn prompt(base: u64, sys: u64, qbase: u64, q: u64) -> (Vec<u64>, u64) {
        let mut c: Vec<u64> = (base..base + sys).collect();
        c.extend(qbase..qbase + q);
        let tokens = (sys + q) * u64::from(BS) + 1;
        (c, tokens)
    }

    /// Runs one request to completion.
    fn run(f: &Foresight, owner: u64, p: &(Vec<u64>, u64)) {
        f.dispatched(owner, &p.0, p.1);
        f.scheduled(owner);
        f.finished(owner);
    }

    #[test]
    fn an_inert_engine_keeps_every_claim() {
        let f = Foresight::default();
        assert!(!f.active());
        f.dispatched(1, &[1, 2, 3], 13);
        assert_eq!(f.claimable(&[1, 2, 3], 3), 3);
        assert_eq!(f.claimable(&[1, 2, 3], 9), 3, "never past the chain");
    }

    #[test]
    fn a_queued_request_that_evicts_the_prefix_tail_shortens_the_claim() {
        // 12 blocks. A (system prompt 1..=8 + question) ran and finished:
        // free queue = blank x3, then A's question block, 8, 7, ... 1.
        let f = engine(12);
        let a = prompt(1, 8, 100, 1);
        run(&f, 1, &a);
        // B, a new prompt of 5 blocks (+ partial), was sent and is not
        // scheduled yet: it will take the 3 blank blocks, A's question
        // block and blocks 8 and 7.
        let b = prompt(200, 5, 300, 0);
        f.dispatched(2, &b.0, b.1);
        // C repeats A's system prompt: the index says 8 blocks are held,
        // but by the time C is scheduled blocks 7 and 8 are gone.
        let c = prompt(1, 8, 400, 1);
        assert_eq!(f.claimable(&c.0, 8), 6);
        // Without B in front, all 8 survive.
        f.finished(2);
        assert_eq!(f.claimable(&c.0, 8), 8);
    }

    #[test]
    fn a_queued_request_sharing_the_prefix_protects_it() {
        let f = engine(12);
        let a = prompt(1, 8, 100, 1);
        run(&f, 1, &a);
        // B repeats the system prompt first: it touches blocks 1..=8 before
        // it allocates its 4 new ones (3 blank, then A's question block,
        // not 8), so they are safe for C too.
        let b = prompt(1, 8, 500, 3);
        f.dispatched(2, &b.0, b.1);
        let c = prompt(1, 8, 400, 1);
        assert_eq!(f.claimable(&c.0, 8), 8);
    }

    #[test]
    fn an_applied_eviction_the_index_has_not_heard_of_shortens_the_claim() {
        let f = engine(12);
        let a = prompt(1, 8, 100, 1);
        run(&f, 1, &a);
        // B was scheduled (its first byte came) and is still running: its
        // allocation evicted 8 and 7, whatever the index says.
        let b = prompt(200, 5, 300, 0);
        f.dispatched(2, &b.0, b.1);
        f.scheduled(2);
        let c = prompt(1, 8, 400, 1);
        assert_eq!(f.claimable(&c.0, 8), 6);
        // Once B finishes its blocks go to the back; 7 and 8 stay gone
        // until a request stores them again.
        f.finished(2);
        assert_eq!(f.claimable(&c.0, 8), 6);
        run(&f, 3, &c);
        assert_eq!(f.claimable(&c.0, 8), 8);
    }

    #[test]
    fn blocks_the_model_never_saw_keep_the_index_claim() {
        let f = engine(12);
        let b = prompt(200, 4, 300, 0);
        f.dispatched(2, &b.0, b.1);
        // The engine held 1..=8 before the gateway started: unknown here.
        let c = prompt(1, 8, 400, 1);
        assert_eq!(f.claimable(&c.0, 8), 8);
    }

    #[test]
    fn a_request_that_never_got_a_byte_is_forgotten() {
        let f = engine(12);
        let a = prompt(1, 8, 100, 1);
        run(&f, 1, &a);
        let b = prompt(200, 4, 300, 0);
        f.dispatched(2, &b.0, b.1);
        assert_eq!(f.queued(), 1);
        f.finished(2);
        assert_eq!(f.queued(), 0);
        let c = prompt(1, 8, 400, 1);
        assert_eq!(f.claimable(&c.0, 8), 8);
    }

    #[test]
    fn a_reset_forgets_what_the_model_saw() {
        let f = engine(12);
        let a = prompt(1, 8, 100, 1);
        run(&f, 1, &a);
        let b = prompt(200, 5, 300, 0);
        f.dispatched(2, &b.0, b.1);
        f.scheduled(2);
        let c = prompt(1, 8, 400, 1);
        assert_eq!(f.claimable(&c.0, 8), 6);
        // The engine came back from down: the index's word again.
        f.reset();
        assert!(f.active());
        assert_eq!(f.claimable(&c.0, 8), 8);
        // B's end, from before the reset, is ignored.
        f.finished(2);
        assert_eq!(f.queued(), 0);
    }

    #[test]
    fn a_first_byte_schedules_everything_sent_before_it() {
        let f = engine(64);
        for owner in 1..=3 {
            let p = prompt(owner * 100, 2, owner * 1000, 0);
            f.dispatched(owner, &p.0, p.1);
        }
        f.scheduled(2);
        assert_eq!(f.queued(), 1);
        // An unknown owner changes nothing.
        f.scheduled(99);
        assert_eq!(f.queued(), 1);
    }

    #[test]
    fn the_pool_is_read_from_vllm_metrics() {
        let info = "# TYPE vllm:cache_config_info gauge\n\
            vllm:cache_config_info{block_size=\"32\",enable_prefix_caching=\"True\",num_gpu_blocks=\"256\"} 1.0\n";
        assert_eq!(
            kv_pool(info),
            Ok(KvPool {
                usable_blocks: 255,
                block_size: 32
            })
        );
        let hybrid = "vllm:cache_config_info{block_size=\"32\",kv_cache_size_tokens=\"4000\",num_gpu_blocks=\"256\"} 1.0\n";
        assert!(kv_pool(hybrid).is_err());
        let same = "vllm:cache_config_info{block_size=\"32\",kv_cache_size_tokens=\"8192\",num_gpu_blocks=\"256\"} 1.0\n";
        assert!(kv_pool(same).is_ok());
        assert!(kv_pool("sglang:max_total_num_tokens 65536\n").is_err());
    }
}

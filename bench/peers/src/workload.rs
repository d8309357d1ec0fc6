//! Trace loading and the deterministic op stream (N replicas, per-replica LRU
//! block caches, load-aware routing).

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};

#[derive(serde::Deserialize)]
struct Line {
    timestamp: u64,
    #[allow(dead_code)]
    input_length: u64,
    output_length: u64,
    hash_ids: Vec<u64>,
}

pub struct Req {
    pub ts_ms: u64,
    pub output_len: u64,
    /// Trace hash ids, offset per trace copy.
    pub ids: Vec<u64>,
}

/// One request's block chain in every hash form the indexes want.
pub struct Chain {
    /// Position-independent per-block hash (kv-index `ContentHash`,
    /// dynamo `LocalBlockHash`): a mix of the trace hash id.
    pub content: Vec<u64>,
    /// Positional chain hash: identifies the whole prefix up to the block
    /// (kv-index `SequenceHash`, dynamo `ExternalSequenceBlockHash`, and, as
    /// 8 big-endian bytes, our `block_hashes`).
    pub seq: Vec<u64>,
    /// The request's trace time, ms (the default path's clock).
    pub ts_ms: u64,
}

pub enum Op {
    /// Blocks `start..start+len` of request `req`'s chain stored by `replica`
    /// (parent = block `start - 1`, or none at 0).
    Store {
        replica: u32,
        req: usize,
        start: usize,
        len: usize,
    },
    /// Blocks (positional hashes) evicted by `replica`, deepest first.
    Remove { replica: u32, seqs: Vec<u64> },
    /// Routing lookup of request `req`'s whole chain; `expected` is the
    /// generator's ground truth: (replica, matched leading blocks) for every
    /// replica with at least one, sorted by replica.
    Lookup {
        req: usize,
        expected: Vec<(u32, u32)>,
    },
}

pub struct Workload {
    pub chains: Vec<Chain>,
    pub ops: Vec<Op>,
    pub replicas: usize,
    pub requests: usize,
    pub lookups: usize,
    pub stored_blocks: u64,
    pub removed_blocks: u64,
    pub block_events: u64,
    pub request_blocks: u64,
    pub hit_blocks: u64,
    pub final_entries: u64,
    pub peak_entries: u64,
    /// Positional hashes each replica holds at the end of the stream.
    pub final_held: Vec<std::collections::HashSet<u64>>,
}

impl Workload {
    /// Ground truth at the end of the stream for request `req`'s chain.
    pub fn final_expected(&self, req: usize) -> Vec<(u32, u32)> {
        let seq = &self.chains[req].seq;
        self.final_held
            .iter()
            .enumerate()
            .filter_map(|(r, held)| {
                let m = seq.iter().take_while(|s| held.contains(s)).count() as u32;
                (m > 0).then_some((r as u32, m))
            })
            .collect()
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Parse the trace, duplicate it `scale` times with hash ids offset per copy,
/// and interleave the copies by timestamp (stable: copy 0 first at equal
/// timestamps). `limit` > 0 keeps only the first `limit` original requests.
pub fn load_trace(path: &str, scale: usize, limit: usize) -> Vec<Req> {
    let f = std::fs::File::open(path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    let mut base = Vec::new();
    for line in BufReader::new(f).lines() {
        let line = line.expect("read trace");
        if line.trim().is_empty() {
            continue;
        }
        let l: Line = serde_json::from_str(&line).expect("trace line");
        base.push(l);
        if limit > 0 && base.len() >= limit {
            break;
        }
    }
    let span = base
        .iter()
        .flat_map(|l| l.hash_ids.iter().copied())
        .max()
        .unwrap_or(0)
        + 1;
    let mut out = Vec::with_capacity(base.len() * scale);
    for l in &base {
        for c in 0..scale as u64 {
            out.push(Req {
                ts_ms: l.timestamp,
                output_len: l.output_length,
                ids: l.hash_ids.iter().map(|&h| h + c * span).collect(),
            });
        }
    }
    // Already ordered: the trace is sorted by timestamp and copies of one line
    // are adjacent. Sort stably anyway in case a trace is not.
    out.sort_by_key(|r| r.ts_ms);
    out
}

struct Replica {
    /// positional hash -> LRU tick
    held: HashMap<u64, u64>,
    /// LRU tick -> positional hash
    lru: BTreeMap<u64, u64>,
    load: f64,
}

/// Half-life of a replica's outstanding-token load.
const LOAD_HALF_LIFE_MS: f64 = 10_000.0;
pub const BLOCK_TOKENS: u64 = 512;

/// Build the op stream. Per request, in trace order:
/// 1. `Lookup` of the whole chain (ground truth per replica = leading blocks held);
/// 2. route: minimise `(uncached blocks * 512) + load` over replicas (ties: lowest id),
///    where load is an outstanding-token counter (prefill + output tokens added per
///    routed request, halving every 10 s of trace time);
/// 3. on the chosen replica: touch the held prefix, evict LRU victims to make room
///    (`Remove`, one batch), store the missing suffix (`Store`, one batch).
///
/// Blocks of a request are touched deepest first, so a block is always more
/// recently used than its descendants and LRU eviction only ever removes a leaf
/// of the replica's cached tree: a replica's holdings stay prefix-closed (no holes).
pub fn generate(reqs: &[Req], replicas: usize, cache_blocks: usize) -> Workload {
    let mut reps: Vec<Replica> = (0..replicas)
        .map(|_| Replica {
            held: HashMap::new(),
            lru: BTreeMap::new(),
            load: 0.0,
        })
        .collect();
    let mut chains = Vec::with_capacity(reqs.len());
    let mut ops = Vec::with_capacity(reqs.len() * 3);
    let mut tick = 0u64;
    let mut last_ts = 0u64;
    let (mut stored, mut removed, mut lookups) = (0u64, 0u64, 0usize);
    let (mut req_blocks, mut hit_blocks) = (0u64, 0u64);
    let (mut entries, mut peak) = (0u64, 0u64);
    for (ri, r) in reqs.iter().enumerate() {
        let n = r.ids.len().min(cache_blocks);
        let content: Vec<u64> = r.ids[..n].iter().map(|&h| splitmix64(h)).collect();
        let mut seq = Vec::with_capacity(n);
        for (i, &c) in content.iter().enumerate() {
            seq.push(if i == 0 {
                c
            } else {
                kv_index::chain_prefix_hash(
                    kv_index::SequenceHash(seq[i - 1]),
                    kv_index::ContentHash(c),
                )
                .0
            });
        }
        chains.push(Chain {
            content,
            seq,
            ts_ms: r.ts_ms,
        });
        if n == 0 {
            continue;
        }
        let seq = &chains[ri].seq;
        // 1. lookup with ground truth
        let matched: Vec<u32> = reps
            .iter()
            .map(|rep| seq.iter().take_while(|s| rep.held.contains_key(s)).count() as u32)
            .collect();
        let expected: Vec<(u32, u32)> = matched
            .iter()
            .enumerate()
            .filter(|(_, m)| **m > 0)
            .map(|(i, m)| (i as u32, *m))
            .collect();
        ops.push(Op::Lookup { req: ri, expected });
        lookups += 1;
        // 2. route
        let dt = r.ts_ms.saturating_sub(last_ts) as f64;
        last_ts = last_ts.max(r.ts_ms);
        let decay = 0.5f64.powf(dt / LOAD_HALF_LIFE_MS);
        let mut best = 0usize;
        let mut best_cost = f64::INFINITY;
        for (i, rep) in reps.iter_mut().enumerate() {
            rep.load *= decay;
            let cost = ((n as u64 - matched[i] as u64) * BLOCK_TOKENS) as f64 + rep.load;
            if cost < best_cost {
                best_cost = cost;
                best = i;
            }
        }
        let m = matched[best] as usize;
        req_blocks += n as u64;
        hit_blocks += m as u64;
        let rep = &mut reps[best];
        rep.load += ((n - m) as u64 * BLOCK_TOKENS + r.output_len) as f64;
        // 3a. take the held prefix out of the LRU order (re-inserted below)
        for s in &seq[..m] {
            let t = rep.held[s];
            rep.lru.remove(&t);
        }
        // 3b. evict victims for the new blocks (never the request's own prefix)
        let need = (rep.held.len() + (n - m)).saturating_sub(cache_blocks);
        if need > 0 {
            let mut victims = Vec::with_capacity(need);
            for _ in 0..need {
                let (_, v) = rep.lru.pop_first().expect("lru victim");
                rep.held.remove(&v);
                victims.push(v);
            }
            removed += need as u64;
            entries -= need as u64;
            ops.push(Op::Remove {
                replica: best as u32,
                seqs: victims,
            });
        }
        // 3c. touch / insert deepest first
        for s in seq[..n].iter().rev() {
            tick += 1;
            rep.held.insert(*s, tick);
            rep.lru.insert(tick, *s);
        }
        if n > m {
            stored += (n - m) as u64;
            entries += (n - m) as u64;
            peak = peak.max(entries);
            ops.push(Op::Store {
                replica: best as u32,
                req: ri,
                start: m,
                len: n - m,
            });
        }
    }
    Workload {
        chains,
        ops,
        replicas,
        requests: reqs.len(),
        lookups,
        stored_blocks: stored,
        removed_blocks: removed,
        block_events: stored + removed,
        request_blocks: req_blocks,
        hit_blocks,
        final_entries: entries,
        peak_entries: peak,
        final_held: reps
            .into_iter()
            .map(|r| r.held.into_keys().collect())
            .collect(),
    }
}

//! The three indexes behind one small trait. Every index gets its events in
//! its own native form, built before the timed replay (`prepare`), so the
//! timings cover the index calls only; lookups time only the index call
//! (result conversion to (replica, blocks) pairs happens after the clock stops).

use crate::workload::{BLOCK_TOKENS, Op, Workload};
use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub const OURS: &str = "ours (inferencecache-index)";
pub const OURS_CONTRACT: &str = "ours contract path (lookup_route)";
pub const OURS_DEFAULT: &str = "ours default path (route_ttft + record_delivery)";
pub const KVI: &str = "kv-index 2.0.0 ChainIndex";
pub const DYN: &str = "dynamo-kv-router 1.6.1 RadixTree";
pub const ARENA: &str = "arena alone (ours, src/arena, no index around it)";

pub trait Writer {
    fn apply(&mut self, i: usize, op: &Op);
}

pub trait Reader {
    /// Look request `req` up (op index `i`); push (replica, matched blocks) for
    /// every replica with at least one block; return the index call's ns.
    fn lookup(&self, i: usize, req: usize, out: &mut Vec<(u32, u32)>) -> u64;
}

pub type Split<'a> = (Box<dyn Writer + 'a>, Box<dyn Reader + Sync + 'a>);

pub trait Engine {
    fn name(&self) -> &'static str;
    /// Build the native events and queries for `w` (not timed).
    fn prepare(&mut self, w: &Workload);
    /// Apply prepared op `i` (a store or a remove).
    fn apply(&mut self, i: usize, op: &Op);
    /// Convert `op` and apply it at once (memory pass: nothing prepared stays alive).
    fn apply_unprepared(&mut self, op: &Op, w: &Workload);
    fn lookup(&self, i: usize, req: usize, out: &mut Vec<(u32, u32)>) -> u64;
    /// Apply errors reported by the index.
    fn errors(&self) -> u64;
    /// A writer and a concurrent reader, or `None` if the index cannot be shared.
    fn split(&mut self) -> Option<Split<'_>>;
    /// Whether lookups answer "leading blocks per replica" (compared with
    /// the ground truth); the default path answers a pick instead.
    fn checked(&self) -> bool {
        true
    }
}

// ---------------------------------------------------------------- ours

const TENANT: &str = "t";
const MODEL: &str = "m";
const SCHEME: &str = "s";
/// Fixed clock: every entry is stamped "now" and never ages.
const NOW_NS: i64 = 1_700_000_000_000_000_000;

use inferencecache_index as ic;

/// Which of our lookup paths a row measures.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// `Index::lookup`: the probe the peers compare with (no classifier).
    Probe,
    /// `Index::lookup_route`: the contract ranking (`--ranking contract`).
    Contract,
    /// `Index::route_ttft` + `Index::record_delivery` of its pick: what
    /// `serve` does per lookup on defaults. The clock follows the trace's
    /// timestamps (queued work drains, tentative holdings expire).
    Default,
}

pub struct Ours {
    path: Path,
    clock: Arc<ic::ManualClock>,
    /// Per op: the trace time of its request, ns (the default path's clock).
    op_ns: Vec<i64>,
    /// Per request: the affinity seed `serve` passes (the chain seed).
    seeds: Vec<Vec<u8>>,
    /// Trace time of the next sweep, ns: `serve` sweeps every 60 s
    /// (expired tentative holdings go), untimed here as there.
    next_sweep: std::cell::Cell<i64>,
    idx: ic::Index,
    names: Vec<String>,
    ups: Vec<Option<ic::CacheUpdate>>,
    evs: Vec<Vec<ic::CacheEvent>>,
    /// per request: 8-byte big-endian positional hashes
    q: Vec<Vec<[u8; 8]>>,
    counts: Vec<i32>,
}

impl Ours {
    /// Our index, measured on `path`.
    pub fn new(path: Path) -> Self {
        let clock = Arc::new(ic::ManualClock::new(NOW_NS));
        let idx = ic::IndexConfig::new()
            .max_entries(0)
            // The default path's clock moves with the trace (an hour):
            // nothing may expire under it for the rows to share one stream.
            .default_ttl(std::time::Duration::from_secs(86_400))
            .clock(clock.clone())
            .build();
        Self {
            path,
            clock,
            op_ns: Vec::new(),
            seeds: Vec::new(),
            next_sweep: std::cell::Cell::new(NOW_NS + SWEEP_NS),
            idx,
            names: Vec::new(),
            ups: Vec::new(),
            evs: Vec::new(),
            q: Vec::new(),
            counts: Vec::new(),
        }
    }

    fn name_of(&mut self, r: u32) -> String {
        while self.names.len() <= r as usize {
            let n = self.names.len();
            self.names.push(format!("r{n}"));
        }
        self.names[r as usize].clone()
    }

    fn convert(&mut self, op: &Op, w: &Workload) -> (Option<ic::CacheUpdate>, Vec<ic::CacheEvent>) {
        match op {
            Op::Store {
                replica,
                req,
                start,
                len,
            } => {
                let seq = &w.chains[*req].seq[*start..*start + *len];
                let up = ic::CacheUpdate {
                    replica_id: self.name_of(*replica),
                    model_id: MODEL.into(),
                    tenant_id: TENANT.into(),
                    hash_scheme: SCHEME.into(),
                    prefixes: vec![ic::PrefixEntry {
                        block_hashes: seq.iter().map(|s| s.to_be_bytes().to_vec()).collect(),
                        block_token_counts: vec![BLOCK_TOKENS as i32; seq.len()],
                        ..ic::PrefixEntry::default()
                    }],
                    ..ic::CacheUpdate::default()
                };
                (Some(up), Vec::new())
            }
            Op::Remove { replica, seqs } => {
                let name = self.name_of(*replica);
                let evs = seqs
                    .iter()
                    .map(|s| ic::CacheEvent {
                        kind: ic::EventKind::PrefixEvicted,
                        replica_id: name.clone(),
                        model_id: MODEL.into(),
                        tenant_id: TENANT.into(),
                        prefix_hash: s.to_be_bytes().to_vec(),
                        timestamp_us: 0,
                        adapter_id: String::new(),
                    })
                    .collect();
                (None, evs)
            }
            Op::Lookup { .. } => (None, Vec::new()),
        }
    }
}

/// One op = one batch: a store (one update) or a removal burst (one
/// `PrefixEvicted` per block, applied together).
fn ours_apply(idx: &ic::Index, up: Option<&ic::CacheUpdate>, evs: &[ic::CacheEvent]) {
    idx.apply_batch(
        up.into_iter()
            .map(ic::BatchWrite::Store)
            .chain(evs.iter().map(ic::BatchWrite::Event)),
    );
}

/// A digest of every default-path answer (pick, delivery, scores), summed
/// over the run: two builds that answer alike print the same digest
/// (`main.rs`), which is how a change to the path is checked to keep its
/// answers (the path's picks have no ground truth to compare with).
pub static DEFAULT_ANSWERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn note_answer(route: &ic::TtftRoute) {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::mem::discriminant(&route.result.strategy).hash(&mut h);
    route.pick.as_deref().hash(&mut h);
    if let Some(d) = &route.delivery {
        (&*d.replica_id, d.work_us.to_bits(), d.real_blocks).hash(&mut h);
    }
    for s in &route.result.scores {
        (&*s.replica_id, s.score.to_bits(), s.matched_tokens).hash(&mut h);
        (s.estimated_cache_hit_prob.to_bits(), s.tier).hash(&mut h);
    }
    DEFAULT_ANSWERS.fetch_add(h.finish(), std::sync::atomic::Ordering::Relaxed);
}

fn ours_lookup(
    idx: &ic::Index,
    path: Path,
    q: &[[u8; 8]],
    counts: &[i32],
    seed: &[u8],
    out: &mut Vec<(u32, u32)>,
) -> u64 {
    let req = ic::LookupRequest::new(TENANT, MODEL, SCHEME).chain(q, &counts[..q.len()]);
    let t = Instant::now();
    let res = match path {
        Path::Probe => idx.lookup(&req),
        Path::Contract => idx.lookup_route(&req),
        Path::Default => {
            let params = ic::RouteParams {
                weights: ic::TtftWeights::default(),
                min_matched_tokens: 0,
                ignore_matches: false,
                seed,
            };
            let route = idx.route_ttft(&req, &params);
            if let Some(d) = &route.delivery {
                idx.record_delivery(&req, d, params.weights.tentative_ttl);
            }
            let ns = t.elapsed().as_nanos() as u64;
            note_answer(&route);
            for s in &route.result.scores {
                let r: u32 = s.replica_id[1..].parse().expect("replica name");
                out.push((r, (s.matched_tokens as u64 / BLOCK_TOKENS) as u32));
            }
            return ns;
        }
    };
    let ns = t.elapsed().as_nanos() as u64;
    for s in &res.scores {
        let r: u32 = s.replica_id[1..].parse().expect("replica name");
        out.push((r, (s.matched_tokens as u64 / BLOCK_TOKENS) as u32));
    }
    ns
}

struct OursWriter<'a> {
    idx: &'a ic::Index,
    clock: &'a ic::ManualClock,
    op_ns: &'a [i64],
    ups: &'a [Option<ic::CacheUpdate>],
    evs: &'a [Vec<ic::CacheEvent>],
}
impl Writer for OursWriter<'_> {
    fn apply(&mut self, i: usize, _op: &Op) {
        // The writer alone moves the clock (the reader looks up older requests).
        if let Some(&ns) = self.op_ns.get(i) {
            self.clock.set_ns(ns);
        }
        ours_apply(self.idx, self.ups[i].as_ref(), &self.evs[i]);
    }
}
struct OursReader<'a> {
    idx: &'a ic::Index,
    path: Path,
    seeds: &'a [Vec<u8>],
    q: &'a [Vec<[u8; 8]>],
    counts: &'a [i32],
}
impl Reader for OursReader<'_> {
    fn lookup(&self, _i: usize, req: usize, out: &mut Vec<(u32, u32)>) -> u64 {
        ours_lookup(
            self.idx,
            self.path,
            &self.q[req],
            self.counts,
            &self.seeds[req],
            out,
        )
    }
}

/// `serve`'s sweep interval (`DEFAULT_SWEEP_INTERVAL`).
const SWEEP_NS: i64 = 60_000_000_000;

impl Ours {
    fn tick(&self, i: usize) {
        if let Some(&ns) = self.op_ns.get(i) {
            self.clock.set_ns(ns);
            if ns >= self.next_sweep.get() {
                self.idx.sweep();
                self.next_sweep.set(ns + SWEEP_NS);
            }
        }
    }
}

impl Engine for Ours {
    fn name(&self) -> &'static str {
        match self.path {
            Path::Probe => OURS,
            Path::Contract => OURS_CONTRACT,
            Path::Default => OURS_DEFAULT,
        }
    }
    fn checked(&self) -> bool {
        self.path != Path::Default
    }
    fn prepare(&mut self, w: &Workload) {
        self.ups.clear();
        self.evs.clear();
        for op in &w.ops {
            let (u, e) = self.convert(op, w);
            self.ups.push(u);
            self.evs.push(e);
        }
        self.q = w
            .chains
            .iter()
            .map(|c| c.seq.iter().map(|s| s.to_be_bytes()).collect())
            .collect();
        let max = w.chains.iter().map(|c| c.seq.len()).max().unwrap_or(0);
        self.counts = vec![BLOCK_TOKENS as i32; max];
        self.seeds = w
            .chains
            .iter()
            .map(|c| ic::chain_seed(&c.seq.iter().map(|s| s.to_be_bytes()).collect::<Vec<_>>()))
            .collect();
        // Only the default path reads the clock for anything but stamps.
        self.op_ns.clear();
        if self.path == Path::Default {
            let mut ns = NOW_NS;
            for op in &w.ops {
                if let Op::Lookup { req, .. } = op {
                    ns = NOW_NS + w.chains[*req].ts_ms as i64 * 1_000_000;
                }
                self.op_ns.push(ns);
            }
        }
    }
    fn apply(&mut self, i: usize, _op: &Op) {
        self.tick(i);
        ours_apply(&self.idx, self.ups[i].as_ref(), &self.evs[i]);
    }
    fn apply_unprepared(&mut self, op: &Op, w: &Workload) {
        let (u, e) = self.convert(op, w);
        ours_apply(&self.idx, u.as_ref(), &e);
    }
    fn lookup(&self, i: usize, req: usize, out: &mut Vec<(u32, u32)>) -> u64 {
        self.tick(i);
        ours_lookup(
            &self.idx,
            self.path,
            &self.q[req],
            &self.counts,
            &self.seeds[req],
            out,
        )
    }
    fn errors(&self) -> u64 {
        0
    }
    fn split(&mut self) -> Option<Split<'_>> {
        Some((
            Box::new(OursWriter {
                idx: &self.idx,
                clock: &self.clock,
                op_ns: &self.op_ns,
                ups: &self.ups,
                evs: &self.evs,
            }),
            Box::new(OursReader {
                idx: &self.idx,
                path: self.path,
                seeds: &self.seeds,
                q: &self.q,
                counts: &self.counts,
            }),
        ))
    }
}

// ---------------------------------------------------------------- arena

/// Our chain-run arena (`crates/index/src/arena`), driven directly: stores,
/// removals and the chain walk, with no partition lookup, ranking or names
/// (what the index will spend around it). Shared as it is (its shards lock
/// inside).
pub struct Arena {
    arena: ic::arena::ChainArena,
    counts: Vec<i32>,
    /// Cumulative token counts of a store's blocks (what the index stores).
    cum: Vec<i32>,
    seq: Vec<Vec<u64>>,
}

impl Arena {
    pub fn new() -> Self {
        Self {
            arena: ic::arena::ChainArena::new(),
            counts: Vec::new(),
            cum: Vec::new(),
            seq: Vec::new(),
        }
    }
}

/// Applies a store or removal; `chain(req)` is request `req`'s chain and
/// `cum` the cumulative token counts of a store's blocks.
fn arena_apply<'c>(
    a: &ic::arena::ChainArena,
    op: &Op,
    chain: impl Fn(usize) -> &'c [u64],
    cum: &[i32],
) {
    match op {
        Op::Store {
            replica,
            req,
            start,
            len,
        } => {
            let hs = &chain(*req)[*start..*start + *len];
            a.store(1, *replica, hs, &cum[..*len], NOW_NS, ic::Tier::T1);
        }
        Op::Remove { replica, seqs } => {
            for &h in seqs {
                a.remove(1, h, *replica);
            }
        }
        Op::Lookup { .. } => {}
    }
}

fn arena_lookup(
    a: &ic::arena::ChainArena,
    q: &[u64],
    counts: &[i32],
    out: &mut Vec<(u32, u32)>,
) -> u64 {
    let mut got = Vec::with_capacity(64);
    let t = Instant::now();
    a.walk(1, q, &counts[..q.len()], 0, &mut got);
    let ns = t.elapsed().as_nanos() as u64;
    out.extend(got.iter().map(|r| (r.replica, r.blocks)));
    ns
}

struct ArenaWriter<'a> {
    a: &'a ic::arena::ChainArena,
    seq: &'a [Vec<u64>],
    cum: &'a [i32],
}
impl Writer for ArenaWriter<'_> {
    fn apply(&mut self, _i: usize, op: &Op) {
        arena_apply(self.a, op, |r| &self.seq[r], self.cum);
    }
}
struct ArenaReader<'a> {
    a: &'a ic::arena::ChainArena,
    seq: &'a [Vec<u64>],
    counts: &'a [i32],
}
impl Reader for ArenaReader<'_> {
    fn lookup(&self, _i: usize, req: usize, out: &mut Vec<(u32, u32)>) -> u64 {
        arena_lookup(self.a, &self.seq[req], self.counts, out)
    }
}

impl Engine for Arena {
    fn name(&self) -> &'static str {
        ARENA
    }
    fn prepare(&mut self, w: &Workload) {
        self.seq = w.chains.iter().map(|c| c.seq.clone()).collect();
        let max = w.chains.iter().map(|c| c.seq.len()).max().unwrap_or(0);
        self.counts = vec![BLOCK_TOKENS as i32; max];
        self.cum = (1..=max as i32).map(|i| i * BLOCK_TOKENS as i32).collect();
    }
    fn apply(&mut self, _i: usize, op: &Op) {
        arena_apply(&self.arena, op, |r| &self.seq[r], &self.cum);
    }
    fn apply_unprepared(&mut self, op: &Op, w: &Workload) {
        let len = match op {
            Op::Store { len, .. } => *len,
            _ => 0,
        };
        let cum: Vec<i32> = (1..=len as i32).map(|i| i * BLOCK_TOKENS as i32).collect();
        arena_apply(&self.arena, op, |r| &w.chains[r].seq, &cum);
    }
    fn lookup(&self, _i: usize, req: usize, out: &mut Vec<(u32, u32)>) -> u64 {
        arena_lookup(&self.arena, &self.seq[req], &self.counts, out)
    }
    fn errors(&self) -> u64 {
        0
    }
    fn split(&mut self) -> Option<Split<'_>> {
        Some((
            Box::new(ArenaWriter {
                a: &self.arena,
                seq: &self.seq,
                cum: &self.cum,
            }),
            Box::new(ArenaReader {
                a: &self.arena,
                seq: &self.seq,
                counts: &self.counts,
            }),
        ))
    }
}

// ---------------------------------------------------------------- kv-index

use kv_index::{ChainBlockMap, ChainIndex, ContentHash, SequenceHash, StoredBlock};

enum KvOp {
    None,
    Store {
        w: u32,
        parent: Option<SequenceHash>,
        blocks: Vec<StoredBlock>,
    },
    Remove {
        w: u32,
        hashes: Vec<SequenceHash>,
    },
}

pub struct KvIndex {
    idx: ChainIndex,
    /// replica -> interned worker id
    ids: Vec<u32>,
    /// worker id -> replica
    rev: Vec<u32>,
    /// one lane map per worker (the index's per-worker engine-hash table)
    maps: Vec<ChainBlockMap>,
    ops: Vec<KvOp>,
    q: Vec<Vec<ContentHash>>,
    errors: AtomicU64,
}

impl KvIndex {
    pub fn new(replicas: usize) -> Self {
        let idx = ChainIndex::with_max_workers(replicas.max(1));
        let ids: Vec<u32> = (0..replicas)
            .map(|r| idx.intern_worker(&format!("r{r}")).expect("worker slot"))
            .collect();
        let mut rev = vec![u32::MAX; ids.iter().copied().max().unwrap_or(0) as usize + 1];
        for (r, &id) in ids.iter().enumerate() {
            rev[id as usize] = r as u32;
        }
        Self {
            idx,
            ids,
            rev,
            maps: (0..replicas).map(|_| ChainBlockMap::new()).collect(),
            ops: Vec::new(),
            q: Vec::new(),
            errors: AtomicU64::new(0),
        }
    }

    fn convert(&self, op: &Op, w: &Workload) -> KvOp {
        match op {
            Op::Store {
                replica,
                req,
                start,
                len,
            } => {
                let c = &w.chains[*req];
                KvOp::Store {
                    w: self.ids[*replica as usize],
                    parent: (*start > 0).then(|| SequenceHash(c.seq[start - 1])),
                    blocks: (*start..start + len)
                        .map(|i| StoredBlock {
                            seq_hash: SequenceHash(c.seq[i]),
                            content_hash: ContentHash(c.content[i]),
                        })
                        .collect(),
                }
            }
            Op::Remove { replica, seqs } => KvOp::Remove {
                w: self.ids[*replica as usize],
                hashes: seqs.iter().map(|s| SequenceHash(*s)).collect(),
            },
            Op::Lookup { .. } => KvOp::None,
        }
    }
}

fn kv_apply(idx: &ChainIndex, maps: &mut [ChainBlockMap], errors: &AtomicU64, op: &KvOp) {
    match op {
        KvOp::None => {}
        KvOp::Store { w, parent, blocks } => {
            if idx
                .apply_stored(*w, blocks, *parent, &mut maps[*w as usize])
                .is_err()
            {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        KvOp::Remove { w, hashes } => idx.apply_removed(*w, hashes, &mut maps[*w as usize]),
    }
}

fn kv_lookup(idx: &ChainIndex, rev: &[u32], q: &[ContentHash], out: &mut Vec<(u32, u32)>) -> u64 {
    let t = Instant::now();
    let res = idx.find_matches(q, false);
    let ns = t.elapsed().as_nanos() as u64;
    for (w, s) in res.scores {
        if s > 0 {
            out.push((rev[w as usize], s));
        }
    }
    ns
}

struct KvWriter<'a> {
    idx: &'a ChainIndex,
    maps: &'a mut [ChainBlockMap],
    ops: &'a [KvOp],
    errors: &'a AtomicU64,
}
impl Writer for KvWriter<'_> {
    fn apply(&mut self, i: usize, _op: &Op) {
        kv_apply(self.idx, self.maps, self.errors, &self.ops[i]);
    }
}
struct KvReader<'a> {
    idx: &'a ChainIndex,
    rev: &'a [u32],
    q: &'a [Vec<ContentHash>],
}
impl Reader for KvReader<'_> {
    fn lookup(&self, _i: usize, req: usize, out: &mut Vec<(u32, u32)>) -> u64 {
        kv_lookup(self.idx, self.rev, &self.q[req], out)
    }
}

impl Engine for KvIndex {
    fn name(&self) -> &'static str {
        KVI
    }
    fn prepare(&mut self, w: &Workload) {
        self.ops = w.ops.iter().map(|op| self.convert(op, w)).collect();
        self.q = w
            .chains
            .iter()
            .map(|c| c.content.iter().map(|&h| ContentHash(h)).collect())
            .collect();
    }
    fn apply(&mut self, i: usize, _op: &Op) {
        kv_apply(&self.idx, &mut self.maps, &self.errors, &self.ops[i]);
    }
    fn apply_unprepared(&mut self, op: &Op, w: &Workload) {
        let k = self.convert(op, w);
        kv_apply(&self.idx, &mut self.maps, &self.errors, &k);
    }
    fn lookup(&self, _i: usize, req: usize, out: &mut Vec<(u32, u32)>) -> u64 {
        kv_lookup(&self.idx, &self.rev, &self.q[req], out)
    }
    fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }
    fn split(&mut self) -> Option<Split<'_>> {
        Some((
            Box::new(KvWriter {
                idx: &self.idx,
                maps: &mut self.maps,
                ops: &self.ops,
                errors: &self.errors,
            }),
            Box::new(KvReader {
                idx: &self.idx,
                rev: &self.rev,
                q: &self.q,
            }),
        ))
    }
}

// ---------------------------------------------------------------- dynamo

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, RouterEvent,
};

pub struct Dynamo {
    tree: RadixTree,
    /// prepared events, consumed by `apply` (`apply_event` takes the event by value)
    evs: Vec<Option<RouterEvent>>,
    /// prepared queries per lookup op, consumed by `lookup` (`find_matches`
    /// takes the sequence by value); falls back to a clone if already taken
    q: RefCell<Vec<Option<Vec<LocalBlockHash>>>>,
    chains: Vec<Vec<LocalBlockHash>>,
    next_id: u64,
    errors: u64,
}

impl Dynamo {
    pub fn new() -> Self {
        Self {
            tree: RadixTree::new(),
            evs: Vec::new(),
            q: RefCell::new(Vec::new()),
            chains: Vec::new(),
            next_id: 0,
            errors: 0,
        }
    }

    fn convert(&mut self, op: &Op, w: &Workload) -> Option<RouterEvent> {
        let ev = dynamo_event(op, w, self.next_id + 1)?;
        self.next_id += 1;
        Some(ev)
    }

    fn apply_ev(&mut self, ev: RouterEvent) {
        if self.tree.apply_event(ev).is_err() {
            self.errors += 1;
        }
    }
}

impl Engine for Dynamo {
    fn name(&self) -> &'static str {
        DYN
    }
    fn prepare(&mut self, w: &Workload) {
        let mut evs = Vec::with_capacity(w.ops.len());
        for op in &w.ops {
            let e = self.convert(op, w);
            evs.push(e);
        }
        self.evs = evs;
        self.chains = w
            .chains
            .iter()
            .map(|c| c.content.iter().map(|&h| LocalBlockHash(h)).collect())
            .collect();
        *self.q.borrow_mut() = w
            .ops
            .iter()
            .map(|op| match op {
                Op::Lookup { req, .. } => Some(self.chains[*req].clone()),
                _ => None,
            })
            .collect();
    }
    fn apply(&mut self, i: usize, _op: &Op) {
        if let Some(ev) = self.evs[i].take() {
            self.apply_ev(ev);
        }
    }
    fn apply_unprepared(&mut self, op: &Op, w: &Workload) {
        if let Some(ev) = self.convert(op, w) {
            self.apply_ev(ev);
        }
    }
    fn lookup(&self, i: usize, req: usize, out: &mut Vec<(u32, u32)>) -> u64 {
        let seq = self
            .q
            .borrow_mut()
            .get_mut(i)
            .and_then(Option::take)
            .unwrap_or_else(|| self.chains[req].clone());
        let t = Instant::now();
        let res = self.tree.find_matches(seq, false);
        let ns = t.elapsed().as_nanos() as u64;
        for (w, s) in res.scores {
            if s > 0 {
                out.push((w.worker_id as u32, s));
            }
        }
        ns
    }
    fn errors(&self) -> u64 {
        self.errors
    }
    fn split(&mut self) -> Option<Split<'_>> {
        // RadixTree is built on Rc<RefCell<..>>: it is neither Send nor Sync, so it
        // cannot be shared with a reader thread (a Mutex<RadixTree> is not Sync either,
        // since Mutex<T>: Sync needs T: Send).
        None
    }
}

/// One op as a dynamo `RouterEvent` (worker id = replica, dp rank 0).
pub fn dynamo_event(op: &Op, w: &Workload, event_id: u64) -> Option<RouterEvent> {
    let (worker, data) = match op {
        Op::Store {
            replica,
            req,
            start,
            len,
        } => {
            let c = &w.chains[*req];
            (
                *replica,
                KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: (*start > 0).then(|| ExternalSequenceBlockHash(c.seq[start - 1])),
                    start_position: Some(*start as u32),
                    blocks: (*start..start + len)
                        .map(|i| KvCacheStoredBlockData {
                            block_hash: ExternalSequenceBlockHash(c.seq[i]),
                            tokens_hash: LocalBlockHash(c.content[i]),
                            mm_extra_info: None,
                        })
                        .collect(),
                }),
            )
        }
        Op::Remove { replica, seqs } => (
            *replica,
            KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: seqs.iter().map(|s| ExternalSequenceBlockHash(*s)).collect(),
            }),
        ),
        Op::Lookup { .. } => return None,
    };
    Some(RouterEvent::new(
        worker as u64,
        KvCacheEvent {
            event_id,
            data,
            dp_rank: 0,
        },
    ))
}

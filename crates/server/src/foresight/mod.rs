//! Eviction foresight in the server: a hint does not claim blocks that the
//! requests already hinted to the same replica will evict before its engine
//! gets to this one (issue 33's "after the hint" over-claims, for callers
//! that only call LookupRoute).
//!
//! The index is right about the moment of a lookup; the engine schedules
//! the request later, behind the requests sent to it before, and each of
//! those takes blocks from the front of vLLM's free queue: blank blocks,
//! then the least recently freed prefixes, tail first. The gateway models
//! this from the requests it routes (it sees them start and end); the
//! server sees neither, so each replica's model ([`replica`]) is built from
//! what the server does see, and the check is the same dry run
//! ([`inferencecache_foresight::claimable`]):
//!
//! - **the engine's blocks, in its own order**: the producer's stored and
//!   removed reports, applied here in each replica's ingest-lane order
//!   right after the index applies them. A block's place in the eviction
//!   order is when the last request using it started (its blocks are freed
//!   tail first when it ends, and short requests end in the order they
//!   start), tail first;
//! - **the requests on their way**: a delivered hint (PREFIX_MATCH, or an
//!   AFFINITY_HINT pick) names the replica a request is about to reach and
//!   its prompt's blocks. The top-ranked replica is taken as the
//!   destination, as the SDK's example and `bench/real-vllm`'s Python
//!   gateway do;
//! - **a request sent elsewhere** (a caller whose lookup passed its
//!   deadline fails open to another engine; a gateway's own choice): when
//!   another replica of the scope reports storing the last block of its
//!   chain and no request hinted *there* ends with that block, it leaves
//!   the hinted replica's model and counts as started where it was stored
//!   (`inferencecache_foresight_moved_total`). One that stores nothing
//!   there (a full hit) is bounded as an end is, below;
//! - **a start**: the first of its new blocks reported stored (and, first
//!   come first served, every request hinted to that replica before it);
//! - **an end or a start that stores nothing** (a full hit): not seen. The
//!   load report (`EngineLoad`, scraped every second by the sidecar)
//!   bounds how many hinted requests can still be ahead: of those hinted
//!   at least a scrape interval before the report, the engine's *waiting*
//!   ones. vLLM stores a request's blocks when it schedules it, so a
//!   running one not seen to start made its allocation already (a full
//!   hit) or is not the hinted request (never sent: a lookup whose caller
//!   did not follow it). A request not seen to start within 30 s is
//!   forgotten;
//! - **the pool size**: `EngineLoad.kv_cache_capacity_tokens` over the
//!   block size the producer reports. Until a replica reports it, its
//!   claims are the index's.
//! - **hybrid models**: off. Once a replica's producer marks a block a
//!   match may not end at (`no_match_end`: sliding-window groups), its
//!   model goes inert for good and its claims are the index's: every group
//!   draws on one pool and the window groups free and evict blocks in an
//!   order the full-attention chain does not show (a model of the chain
//!   alone predicted evictions the engine did not make: a block short).
//!
//! Cost on the lookup path: one atomic load per candidate while no replica's
//! model says pressure (the requests waiting need fewer blocks than are
//! blank), and a delivery records nothing while no replica's pool is known
//! (fleet-wide counts); otherwise a find per candidate, and under pressure
//! a lock and the dry run over the waiting requests.
//! No lock is held across an await. Contract ranking never calls it.
//! Memory: two map entries per block a replica holds (bounded by its
//! capacity) and the chains of the requests waiting (at most 256 each);
//! fleet-wide, the last block of each request delivered in the last 30 s
//! (at most 65,536), looked up (one lock per store report) only while some
//! request waits.
//!
//! - **running requests' blocks**: each request running at the last load
//!   report holds a partial block that is not blank, and a request hinted
//!   after that report is not among them; one seen to start since its
//!   scrape whose prompt fills its last block takes a new block at its
//!   first decode step ([`running`]), which can evict with nothing queued.
//!
//! Not modelled: which hashed blocks running requests use (every held block
//! counts as free), decode blocks past the first token, requests that reach
//! an engine without a hint from this server, and a peer's deliveries in
//! bus mode. Each makes a claim the index's (today's behaviour) or, rarely,
//! a block shorter than the engine reuses.

mod replica;
mod running;

use inferencecache_index::{CacheEvent, CacheUpdate, EventKind};
use replica::Model;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Instant;

/// Most replicas modelled (past this new ones keep the index's claims).
const MAX_REPLICAS: usize = 65_536;
/// Most delivered requests remembered by their last block (past this the
/// oldest cannot be found from another replica's stores; each is also in
/// its replica's model, which holds at most 256).
const MAX_ENDS: usize = 65_536;

/// The server's eviction foresight: one model per (tenant, model, replica).
#[derive(Debug, Default)]
pub struct Foresight {
    enabled: bool,
    replicas: RwLock<HashMap<Box<str>, Vec<Arc<Replica>>>>,
    counts: Counts,
    ends: Mutex<Ends>,
    /// Entries in `ends` (read without its lock: no delivery waiting, no
    /// reconciling).
    ends_len: AtomicUsize,
    /// Delivered requests found stored on another replica than hinted.
    retired: AtomicU64,
}

/// The requests delivered with one last block: (sequence, the replica
/// hinted), oldest first.
type Enders = Vec<(u64, Weak<Replica>)>;

/// The requests delivered and maybe still waiting, by the last block of
/// their chain: how a store on replica B finds a request hinted to replica
/// A whose caller sent it to B (a failed-open lookup, a gateway's own
/// choice). Entries go when matched, when their replica's model no longer
/// holds them (found on a match), or by age.
#[derive(Debug, Default)]
struct Ends {
    by_last: HashMap<u64, Enders>,
    /// (last block, sequence, delivered at), oldest first.
    order: VecDeque<(u64, u64, Instant)>,
    seq: u64,
}

impl Ends {
    fn add(&mut self, last: u64, r: &Arc<Replica>, now: Instant) {
        while self.order.len() >= MAX_ENDS
            || self
                .order
                .front()
                .is_some_and(|o| now.saturating_duration_since(o.2) > replica::MAX_QUEUED_AGE)
        {
            let Some((h, seq, _)) = self.order.pop_front() else {
                break;
            };
            self.drop_through(h, seq);
        }
        self.seq += 1;
        self.by_last
            .entry(last)
            .or_default()
            .push((self.seq, Arc::downgrade(r)));
        self.order.push_back((last, self.seq, now));
    }

    /// Drops `last`'s entries up to sequence `seq`.
    fn drop_through(&mut self, last: u64, seq: u64) {
        if let Some(v) = self.by_last.get_mut(&last) {
            v.retain(|e| e.0 > seq);
            if v.is_empty() {
                self.by_last.remove(&last);
            }
        }
    }

    fn len(&self) -> usize {
        self.order.len()
    }
}

/// Fleet-wide counts that let a lookup skip the per-replica finds: with no
/// pool known anywhere a delivery records nothing, and with no replica
/// under pressure a claim is the index's, for one atomic load per lookup.
#[derive(Debug, Default)]
struct Counts {
    /// Replicas whose model knows its pool.
    pools: AtomicUsize,
    /// Replicas whose model says a claim may be shortened.
    pressured: AtomicUsize,
}

#[derive(Debug)]
struct Replica {
    id: Box<str>,
    tenant: Box<str>,
    model: Box<str>,
    /// The model's last word on whether a claim may be shortened.
    pressure: AtomicBool,
    state: Mutex<Model>,
}

impl Replica {
    /// `f` on the model; the fleet counts follow its transitions (made
    /// under the model's lock, so each replica counts once).
    fn with<T>(&self, counts: &Counts, f: impl FnOnce(&mut Model) -> T) -> Option<T> {
        let mut m = self.state.lock().ok()?;
        let had_pool = m.active();
        let out = f(&mut m);
        match (had_pool, m.active()) {
            (false, true) => {
                counts.pools.fetch_add(1, Ordering::Release);
            }
            (true, false) => {
                counts.pools.fetch_sub(1, Ordering::Release);
            }
            _ => {}
        }
        let pressure = m.pressure();
        if self.pressure.swap(pressure, Ordering::AcqRel) != pressure {
            if pressure {
                counts.pressured.fetch_add(1, Ordering::Release);
            } else {
                counts.pressured.fetch_sub(1, Ordering::Release);
            }
        }
        Some(out)
    }
}

/// A block hash as the model keys it: the 8-byte wire hash as is, longer
/// (or shorter) ones folded.
fn key(hash: &[u8]) -> u64 {
    match <[u8; 8]>::try_from(hash) {
        Ok(b) => u64::from_be_bytes(b),
        Err(_) => xxhash_rust::xxh3::xxh3_64(hash),
    }
}

impl Foresight {
    /// Foresight on (`true`) or off (every claim is the index's).
    pub fn new(enabled: bool) -> Self {
        Self {
            enabled,
            ..Self::default()
        }
    }

    /// Delivered requests found stored on another replica than the one
    /// hinted (their caller sent them elsewhere), since start.
    pub fn retired(&self) -> u64 {
        self.retired.load(Ordering::Relaxed)
    }

    /// Whether it is on.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    fn find(&self, tenant: &str, model: &str, replica: &str) -> Option<Arc<Replica>> {
        let map = self.replicas.read().ok()?;
        map.get(replica)?
            .iter()
            .find(|r| &*r.tenant == tenant && &*r.model == model)
            .cloned()
    }

    fn find_or_add(&self, tenant: &str, model: &str, replica: &str) -> Option<Arc<Replica>> {
        if let Some(r) = self.find(tenant, model, replica) {
            return Some(r);
        }
        let mut map = self.replicas.write().ok()?;
        if map.len() >= MAX_REPLICAS && !map.contains_key(replica) {
            return None;
        }
        let list = map.entry(replica.into()).or_default();
        if let Some(r) = list
            .iter()
            .find(|r| &*r.tenant == tenant && &*r.model == model)
        {
            return Some(Arc::clone(r));
        }
        let r = Arc::new(Replica {
            id: replica.into(),
            tenant: tenant.into(),
            model: model.into(),
            pressure: AtomicBool::new(false),
            state: Mutex::new(Model::default()),
        });
        list.push(Arc::clone(&r));
        Some(r)
    }

    /// An update the index just applied: stored blocks in report order,
    /// the engine's load and pool. `block_size` is the scope's (what its
    /// producers report). Returns how many requests hinted to another
    /// replica it showed arriving here instead (moved to this model).
    pub fn ingest(&self, u: &CacheUpdate, block_size: u32) -> u64 {
        self.ingest_at(u, block_size, Instant::now())
    }

    fn ingest_at(&self, u: &CacheUpdate, block_size: u32, now: Instant) -> u64 {
        if !self.enabled {
            return 0;
        }
        let load = u.stats.as_ref().and_then(|s| s.load);
        let pool = load.filter(|l| l.kv_cache_capacity_tokens > 0);
        // Blocks are kept from the first report on, before the load report
        // says the pool (a sidecar's first stores may come before its first
        // scrape): a model that missed them would count them blank.
        let Some(r) = self.find_or_add(&u.tenant_id, &u.model_id, &u.replica_id) else {
            return 0;
        };
        let bs = u64::from(block_size.max(1));
        let mut blocks: Vec<(u64, u64)> = Vec::new();
        if !u.hash_scheme.is_empty() {
            for p in &u.prefixes {
                if p.block_hashes.is_empty() {
                    if !p.prefix_hash.is_empty() {
                        let depth = u64::try_from(p.token_count.max(1) - 1).unwrap_or(0) / bs;
                        blocks.push((key(&p.prefix_hash), depth));
                    }
                } else {
                    blocks.extend(
                        p.block_hashes
                            .iter()
                            .enumerate()
                            .map(|(i, h)| (key(h), i as u64)),
                    );
                }
            }
        }
        let reconcile = !blocks.is_empty() && self.ends_len.load(Ordering::Acquire) > 0;
        let hybrid = u.prefixes.iter().any(|p| p.no_match_end);
        let (started, unexplained, went_hybrid) = r
            .with(&self.counts, |m| {
                let went_hybrid = hybrid && m.set_hybrid();
                let started =
                    pool.is_some_and(|l| m.set_pool(l.kv_cache_capacity_tokens, block_size));
                let unexplained = if reconcile {
                    m.unexplained(&blocks)
                } else {
                    Vec::new()
                };
                m.stored(&blocks, now);
                if let Some(l) = load {
                    m.load(l.running_requests, l.waiting_requests, now);
                }
                (started, unexplained, went_hybrid)
            })
            .unwrap_or_default();
        if went_hybrid {
            tracing::info!(
                tenant = %u.tenant_id, model = %u.model_id, replica = %u.replica_id,
                "eviction foresight off for this replica: a hybrid model (its window groups \
                 share the pool in an order the full-attention chain does not show)"
            );
        }
        let moved = if unexplained.is_empty() {
            0
        } else {
            self.arrived_elsewhere(&r, &unexplained)
        };
        if started {
            tracing::info!(
                tenant = %u.tenant_id, model = %u.model_id, replica = %u.replica_id,
                capacity_tokens = pool.map_or(0, |l| l.kv_cache_capacity_tokens), block_size,
                "eviction foresight on for this replica"
            );
        }
        moved
    }

    /// `here` stored blocks that no request hinted to it ends with: a
    /// request hinted to another replica of its scope that ends with one of
    /// them went here instead. It leaves that replica's model (where it would
    /// never start) and counts here as started. Locks one model at a time.
    fn arrived_elsewhere(&self, here: &Arc<Replica>, stored: &[u64]) -> u64 {
        // One lock for the report: the blocks that end a delivered chain.
        let found: Vec<(u64, Enders)> = match self.ends.lock() {
            Ok(mut e) => stored
                .iter()
                .filter_map(|h| e.by_last.remove(h).map(|c| (*h, c)))
                .collect(),
            Err(_) => return 0,
        };
        found
            .into_iter()
            .map(|(last, candidates)| u64::from(self.move_one(here, last, candidates)))
            .sum()
    }

    /// Of `candidates` (delivered requests ending with `last`, oldest
    /// first), the first still waiting on another replica of `here`'s scope
    /// moves here.
    fn move_one(&self, here: &Arc<Replica>, last: u64, candidates: Enders) -> bool {
        let mut keep = Vec::new();
        let mut found = None;
        for (seq, w) in candidates {
            if found.is_some() {
                keep.push((seq, w));
                continue;
            }
            let Some(there) = w.upgrade() else { continue };
            if Arc::ptr_eq(&there, here) || there.tenant != here.tenant || there.model != here.model
            {
                keep.push((seq, w));
                continue;
            }
            // None: it started there, or a load report or its age took it.
            if let Some(Some(chain)) = there.with(&self.counts, |m| m.retire(last)) {
                found = Some((there, chain));
            }
        }
        // Those not tried (or of another scope) stay findable.
        if !keep.is_empty()
            && let Ok(mut e) = self.ends.lock()
        {
            let v = e.by_last.entry(last).or_default();
            keep.append(v);
            *v = keep;
        }
        let Some((there, chain)) = found else {
            return false;
        };
        here.with(&self.counts, |m| m.arrived(&chain));
        self.retired.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            tenant = %here.tenant, model = %here.model, hinted = %there.id, stored = %here.id,
            "a request hinted to one replica was stored on another"
        );
        true
    }

    /// An event the index just applied (a removal or a clear).
    pub fn event(&self, e: &CacheEvent) {
        if !self.enabled {
            return;
        }
        let Some(r) = self.find(&e.tenant_id, &e.model_id, &e.replica_id) else {
            return;
        };
        match e.kind {
            EventKind::PrefixEvicted if !e.prefix_hash.is_empty() => {
                let h = key(&e.prefix_hash);
                r.with(&self.counts, |m| m.removed(h));
            }
            EventKind::AllCleared => {
                r.with(&self.counts, Model::cleared);
            }
            _ => {}
        }
    }

    /// A hint named `replica` for a request whose prompt is `prompt_tokens`
    /// long with whole blocks `chain`: it is on its way there.
    pub fn delivered<H: AsRef<[u8]>>(
        &self,
        tenant: &str,
        model: &str,
        replica: &str,
        chain: &[H],
        prompt_tokens: u64,
    ) {
        if !self.enabled || self.counts.pools.load(Ordering::Acquire) == 0 {
            return;
        }
        let Some(r) = self.find(tenant, model, replica) else {
            return;
        };
        let chain: Vec<u64> = chain.iter().map(|h| key(h.as_ref())).collect();
        let last = chain.last().copied();
        let now = Instant::now();
        let waiting = r
            .with(&self.counts, |m| m.delivered(chain, prompt_tokens, now))
            .unwrap_or(false);
        if let Some(last) = last.filter(|_| waiting)
            && let Ok(mut e) = self.ends.lock()
        {
            e.add(last, &r, now);
            self.ends_len.store(e.len(), Ordering::Release);
        }
    }

    /// Of `matched_tokens` the index claims `replica` holds of `chain`
    /// (whose blocks hold `counts` tokens each), how many it will still
    /// hold when it schedules a request sent now.
    pub fn claimable<H: AsRef<[u8]>>(
        &self,
        tenant: &str,
        model: &str,
        replica: &str,
        chain: &[H],
        counts: &[i32],
        matched_tokens: i32,
    ) -> i32 {
        if !self.enabled
            || matched_tokens <= 0
            || chain.is_empty()
            || self.counts.pressured.load(Ordering::Acquire) == 0
        {
            return matched_tokens;
        }
        let Some(r) = self.find(tenant, model, replica) else {
            return matched_tokens;
        };
        if !r.pressure.load(Ordering::Acquire) {
            return matched_tokens;
        }
        // The claim in whole blocks of the chain.
        let mut blocks = 0;
        let mut tokens = 0i32;
        for &c in counts.iter().take(chain.len()) {
            if tokens.saturating_add(c) > matched_tokens {
                break;
            }
            tokens = tokens.saturating_add(c);
            blocks += 1;
        }
        if blocks == 0 {
            return matched_tokens;
        }
        let claim: Vec<u64> = chain[..blocks].iter().map(|h| key(h.as_ref())).collect();
        let Ok(m) = r.state.lock() else {
            return matched_tokens;
        };
        let kept = m.claimable(&claim);
        drop(m);
        if kept >= blocks {
            return matched_tokens;
        }
        counts[..kept]
            .iter()
            .fold(0i32, |a, &c| a.saturating_add(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferencecache_index::{EngineLoad, PrefixEntry, ReplicaStatsReport};

    const BS: u32 = 4;

    fn wire(h: u64) -> Vec<u8> {
        h.to_be_bytes().to_vec()
    }

    /// `r0` stores `hashes` (legacy entries, one per block, as the sidecar
    /// reports them), with its load.
    fn update(hashes: std::ops::Range<u64>, load: Option<EngineLoad>) -> CacheUpdate {
        CacheUpdate {
            replica_id: "r0".into(),
            model_id: "m".into(),
            tenant_id: "t".into(),
            hash_scheme: "vllm".into(),
            timestamp_us: 0,
            prefixes: hashes
                .clone()
                .enumerate()
                .map(|(i, h)| PrefixEntry {
                    prefix_hash: wire(h),
                    token_count: (i as i32 + 1) * BS as i32,
                    ..PrefixEntry::default()
                })
                .collect(),
            stats: load.map(|l| ReplicaStatsReport {
                load: Some(l),
                ..ReplicaStatsReport::default()
            }),
            adapter_id: String::new(),
        }
    }

    fn pool(blocks: u64) -> Option<EngineLoad> {
        Some(EngineLoad {
            kv_cache_capacity_tokens: (blocks + 1) * u64::from(BS),
            ..EngineLoad::default()
        })
    }

    fn chain(from: u64, n: u64) -> Vec<Vec<u8>> {
        (from..from + n).map(wire).collect()
    }

    #[test]
    fn a_claim_stops_where_a_request_hinted_before_it_will_evict() {
        let f = Foresight::new(true);
        f.ingest(&update(1..10, pool(12)), BS);
        let counts = vec![BS as i32; 8];
        let sys = chain(1, 8);
        assert_eq!(f.claimable("t", "m", "r0", &sys, &counts, 32), 32);
        // A fresh 5-block prompt hinted to r0 first takes 3 blank blocks,
        // then 9, 8 and 7.
        f.delivered("t", "m", "r0", &chain(200, 5), 21);
        assert_eq!(f.claimable("t", "m", "r0", &sys, &counts, 32), 24);
        // Another replica, tenant or a foresight turned off: the index's.
        assert_eq!(f.claimable("t", "m", "r1", &sys, &counts, 32), 32);
        assert_eq!(f.claimable("u", "m", "r0", &sys, &counts, 32), 32);
        let off = Foresight::new(false);
        off.ingest(&update(1..10, pool(12)), BS);
        off.delivered("t", "m", "r0", &chain(200, 5), 21);
        assert_eq!(off.claimable("t", "m", "r0", &sys, &counts, 32), 32);
        // It started (stored) and the engine removed 9, 8, 7.
        for h in [9u64, 8, 7] {
            f.event(&CacheEvent {
                kind: EventKind::PrefixEvicted,
                replica_id: "r0".into(),
                model_id: "m".into(),
                tenant_id: "t".into(),
                prefix_hash: wire(h),
                timestamp_us: 0,
                adapter_id: String::new(),
            });
        }
        f.ingest(&update(200..205, None), BS);
        assert_eq!(f.claimable("t", "m", "r0", &sys, &counts, 24), 24);
    }

    /// `update` for another replica.
    fn on(replica: &str, mut u: CacheUpdate) -> CacheUpdate {
        u.replica_id = replica.into();
        u
    }

    #[test]
    fn a_request_sent_elsewhere_leaves_the_hinted_replica_at_once() {
        let f = Foresight::new(true);
        f.ingest(&update(1..10, pool(12)), BS);
        f.ingest(&on("r1", update(50..51, pool(12))), BS);
        let counts = vec![BS as i32; 8];
        let sys = chain(1, 8);
        // A fresh 5-block prompt hinted to r0 would evict r0's tail...
        f.delivered("t", "m", "r0", &chain(200, 5), 21);
        assert_eq!(f.claimable("t", "m", "r0", &sys, &counts, 32), 24);
        // ...but its caller failed open and sent it to r1, which stored it
        // (r1's report says nothing of r0's blocks).
        f.ingest(&on("r1", update(200..205, None)), BS);
        assert_eq!(f.retired(), 1);
        assert_eq!(f.claimable("t", "m", "r0", &sys, &counts, 32), 32);
        // Another tenant's stores of the same blocks retire nothing.
        f.delivered("t", "m", "r0", &chain(300, 5), 21);
        let mut other = on("r1", update(300..305, None));
        other.tenant_id = "u".into();
        f.ingest(&other, BS);
        assert_eq!(f.retired(), 1);
        assert_eq!(f.claimable("t", "m", "r0", &sys, &counts, 32), 24);
        // Stores r0 itself was hinted for are its own start, not a move.
        f.ingest(&update(300..305, None), BS);
        assert_eq!(f.retired(), 1);
    }

    /// `replica`'s load report: `running` and `waiting` requests, its pool.
    fn busy(replica: &str, running: u32, waiting: u32) -> CacheUpdate {
        let mut u = on(replica, update(0..0, pool(12)));
        if let Some(l) = u.stats.as_mut().and_then(|s| s.load.as_mut()) {
            l.running_requests = running;
            l.waiting_requests = waiting;
        }
        u
    }

    #[test]
    fn probes_never_followed_stop_shortening_claims_while_other_traffic_runs() {
        // `real_vllm`'s lookup-order step: a test waits for r0's blocks by
        // looking the prompt up until r0 is claimed; the probes answered
        // before its stores arrived named r1 (AFFINITY_HINT) and were never
        // sent. r0's stores take one of them back; r1 then runs traffic
        // the server did not hint, one request at every report.
        let f = Foresight::new(true);
        f.ingest(&on("r0", update(900..901, pool(12))), BS);
        f.ingest(&on("r1", update(1..10, pool(12))), BS);
        let counts = vec![BS as i32; 8];
        let sys = chain(1, 8);
        let probe = chain(200, 5);
        f.delivered("t", "m", "r1", &probe, 21);
        f.delivered("t", "m", "r1", &probe, 21);
        f.ingest(&on("r0", update(200..205, None)), BS);
        assert_eq!(f.retired(), 1);
        assert_eq!(f.claimable("t", "m", "r1", &sys, &counts, 32), 24);
        let later = Instant::now() + replica::LOAD_GRACE;
        f.ingest_at(&busy("r1", 1, 0), BS, later);
        assert_eq!(f.claimable("t", "m", "r1", &sys, &counts, 32), 32);
    }

    #[test]
    fn a_hybrid_model_keeps_the_index_claims() {
        let f = Foresight::new(true);
        f.ingest(&update(1..10, pool(12)), BS);
        let counts = vec![BS as i32; 8];
        let sys = chain(1, 8);
        f.delivered("t", "m", "r0", &chain(200, 5), 21);
        assert_eq!(f.claimable("t", "m", "r0", &sys, &counts, 32), 24);
        // The producer marks a block a match may not end at (a window
        // group no longer holds what it needs there): a hybrid model.
        let mut u = update(10..11, pool(12));
        u.prefixes[0].no_match_end = true;
        f.ingest(&u, BS);
        assert_eq!(f.claimable("t", "m", "r0", &sys, &counts, 32), 32);
        // For good: later pools and deliveries change nothing.
        f.ingest(&update(11..12, pool(12)), BS);
        f.delivered("t", "m", "r0", &chain(300, 5), 21);
        assert_eq!(f.claimable("t", "m", "r0", &sys, &counts, 32), 32);
    }

    #[test]
    fn a_replica_without_a_pool_keeps_the_index_claims() {
        let f = Foresight::new(true);
        f.ingest(&update(1..10, None), BS);
        f.delivered("t", "m", "r0", &chain(200, 5), 21);
        let counts = vec![BS as i32; 8];
        assert_eq!(f.claimable("t", "m", "r0", &chain(1, 8), &counts, 32), 32);
    }
}

//! The estimated-TTFT ranking (the server's default; `--ranking contract` and
//! the CachePolicy v8 field `routing.ranking: contract` restore the
//! reference's ranking, [`crate::Index::lookup_route`] and
//! [`crate::Index::affinity_hint`], exactly).
//!
//! # The score
//!
//! For every **live** replica of (tenant, model) — fresh stats, or any
//! holding in the request's (tenant, model, scheme) scope — the index
//! estimates the time to first token of this request there, in µs:
//!
//! ```text
//! credited(r) = matched(r) × credit(tier(r)) × freshness(r)
//! uncached(r) = max(1, prompt − credited(r))
//! work(r)     = request_overhead + prefill_per_token × uncached(r)
//! ttft(r)     = queued(r) + work(r) + pressure_cost × pressure(r)
//! ```
//!
//! - `prompt` = the chain's token count (Σ `block_token_counts`), or the
//!   exact key's count;
//! - `matched(r)` = the replica's leading run over the chain (real holdings,
//!   then tentative ones, see `tentative.rs`, credited at
//!   [`TENTATIVE_CREDIT`]: a prediction, so a real holding of the same depth
//!   wins instead of losing to its own freshness decay); `credit` = 1 for T1 (GPU),
//!   `1 − t2_reload` for T2 (host), `1 − t3_reload` for T3 (disk / remote /
//!   SGLang `EXTERNAL`), 0 for unknown tiers: an offload-tier match costs a
//!   reload, not a recompute;
//! - `queued(r)` = the replica's queue (`load.rs`): the engine's last load
//!   report (running and waiting requests turned into work) drained since,
//!   plus the work of the hints delivered since that report; without
//!   reports, the work of the hints this server delivered that has not
//!   drained yet;
//! - `pressure(r)` = the replica's last reported pressure (fresh stats
//!   only), unless it reports its engine's load: its running and waiting
//!   requests are then in `queued(r)`, and not charged twice.
//!
//! The pick: drop replicas reporting pressure ≥ `affinity_max_pressure`
//! unless they hold a match (or nothing else is left); then drop, unless
//! that leaves nobody, every replica over the **bounded-load** rule:
//!
//! ```text
//! recent(r) > load_bound × mean over the fleet of recent(·) + 1
//! ```
//!
//! where `recent` is the decaying count of hints delivered (`load.rs`, 120 s
//! half-life; the `+ 1` lets a lone follow-up land where its prefix is in an
//! idle fleet). The estimate balances work, not requests: the replicas
//! holding the prefixes everybody shares finish their requests fastest and
//! would otherwise keep attracting more of them (1.29× the mean request count
//! at 16 replicas on the synthetic trace, BENCHMARKS.md). Among the rest, the
//! replicas with the lowest estimate tie, and the tie goes by the seed
//! (XXH3-64 of the chain seed mod the name-sorted tied set, `affinity.rs`
//! `tie_index`: the AFFINITY_HINT rule's shape with a cheaper hash), so
//! identical prompts still co-locate and an idle fleet is spread by the
//! prompt's hash. Where replicas report their KV cache usage
//! (`EngineLoad`), the tie first keeps those with the most room (usage in 5 %
//! steps): a new prefix goes where it does not evict others. The usage is
//! the larger of the reported one and the blocks the index holds for the
//! replica over its reported capacity (`counters.rs`): vLLM reports blocks
//! in use by running requests, so an idle engine reads 0 % however full its
//! cache. If the pick holds a match of at least
//! `min_matched_tokens` the answer is PREFIX_MATCH (the pick first, the other
//! matches after it by estimate); otherwise it is a miss whose pick the
//! server returns as AFFINITY_HINT. A long match on a busy replica therefore
//! loses to a shorter match or a cold idle replica exactly when the estimate
//! says that is faster.
//!
//! # Cost
//!
//! The lookup path ([`Index::route_ttft`]) costs O(matched + busy + log
//! fleet), not O(fleet) (`cold.rs`): replicas that match and replicas with
//! queued work are estimated one by one; every other live replica differs
//! only by pressure, KV room and name, so the fleet is kept as a set ordered
//! by those (rebuilt only when stats, a scope's membership, a replica's
//! held room step or the names change), the bounded-load mean is a sum kept exact in fixed point as
//! hints are delivered (`load.rs`), and the seeded tie is the k-th eligible
//! member of a class in name order. [`Index::route_ttft_explained`] (every
//! replica's estimate) takes one pass over the fleet (`fleet.rs`).
//! `routing_scan.rs` keeps the ranking as first written, a scan with
//! vectors and sorted names; a property test holds all three to the same
//! answers.
//!
//! Response scores are `1e6 / (1e6 + ttft_us)`: in (0, 1], descending in the
//! estimate, 0.5 at one second.
//!
//! Differences from the contract ranking (all deliberate, recorded in
//! docs/decisions.md): no distinguishing power (the estimate already sees
//! that a block every replica holds saves the same everywhere), no routing
//! floor on the score (a score is a time, not a match strength), no
//! TENANT_HOT (the fleet pick sees more), and UNKNOWN_* only when no replica
//! is live (approximate mode may know replicas that hold nothing real yet).

/// What a tentative holding's tokens are credited at in the estimate: less
/// than a real holding (whose credit is its freshness, just under 1 for a
/// recent report), so a replica that merely was sent the prefix never
/// outranks one the engine says holds it, on a hair of freshness. Found on
/// real vLLM: a hint delivered before the engine's events arrived put a
/// prediction on the other engine, which then won every tie.
pub(crate) const TENTATIVE_CREDIT: f64 = 0.9;

use crate::affinity::tie_index;
pub(crate) use crate::fleet::room_bucket;
use crate::fleet::{Cand, Fleet};
use crate::index::Index;
use crate::key::key_hash;
use crate::lookup::Raw;
use crate::ranking::freshness;
use crate::sync::{read, write};
use crate::types::{
    HitRun, LfuHits, LookupRequest, LookupRouteResult, ReplicaId, ReplicaNames, ReplicaScore,
    ScoreById, Strategy, Tier,
};
use std::sync::Arc;
use std::time::Duration;

/// Which ranking a tenant gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RankingMode {
    /// The reference's ranking and affinity, bit for bit.
    Contract,
    /// Estimated time to first token (this module). The default.
    #[default]
    Ttft,
}

impl RankingMode {
    /// `contract` or `ttft`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Contract => "contract",
            Self::Ttft => "ttft",
        }
    }

    /// Parses `contract` / `ttft` (case-insensitive).
    pub fn parse(s: &str) -> Option<Self> {
        if s.eq_ignore_ascii_case("contract") {
            Some(Self::Contract)
        } else if s.eq_ignore_ascii_case("ttft") {
            Some(Self::Ttft)
        } else {
            None
        }
    }
}

/// The estimate's weights (CachePolicy v8 `routing`). Defaults: an 8B-class
/// model on one H100-class GPU (about 20 k prefill tokens/s), the peers'
/// offload credits, approximate mode on for 120 s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TtftWeights {
    /// Prefill cost per uncached prompt token, µs (50).
    pub prefill_us_per_token: f64,
    /// Fixed cost of every request's prefill, µs (5,000).
    pub request_overhead_us: f64,
    /// Queued work one unit of reported pressure stands for, µs (50,000).
    pub pressure_us: f64,
    /// Reload cost of a T2 (host memory) match as a fraction of recomputing
    /// it (0.25: credit 0.75, Dynamo's host weight).
    pub t2_reload: f64,
    /// Reload cost of a T3 (disk, remote, shared pool) match (0.75: credit
    /// 0.25, Dynamo's disk weight).
    pub t3_reload: f64,
    /// Replicas reporting at least this pressure are skipped unless they hold
    /// a match (1.0).
    pub affinity_max_pressure: f32,
    /// Lifetime of a tentative holding on a replica that publishes KV
    /// events; zero turns approximate mode off (120 s). On a replica that has
    /// never published one, a holding lives for the tenant's TTL instead
    /// (`tentative.rs`).
    pub tentative_ttl: Duration,
    /// Bounded-load factor: a replica whose recent hint count exceeds this
    /// times the fleet mean (plus one) is not a candidate unless all are;
    /// zero turns the rule off (1.25).
    pub load_bound: f64,
}

impl Default for TtftWeights {
    fn default() -> Self {
        Self {
            prefill_us_per_token: 50.0,
            request_overhead_us: 5_000.0,
            pressure_us: 50_000.0,
            t2_reload: 0.25,
            t3_reload: 0.75,
            affinity_max_pressure: 1.0,
            tentative_ttl: Duration::from_secs(120),
            load_bound: 1.25,
        }
    }
}

impl TtftWeights {
    /// Share of a match's tokens that is free on `tier`.
    pub fn credit(&self, tier: Tier) -> f64 {
        match tier {
            Tier::T1 => 1.0,
            Tier::T2 => (1.0 - self.t2_reload).clamp(0.0, 1.0),
            Tier::T3 => (1.0 - self.t3_reload).clamp(0.0, 1.0),
            _ => 0.0,
        }
    }

    /// Prefill work of `uncached` tokens, µs.
    pub fn work_us(&self, uncached: f64) -> f64 {
        self.request_overhead_us.max(0.0) + self.prefill_us_per_token.max(0.0) * uncached.max(1.0)
    }
}

/// Per-lookup inputs of [`Index::route_ttft`], resolved by the caller from
/// policy.
#[derive(Debug, Clone, Copy)]
pub struct RouteParams<'a> {
    /// Estimate weights.
    pub weights: TtftWeights,
    /// Shortest match that counts as a PREFIX_MATCH (policy
    /// `minimumMatchedTokens`).
    pub min_matched_tokens: i32,
    /// Ignore every match (the minimum-prefix gate demoted the request).
    pub ignore_matches: bool,
    /// Affinity seed (chain seed or exact key); empty → the first tied replica.
    pub seed: &'a [u8],
}

/// One live replica's estimate (diagnostics and tests).
#[derive(Debug, Clone, PartialEq)]
pub struct Estimate {
    /// Replica.
    pub replica_id: Arc<str>,
    /// Leading run, tokens (real + tentative).
    pub matched_tokens: i32,
    /// Of which from tentative holdings.
    pub tentative_tokens: i32,
    /// Delivered-hint window, µs.
    pub queued_us: f64,
    /// Reported pressure used.
    pub pressure: f32,
    /// This request's prefill work there, µs.
    pub work_us: f64,
    /// Estimated time to first token, µs.
    pub ttft_us: f64,
}

/// The outcome of [`Index::route_ttft`] (named scores) and
/// [`Index::route_ttft_by_id`] ([`ScoreById`]s).
#[derive(Debug, Clone)]
pub struct TtftRoute<S = ReplicaScore> {
    /// PREFIX_MATCH (the pick first) or a miss (`None` / `Unknown*`).
    pub result: LookupRouteResult<S>,
    /// A miss's pick, for AFFINITY_HINT (`None` when no replica is live).
    pub pick: Option<Arc<str>>,
    /// What delivering the pick means, for [`Index::record_delivery`]
    /// (`None` when no replica is live).
    pub delivery: Option<Delivery>,
    /// Every live replica's estimate, best first: filled by
    /// [`Index::route_ttft_explained`] only.
    pub estimates: Vec<Estimate>,
}

impl<S> Default for TtftRoute<S> {
    fn default() -> Self {
        Self {
            result: LookupRouteResult::default(),
            pick: None,
            delivery: None,
            estimates: Vec::new(),
        }
    }
}

impl TtftRoute<ScoreById> {
    /// The route with named scores.
    pub fn named(self) -> TtftRoute {
        TtftRoute {
            result: self.result.named(),
            pick: self.pick,
            delivery: self.delivery,
            estimates: self.estimates,
        }
    }
}

/// The lookup path's route (scores by id).
pub(crate) type IdRoute = TtftRoute<ScoreById>;

/// The pick of [`Index::route_ttft`], as [`Index::record_delivery`] needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// The replica.
    pub replica_id: Arc<str>,
    /// The request's estimated prefill work there, µs.
    pub work_us: f64,
    /// Leading blocks it already holds for real (no tentative holding needed).
    pub real_blocks: usize,
}

/// What [`Index::record_delivery`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryOutcome {
    /// Tentative holdings written (new or renewed).
    pub tentative_stored: u64,
    /// Tentative holdings refused at the overlay's bound.
    pub tentative_dropped: u64,
}

pub(crate) fn score_of(est_us: f64) -> f32 {
    (1e6 / (1e6 + est_us.max(0.0))) as f32
}

thread_local! {
    static FLEET: std::cell::RefCell<Fleet> = std::cell::RefCell::default();
    static MATCHES: std::cell::RefCell<Matches> = std::cell::RefCell::default();
    static ORDER: std::cell::RefCell<OrderBufs> = std::cell::RefCell::new(OrderBufs::default());
    static KEYS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The replica id of this thread's last pick: its delivery checks it
    /// ([`crate::catalog::Catalog::replica_still`]) instead of finding the
    /// name (a string hash) again.
    static LAST_PICK: std::cell::Cell<u32> = const { std::cell::Cell::new(u32::MAX) };
}

/// Per-thread buffers of an answer's order: the keys and
/// [`crate::spread_sort::sort`]'s own.
#[derive(Default)]
pub(crate) struct OrderBufs {
    order: Vec<u128>,
    tmp: Vec<u128>,
    counts: Vec<u32>,
}

/// Per-thread buffers of one default-ranking lookup's matches: a lookup
/// takes them and puts them back, so none of its lists is allocated anew.
#[derive(Default)]
pub(crate) struct Matches {
    /// Real runs.
    pub(crate) raws: Vec<Raw>,
    /// Tentative extensions: (replica, tokens).
    pub(crate) tentative: Vec<(u32, i32)>,
    /// Buffers of [`Index::tentative_runs_into`].
    probe: Probe,
}

/// Buffers of [`Index::tentative_runs_into`].
#[derive(Default)]
pub(crate) struct Probe {
    /// The request's keys in the partition.
    keys: Vec<u64>,
    /// By replica id: 1 + the end of its real run; 0: none (cleared after
    /// each lookup).
    start_at: Vec<u32>,
    /// The overlay's runs: (replica, start, blocks).
    found: Vec<(u32, usize, usize)>,
    /// The chain's token counts' prefix sums (`sums[i]`: blocks `..i`).
    sums: Vec<i64>,
}

impl Index {
    /// Estimated-TTFT ranking of one request (module docs). Never mutates the
    /// index: the caller reports a delivered hint with
    /// [`Index::record_delivery`]. `estimates` stays empty: see
    /// [`Index::route_ttft_explained`].
    pub fn route_ttft<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
        p: &RouteParams<'_>,
    ) -> TtftRoute {
        self.route_ttft_with(req, p, false).named()
    }

    /// [`Index::route_ttft`] with its scores by replica id (the server's
    /// path: no reference count per score).
    pub fn route_ttft_by_id<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
        p: &RouteParams<'_>,
    ) -> IdRoute {
        self.route_ttft_with(req, p, false)
    }

    /// [`Index::route_ttft`] with every live replica's estimate, best first,
    /// in `estimates` (diagnostics and tests; the lookup path asks for none).
    pub fn route_ttft_explained<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
        p: &RouteParams<'_>,
    ) -> TtftRoute {
        self.route_ttft_with(req, p, true).named()
    }

    fn route_ttft_with<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
        p: &RouteParams<'_>,
        explain: bool,
    ) -> IdRoute {
        let mut out = IdRoute::default();
        if req.tenant.is_empty() || req.model.is_empty() || req.hash_scheme.is_empty() {
            return out;
        }
        let chain = req.is_chain_bearing();
        if chain && req.block_hashes.len() != req.block_token_counts.len() {
            return out;
        }
        if !chain && req.prefix_hash.is_empty() {
            return out;
        }
        let now = self.now();
        let ttl = self.request_ttl_ns(req);
        // A partition names its (tenant, model) and scope: from the thread's
        // partition cache, no catalog lock and no string-keyed finds.
        // Its ids only (no reference count taken).
        let ids = self.with_partition(req.tenant, req.model, req.hash_scheme, req.adapter, |p| {
            (p.tm_id, p.scope_id, p.id)
        });
        let (tm, scope, part) = match ids {
            Some((tm, scope, id)) => (Some(tm), Some(scope), Some(id)),
            None => {
                let c = read(&self.store.catalog);
                (
                    c.find_tm(req.tenant, req.model),
                    c.find_scope(req.tenant, req.model, req.hash_scheme),
                    None,
                )
            }
        };
        let Some(tm) = tm else {
            out.result.strategy = self.classify_miss(req.tenant, req.model, req.hash_scheme);
            return out;
        };

        // Matches: real runs, then tentative extensions, into the thread's
        // buffers (taken, not borrowed: nothing below can find them in use).
        let mut m = MATCHES.with(|m| std::mem::take(&mut *m.borrow_mut()));
        m.raws.clear();
        m.tentative.clear();
        if let (Some(pt), false) = (part, p.ignore_matches) {
            if chain {
                self.chain_raws_into(pt, req, now, ttl, |_| true, &mut m.raws);
            } else {
                self.exact_raws(pt, req.prefix_hash, now, ttl, &mut m.raws);
            }
            if chain && self.routing.tentative.active() {
                self.tentative_runs_into(pt, req, &m.raws, now, &mut m.probe, &mut m.tentative);
            }
        }
        self.route_matched(
            req,
            p,
            chain,
            (tm, scope, part),
            (ttl, now),
            &m.raws,
            &m.tentative,
            explain,
            &mut out,
        );
        MATCHES.with(|c| *c.borrow_mut() = m);
        out
    }

    /// [`Index::route_ttft_with`] once the matches are known.
    #[allow(clippy::too_many_arguments)]
    fn route_matched<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
        p: &RouteParams<'_>,
        chain: bool,
        (tm, scope, part): (u32, Option<u32>, Option<u32>),
        (ttl, now): (i64, i64),
        raws: &[Raw],
        tentative: &[(u32, i32)],
        explain: bool,
        out: &mut IdRoute,
    ) {
        let prompt: f64 = if chain {
            // Summed as integers (exact, as the float sum of these counts
            // is below 2^53): one add a block, not a chain of float adds.
            req.block_token_counts
                .iter()
                .map(|&c| i64::from(c.max(0)))
                .sum::<i64>() as f64
        } else {
            let stored = raws.iter().map(|r| r.tokens).max().unwrap_or(0);
            f64::from(req.prefix_token_count.max(stored).max(0))
        };

        // The lookup path: the fleet set (`cold.rs`), O(matched + busy +
        // log fleet); the estimates of every replica take the pass below.
        if !explain
            && self.route_cold(
                req,
                p,
                chain,
                part,
                (tm, scope, ttl, now),
                raws,
                tentative,
                prompt,
                out,
            )
        {
            return;
        }
        crate::scratch::with(&FLEET, |f: &mut Fleet| {
            // The fleet: fresh stats ∪ serving scope ∪ anyone matched.
            self.gather_live(f, tm, scope, now, ttl, |_, _| {});
            f.note_matches(raws.iter().map(|x| x.replica), tentative);

            let w = &p.weights;
            let mut cands = std::mem::take(&mut f.cands);
            cands.clear();
            let mean = {
                let load = self.routing.load.view(now);
                f.take(|r, pressure, usage, raw, ext| {
                    let (real, fresh, tier) = raw.map_or((0, 1.0, Tier::T1), |i| {
                        (raws[i].tokens.max(0), raws[i].fresh, raws[i].tier)
                    });
                    // A replica's matched depth is final here (real run,
                    // then its tentative extension): a rule that caps what a
                    // replica can reuse (e.g. hybrid models' window groups)
                    // applies to `real` / `ext` at this point.
                    let matched = real.saturating_add(ext);
                    let credited = f64::from(real) * w.credit(tier) * f64::from(fresh)
                        + f64::from(ext) * TENTATIVE_CREDIT;
                    let work = w.work_us(prompt - credited);
                    let queued = load.queued_us(r);
                    let recent_raw = load.raw_recent(r);
                    let recent = load.recent_of(recent_raw);
                    let est = queued + work + w.pressure_us.max(0.0) * f64::from(pressure.max(0.0));
                    cands.push(Cand {
                        replica: r,
                        raw,
                        tentative_tokens: ext,
                        matched,
                        queued,
                        recent,
                        recent_raw,
                        pressure,
                        usage,
                        work,
                        est,
                    });
                });
                let sum = cands.iter().map(|c| u128::from(c.recent_raw)).sum();
                load.mean_recent(sum, cands.len().max(1))
            };
            if cands.is_empty() {
                out.result.strategy = self.classify_miss(req.tenant, req.model, req.hash_scheme);
            } else {
                self.pick(
                    req,
                    p,
                    chain,
                    part,
                    raws,
                    &cands,
                    mean,
                    &mut f.tied,
                    explain,
                    out,
                );
            }
            f.cands = cands;
        });
    }

    /// The live fleet of `tm` into `f`, as every ranking gathers it:
    /// replicas seen within `ttl` (their pressure and KV usage only while
    /// their stats report is fresh) and the serving `scope`'s members.
    /// `live` sees each seen replica's stats and whether they are fresh (the
    /// fleet set, `cold.rs`, derives how long its gathering stays valid).
    pub(crate) fn gather_live(
        &self,
        f: &mut Fleet,
        tm: u32,
        scope: Option<u32>,
        now: i64,
        ttl: i64,
        mut live: impl FnMut(&crate::stats::StatsEntry, bool),
    ) {
        if let Some(stats) = self.stats.read_any() {
            if let Some(m) = stats.get(&tm) {
                // Lock order: stats → counters (no counters holder takes stats).
                let c = read(&self.store.counters);
                for (&r, s) in m {
                    if freshness(now, s.last_seen, ttl) > 0.0 {
                        let fresh_stats = freshness(now, s.stats_reported, ttl) > 0.0;
                        live(s, fresh_stats);
                        f.add(
                            r,
                            if fresh_stats {
                                s.ranking_pressure()
                            } else {
                                0.0
                            },
                        );
                        if let (true, Some(l)) = (fresh_stats, &s.load) {
                            f.set_usage(r, c.room_usage(r, l.kv_cache_usage));
                        }
                    }
                }
            }
        }
        if let Some(scope) = scope {
            let c = read(&self.store.counters);
            if let Some(sc) = c.scope(scope) {
                sc.replicas().for_each(|r| f.add(r, 0.0));
            }
        }
    }

    /// The pick among the fleet's `cands` (module docs), into `out`.
    #[allow(clippy::too_many_arguments)]
    fn pick<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
        p: &RouteParams<'_>,
        chain: bool,
        part: Option<u32>,
        raws: &[Raw],
        cands: &[Cand],
        mean: f64,
        tied: &mut Vec<(u64, u32, usize)>,
        explain: bool,
        out: &mut IdRoute,
    ) {
        let w = &p.weights;
        let floor = p.min_matched_tokens.max(1);
        let is_match = |c: &Cand| c.matched >= floor;
        // Busy replicas without a match are skipped, unless that leaves nobody.
        let pressure_ok = |c: &Cand| is_match(c) || c.pressure < w.affinity_max_pressure;
        let any_ok = cands.iter().any(pressure_ok);
        let ok = |c: &Cand| !any_ok || pressure_ok(c);
        // The bounded-load rule, unless it leaves nobody.
        let bound = w.load_bound;
        let limit = if bound.is_nan() || bound <= 0.0 {
            f64::INFINITY
        } else {
            bound * mean + 1.0
        };
        let under_any = limit.is_finite() && cands.iter().any(|c| ok(c) && c.recent <= limit);
        let eligible = |c: &Cand| ok(c) && (!under_any || c.recent <= limit);
        let best = cands
            .iter()
            .filter(|c| eligible(c))
            .map(|c| c.est)
            .fold(f64::INFINITY, f64::min);
        let catalog = read(&self.store.catalog);
        tied.clear();
        tied.extend(
            cands
                .iter()
                .enumerate()
                .filter(|(_, c)| eligible(c) && c.est <= best)
                .map(|(i, c)| (catalog.replica_label(c.replica), c.replica, i)),
        );
        // Among equals a new prefix goes where there is room.
        if let Some(room) = tied
            .iter()
            .filter_map(|t| room_bucket(cands[t.2].usage))
            .min()
        {
            tied.retain(|t| room_bucket(cands[t.2].usage) == Some(room));
        }
        if tied.is_empty() {
            return;
        }
        // The k-th tied replica in name order (labels follow the names' byte
        // order): a selection, not a sort.
        let k = if p.seed.is_empty() {
            0
        } else {
            tie_index(p.seed, tied.len())
        };
        let (_, _, pick) = *tied.select_nth_unstable_by_key(k, |t| (t.0, t.1)).1;
        self.answer(
            req, p, chain, part, raws, cands, pick, explain, &catalog, out,
        );
    }

    /// The answer for the pick `cands[pick]`: its delivery, the estimates
    /// when asked, and on a match the matched replicas' scores (pick first)
    /// with their LFU hits. `cands` holds every matched replica.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn answer<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
        p: &RouteParams<'_>,
        chain: bool,
        part: Option<u32>,
        raws: &[Raw],
        cands: &[Cand],
        pick: usize,
        explain: bool,
        catalog: &crate::catalog::Catalog,
        out: &mut IdRoute,
    ) {
        let floor = p.min_matched_tokens.max(1);
        let is_match = |c: &Cand| c.matched >= floor;
        let pick_name = catalog.replica_name(cands[pick].replica);
        out.delivery = Some(Delivery {
            replica_id: pick_name.clone(),
            work_us: cands[pick].work,
            real_blocks: cands[pick]
                .raw
                .filter(|_| chain)
                .map_or(0, |j| raws[j].blocks as usize),
        });
        LAST_PICK.set(cands[pick].replica);
        let rank = |a: &usize, b: &usize| {
            (*a != pick)
                .cmp(&(*b != pick))
                .then(cands[*a].est.total_cmp(&cands[*b].est))
                .then(cands[*a].replica.cmp(&cands[*b].replica))
        };
        if explain {
            let mut order: Vec<usize> = (0..cands.len()).collect();
            order.sort_by(rank);
            out.estimates = order
                .iter()
                .map(|&i| {
                    let c = &cands[i];
                    Estimate {
                        replica_id: catalog.replica_name(c.replica),
                        matched_tokens: c.matched,
                        tentative_tokens: c.tentative_tokens,
                        queued_us: c.queued,
                        pressure: c.pressure,
                        work_us: c.work,
                        ttft_us: c.est,
                    }
                })
                .collect();
        }
        if !is_match(&cands[pick]) {
            out.pick = Some(pick_name);
            return;
        }
        // Sorted by a key made once per replica (pick first, estimate,
        // replica id): keys are distinct (the replica decides last), so
        // unstable is exact, and no comparison reads `cands` again.
        let est_key = |e: f64| {
            // `f64::total_cmp`'s order as an integer.
            let b = e.to_bits() as i64;
            (b ^ ((((b >> 63) as u64) >> 1) as i64)) as u64 ^ (1 << 63)
        };
        // The pick, then the other matches by (estimate, replica id), each
        // packed in one integer (keys are distinct: the replica decides
        // last), in the thread's buffer.
        crate::scratch::with(&ORDER, |bufs: &mut OrderBufs| {
            let order = &mut bufs.order;
            order.clear();
            order.extend(
                cands
                    .iter()
                    .enumerate()
                    .filter(|&(i, c)| i != pick && is_match(c))
                    .map(|(i, c)| {
                        u128::from(est_key(c.est)) << 64 | u128::from(c.replica) << 32 | i as u128
                    }),
            );
            // Near-linear: the estimates spread the keys (`spread_sort.rs`).
            crate::spread_sort::sort(order, &mut bufs.tmp, &mut bufs.counts);
            let order = &bufs.order;
            let at = |k: usize| {
                if k == 0 {
                    pick
                } else {
                    (order[k - 1] & u128::from(u32::MAX)) as usize
                }
            };
            let n = order.len() + 1;
            let mut scores = crate::score_pool::take(n);
            // The LFU hits' runs in the same pass (real runs only: a
            // tentative holding has no entry to credit), where a second
            // pass chased the order, the candidate and its run again.
            let mut runs = Vec::with_capacity(if part.is_some() { n } else { 0 });
            for k in 0..n {
                let c = &cands[at(k)];
                let raw = c.raw.map(|j| &raws[j]);
                scores.push(ScoreById {
                    replica: ReplicaId(c.replica),
                    score: score_of(c.est),
                    matched_tokens: c.matched,
                    estimated_cache_hit_prob: raw.map_or(1.0, |r| r.fresh),
                    tier: raw.map_or(Tier::T1, |r| r.tier),
                });
                if let Some(r) = raw.filter(|r| r.tokens > 0 && part.is_some()) {
                    runs.push(HitRun {
                        replica: r.replica,
                        blocks: r.blocks,
                        matched_tokens: c.matched,
                    });
                }
            }
            // The names: the catalog's published table (one reference
            // count for the answer), else the scores' own.
            out.result.names = match catalog.replica_table_names() {
                Some(table) => ReplicaNames::table(table),
                None => ReplicaNames::of_ids(scores.iter().map(|s| s.replica.0), |id| {
                    catalog.replica_name(id)
                }),
            };
            out.result.scores = scores;
            out.result.strategy = Strategy::PrefixMatch;
            // Hits are captured for every tenant: `hot_prefixes` counts
            // delivered hits for LRU tenants too; only LFU eviction reads
            // the counters.
            if let Some(part) = part {
                out.result.hits = LfuHits::capture(part, req, runs);
            }
        });
    }

    /// Each replica's tentative extension of its real run: (replica, tokens).
    #[cfg(test)]
    pub(crate) fn tentative_runs<H: AsRef<[u8]>>(
        &self,
        part: u32,
        req: &LookupRequest<'_, H>,
        raws: &[Raw],
        now: i64,
    ) -> Vec<(u32, i32)> {
        let mut out = Vec::new();
        self.tentative_runs_into(part, req, raws, now, &mut Probe::default(), &mut out);
        out
    }

    /// Each replica's tentative extension of its real run (`raws`), into
    /// `out`: (replica, tokens).
    pub(crate) fn tentative_runs_into<H: AsRef<[u8]>>(
        &self,
        part: u32,
        req: &LookupRequest<'_, H>,
        raws: &[Raw],
        now: i64,
        m: &mut Probe,
        out: &mut Vec<(u32, i32)>,
    ) {
        out.clear();
        // Most lookups find no record that could start within the real
        // runs (at a position up to the deepest run's end): the overlay's
        // head counts say so before any table is built.
        let hashes = req.block_hashes;
        let upper = raws.iter().map(|x| x.blocks as usize).max().unwrap_or(0);
        if !self
            .routing
            .tentative
            .may_start(part, hashes.len(), upper, &mut m.keys, |i| {
                key_hash(part, hashes[i].as_ref())
            })
        {
            return;
        }
        // Real runs' ends by replica id, in the thread's table (the walk's
        // raws may come in any order; a replica's shortest run counts).
        for x in raws {
            let i = x.replica as usize;
            if m.start_at.len() <= i {
                m.start_at.resize((i + 1).next_power_of_two(), 0);
            }
            let s = &mut m.start_at[i];
            if *s == 0 || *s > x.blocks + 1 {
                *s = x.blocks + 1;
            }
        }
        let start_at = &m.start_at;
        let start_of = |r: u32| {
            start_at
                .get(r as usize)
                .map_or(0, |&s| s.saturating_sub(1) as usize)
        };
        let deepest = raws.iter().map(|x| start_of(x.replica)).max().unwrap_or(0);
        self.routing.tentative.runs(
            part,
            hashes.len(),
            &mut m.keys,
            |i| key_hash(part, hashes[i].as_ref()),
            deepest,
            start_of,
            now,
            &mut m.found,
        );
        for x in raws {
            if let Some(s) = m.start_at.get_mut(x.replica as usize) {
                *s = 0;
            }
        }
        if m.found.is_empty() {
            return;
        }
        // A run's tokens from the chain's prefix sums, made once: summing
        // each run's counts was O(blocks) per replica, ~a thousand adds a
        // lookup at 64 nested replicas (issue 36, session 48). The counts
        // are non-negative, so clamping the exact sum is the saturating
        // sum.
        let sums = &mut m.sums;
        sums.clear();
        sums.push(0i64);
        let mut acc = 0i64;
        for &c in req.block_token_counts {
            acc += i64::from(c.max(0));
            sums.push(acc);
        }
        let sums = &m.sums;
        out.extend(m.found.iter().filter_map(|&(r, start, n)| {
            let end = start.saturating_add(n).min(sums.len() - 1);
            let start = start.min(end);
            let tokens = (sums[end] - sums[start]).min(i64::from(i32::MAX)) as i32;
            (tokens > 0).then_some((r, tokens))
        }));
    }

    /// Reports a delivered hint: the pick's prefill work joins its queue
    /// (`load.rs`) and, when `tentative_ttl` is non-zero and the request
    /// carries a chain, the blocks past the replica's real run become its
    /// tentative holdings (`tentative.rs`): for `tentative_ttl` on a replica
    /// that publishes KV events, for the tenant's TTL on one that never has.
    pub fn record_delivery<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
        delivery: &Delivery,
        tentative_ttl: Duration,
    ) -> DeliveryOutcome {
        // Shared with ingest: the idle-replica release cannot run between
        // resolving the id and storing tentative holdings under it.
        let _gate = crate::sync::read(&self.store.gate);
        let now = self.now();
        // Past the replica limit the delivery is not tracked (the lookup
        // already answered; only the load estimate misses it).
        let found = {
            let c = read(&self.store.catalog);
            // The id this thread's last route picked, while the catalog
            // says it still names this replica; else found by name.
            let id = LAST_PICK.get();
            if c.replica_still(id, &delivery.replica_id) {
                Some(id)
            } else {
                c.find_replica(&delivery.replica_id)
            }
        };
        let Some(replica) =
            found.or_else(|| self.intern_replica(&delivery.replica_id).map(|(id, _)| id))
        else {
            return DeliveryOutcome::default();
        };
        self.routing.load.add(replica, delivery.work_us, now);
        let mut out = DeliveryOutcome::default();
        let chain_ok =
            !req.block_hashes.is_empty() && req.block_hashes.len() == req.block_token_counts.len();
        // The tie's room counts the blocks this request is about to store
        // (`counters.rs`), where the replica's pool size is known.
        let fresh = req.block_hashes.len().saturating_sub(delivery.real_blocks) as u64;
        if chain_ok
            && fresh > 0
            && self
                .store
                .pools_known
                .load(std::sync::atomic::Ordering::Acquire)
            && read(&self.store.counters).knows_pool(replica)
        {
            let block = req.block_token_counts.iter().copied().max().unwrap_or(0);
            write(&self.store.counters).note_intake(replica, fresh, block.max(0) as u32, now);
        }
        if tentative_ttl.is_zero() || !chain_ok || req.hash_scheme.is_empty() {
            return out;
        }
        // The partition's id from the thread's cache (the route resolved it).
        let (t, m, s, a) = (req.tenant, req.model, req.hash_scheme, req.adapter);
        let part = self
            .with_partition(t, m, s, a, |p| p.id)
            .unwrap_or_else(|| self.intern_partition(t, m, s, a).id);
        // One record: the chain past the real run, up to a block without a
        // hash (none of its blocks is a holding).
        let past = req.block_hashes.get(delivery.real_blocks..).unwrap_or(&[]);
        let short = crate::clock::duration_ns(tentative_ttl);
        let expires = crate::tentative::Expiry {
            publishing: now.saturating_add(short),
            // A silent replica's holdings are all the server knows of its
            // cache: they live as long as a real entry would.
            silent: now.saturating_add(short.max(self.request_ttl_ns(req))),
        };
        // The keys in the thread's buffer (the record copies them into a
        // recycled one).
        let (stored, dropped) = crate::scratch::with(&KEYS, |keys: &mut Vec<u64>| {
            keys.clear();
            keys.extend(
                past.iter()
                    .map(AsRef::as_ref)
                    .take_while(|h| !h.is_empty())
                    .map(|h| key_hash(part, h)),
            );
            self.routing
                .tentative
                .insert(part, replica, delivery.real_blocks as u32, keys, expires)
        });
        out.tentative_stored = stored;
        out.tentative_dropped = dropped;
        out
    }

    /// Hints delivered to a replica so far (all tenants).
    pub fn delivered_hints(&self, replica_id: &str) -> u64 {
        read(&self.store.catalog)
            .find_replica(replica_id)
            .map_or(0, |r| self.routing.load.delivered(r))
    }

    /// Tentative holdings stored (expired ones until the next sweep).
    pub fn tentative_entries(&self) -> u64 {
        self.routing.tentative.len() as u64
    }
}

/// LFU hits of the delivered matches: their real runs only (a tentative
/// holding has no entry to credit). `runs[i]` is the raw of `scores[i]`.
#[cfg(test)]
pub(crate) fn lfu_hits<H: AsRef<[u8]>>(
    part: u32,
    req: &LookupRequest<'_, H>,
    raws: &[Raw],
    runs: &[Option<usize>],
    scores: &[ReplicaScore],
) -> LfuHits {
    let runs: Vec<HitRun> = runs
        .iter()
        .zip(scores)
        .filter_map(|(&j, s)| j.map(|j| (&raws[j], s)))
        .filter(|(r, _)| r.tokens > 0)
        .map(|(r, s)| HitRun {
            replica: r.replica,
            blocks: r.blocks,
            matched_tokens: s.matched_tokens,
        })
        .collect();
    LfuHits::capture(part, req, runs)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_reported_request_stands_for_the_default_weights_work() {
        let w = super::TtftWeights::default();
        assert_eq!(
            w.work_us(crate::load::REPORTED_REQUEST_TOKENS),
            crate::load::DEFAULT_REQUEST_WORK_US
        );
    }
}

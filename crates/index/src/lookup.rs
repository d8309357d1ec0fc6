//! Lookup (§2.6): orchestrator, exact and chain lookups, TENANT_HOT, LFU credit.

use crate::arena::Credit;
use crate::catalog::Partition;
use crate::chain::{Run, walk};
use crate::clock::duration_ns;
use crate::entries::holder;
use crate::index::Index;
use crate::key::KeyRef;
use crate::ranking::{
    distinguishing_power, freshness, prefix_score, pressure_factor, recency, slo_coefficient,
};
use crate::replica_table::Names;
use crate::sync::read;
use crate::types::{
    HitKeys, HitRun, LfuHits, LookupRequest, LookupRouteResult, ReplicaId, ReplicaNames,
    ReplicaScore, ScoreById, Strategy, Tier,
};
use std::cell::RefCell;
use std::cmp::Ordering;
use std::sync::Arc;
use std::sync::atomic::Ordering as AtomicOrdering;

/// A matched replica before names and stats are attached.
pub(crate) struct Raw {
    pub(crate) replica: u32,
    pub(crate) tokens: i32,
    pub(crate) fresh: f32,
    pub(crate) tier: Tier,
    /// Chain: number of leading blocks in the run (LFU capture).
    pub(crate) blocks: u32,
}

struct Ctx<'a> {
    now: i64,
    ttl: i64,
    c: f32,
    part: &'a Partition,
}

/// How a lookup scales its scores by distinguishing power (§2.6.4).
#[derive(Clone, Copy)]
enum Power {
    /// One factor for every replica (exact lookups).
    Uniform(f32),
    /// Depth-aware (chain lookups): a replica's factor counts every replica
    /// matched at least as deep, out of `serving`.
    ByDepth { serving: i64 },
}

/// One score before its name is attached: score, the order label of the
/// replica's name, the raw's position.
type Key = (f32, u64, u32);

/// Score descending, then replica name ascending through the names' order
/// labels ([`crate::catalog::Catalog::replica_label`]): no string is read.
fn by_rank(a: &Key, b: &Key) -> Ordering {
    b.0.partial_cmp(&a.0)
        .unwrap_or(Ordering::Equal)
        .then(a.1.cmp(&b.1))
}

/// Multiplies every score of `keys` by the distinguishing power `dp`.
fn scale(keys: &mut [Key], dp: f32) {
    if dp != 1.0 {
        keys.iter_mut().for_each(|k| k.0 *= dp);
    }
}

/// Scales the scores of `keys` (made from `raws`) by `power`.
fn apply_power(keys: &mut [Key], raws: &[Raw], power: Power) {
    match power {
        Power::Uniform(dp) => scale(keys, dp),
        Power::ByDepth { serving }
            if serving > 1 && raws.iter().all(|r| r.tokens == raws[0].tokens) =>
        {
            // One depth (every run stopped at the same block, the usual
            // short lookup): one factor, no sort.
            let dp = distinguishing_power(keys.len() as i64, serving) as f32;
            scale(keys, dp);
        }
        Power::ByDepth { serving } if serving > 1 => {
            // Deepest first; a group's factor counts every replica at
            // least that deep.
            let depth = |k: &Key| raws[k.2 as usize].tokens;
            keys.sort_unstable_by_key(|k| std::cmp::Reverse(depth(k)));
            let mut at = 0;
            while at < keys.len() {
                let d = depth(&keys[at]);
                let end = at + keys[at..].iter().take_while(|k| depth(k) == d).count();
                let dp = distinguishing_power(end as i64, serving) as f32;
                scale(&mut keys[at..end], dp);
                at = end;
            }
        }
        Power::ByDepth { .. } => {}
    }
}

/// Order `keys` by [`by_rank`] and make each one's score with `make`
/// (given the score and the key's position), names attached last so the
/// sort reads none.
fn ranked(keys: &mut [Key], mut make: impl FnMut(f32, usize) -> ScoreById) -> Vec<ScoreById> {
    keys.sort_unstable_by(by_rank);
    let mut scores = crate::score_pool::take(keys.len());
    scores.extend(keys.iter().map(|&(score, _, i)| make(score, i as usize)));
    scores
}

thread_local! {
    /// Per-thread ranking buffer, reused by every lookup on the thread.
    static RANK: RefCell<Vec<Key>> = const { RefCell::new(Vec::new()) };
    /// Per-thread matched replicas of a lookup, reused likewise.
    static RAWS: RefCell<Vec<Raw>> = const { RefCell::new(Vec::new()) };
    /// Per-thread hits of a credit, reused likewise.
    static CREDITS: RefCell<Vec<Credit>> = const { RefCell::new(Vec::new()) };
}

impl Index {
    /// The index-level orchestrator (§2.6.1): PREFIX_MATCH → TENANT_HOT (non-chain
    /// only) → miss classifier. A request without any fingerprint input (no
    /// prefix hash, no chain) is `None` (spec decision 4).
    pub fn lookup_route<H: AsRef<[u8]>>(&self, req: &LookupRequest<'_, H>) -> LookupRouteResult {
        self.lookup_route_by_id(req).named()
    }

    /// [`Index::lookup_route`] with its scores by replica id (the server's
    /// path: no reference count per score).
    pub fn lookup_route_by_id<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
    ) -> LookupRouteResult<ScoreById> {
        if req.tenant.is_empty() || req.model.is_empty() || req.hash_scheme.is_empty() {
            return LookupRouteResult::default();
        }
        if req.is_chain_bearing() {
            if req.block_hashes.len() != req.block_token_counts.len() {
                return LookupRouteResult::default();
            }
            let r = self.chain_lookup(req);
            if !r.scores.is_empty() {
                return r;
            }
            return self.classified(req);
        }
        if req.prefix_hash.is_empty() {
            return LookupRouteResult::default();
        }
        let r = self.exact_lookup(req);
        if !r.scores.is_empty() {
            return r;
        }
        // A policy that disables TENANT_HOT: not computed at all.
        let hot = if req.policy.is_none_or(|p| p.tenant_hot) {
            self.tenant_hot_by_id(req.tenant, req.model, req.hash_scheme, req.slo_ttft_ms)
        } else {
            None
        };
        if let Some((scores, names)) = hot {
            return LookupRouteResult {
                strategy: Strategy::TenantHot,
                scores,
                hits: LfuHits::default(),
                names,
            };
        }
        self.classified(req)
    }

    fn classified<H>(&self, req: &LookupRequest<'_, H>) -> LookupRouteResult<ScoreById> {
        LookupRouteResult {
            strategy: self.classify_miss(req.tenant, req.model, req.hash_scheme),
            ..LookupRouteResult::default()
        }
    }

    /// The low-level lookup used by the probe: empty scheme → empty; mismatched
    /// chain → empty; chain → chain lookup; else exact lookup. No emptiness
    /// checks on tenant/model, no TENANT_HOT, no classifier. The strategy is
    /// `PrefixMatch` when anything matched.
    pub fn lookup<H: AsRef<[u8]>>(&self, req: &LookupRequest<'_, H>) -> LookupRouteResult {
        self.lookup_by_id(req).named()
    }

    /// [`Index::lookup`] with its scores by replica id.
    pub fn lookup_by_id<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
    ) -> LookupRouteResult<ScoreById> {
        if req.hash_scheme.is_empty() {
            return LookupRouteResult::default();
        }
        if req.is_chain_bearing() {
            if req.block_hashes.len() != req.block_token_counts.len() {
                return LookupRouteResult::default();
            }
            return self.chain_lookup(req);
        }
        self.exact_lookup(req)
    }

    /// The partition-bound part of a lookup: `None` (an empty answer) when
    /// the partition does not exist. The partition is borrowed from the
    /// thread's cache: no reference count is taken.
    fn in_partition<H>(
        &self,
        req: &LookupRequest<'_, H>,
        f: impl FnOnce(&Ctx<'_>) -> LookupRouteResult<ScoreById>,
    ) -> LookupRouteResult<ScoreById> {
        self.with_partition(
            req.tenant,
            req.model,
            req.hash_scheme,
            req.adapter,
            |part| {
                f(&Ctx {
                    now: self.now(),
                    ttl: self.request_ttl_ns(req),
                    c: slo_coefficient(&self.settings.ranking, req.slo_ttft_ms),
                    part,
                })
            },
        )
        .unwrap_or_default()
    }

    fn exact_lookup<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
    ) -> LookupRouteResult<ScoreById> {
        self.in_partition(req, |ctx| {
            let ranked = |raws: &mut Vec<Raw>| {
                self.exact_raws(ctx.part.id, req.prefix_hash, ctx.now, ctx.ttl, raws);
                if raws.is_empty() {
                    return LookupRouteResult::default();
                }
                let total = ctx.part.serving.load(AtomicOrdering::Relaxed) as i64;
                let dp = distinguishing_power(raws.len() as i64, total) as f32;
                let (scores, names) = self.score_raws(ctx, raws, Power::Uniform(dp));
                // Hits are captured for every tenant: delivered hits count
                // towards hot_prefixes everywhere, and only LFU tenants'
                // eviction reads them.
                let mut runs = Vec::with_capacity(raws.len());
                runs.extend(raws.iter().filter(|r| r.tokens > 0).map(|r| HitRun {
                    replica: r.replica,
                    blocks: 1,
                    matched_tokens: r.tokens,
                }));
                LookupRouteResult {
                    strategy: Strategy::PrefixMatch,
                    scores,
                    hits: LfuHits::capture(ctx.part.id, req, runs),
                    names,
                }
            };
            crate::scratch::with(&RAWS, ranked)
        })
    }

    fn chain_lookup<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
    ) -> LookupRouteResult<ScoreById> {
        self.in_partition(req, |ctx| {
            let (now, ttl) = (ctx.now, ctx.ttl);
            let ranked = |raws: &mut Vec<Raw>| {
                walk(
                    &self.store.entries,
                    ctx.part.id,
                    req.block_hashes,
                    req.block_token_counts,
                    now,
                    ttl,
                    |runs: &[Run]| fresh_raws(runs, now, ttl, |r| r.matched > 0, raws),
                );
                if raws.is_empty() {
                    return LookupRouteResult::default();
                }
                let serving = ctx.part.serving.load(AtomicOrdering::Relaxed) as i64;
                let (scores, names) = self.score_raws(ctx, raws, Power::ByDepth { serving });
                let runs = raws.iter().map(|r| HitRun {
                    replica: r.replica,
                    blocks: r.blocks,
                    matched_tokens: r.tokens,
                });
                let hits = LfuHits::capture(ctx.part.id, req, runs.collect());
                LookupRouteResult {
                    strategy: Strategy::PrefixMatch,
                    scores,
                    hits,
                    names,
                }
            };
            crate::scratch::with(&RAWS, ranked)
        })
    }

    /// The fresh holders of one exact key, into `raws` (cleared first).
    pub(crate) fn exact_raws(
        &self,
        part: u32,
        hash: &[u8],
        now: i64,
        ttl: i64,
        raws: &mut Vec<Raw>,
    ) {
        raws.clear();
        let key = KeyRef::new(part, hash);
        self.store.entries.holders(&key, |holders| {
            raws.extend(holders.iter().filter_map(|h| {
                let fresh = freshness(now, h.last_seen, ttl);
                (fresh > 0.0).then_some(Raw {
                    replica: h.replica(),
                    tokens: h.tokens,
                    fresh,
                    tier: h.tier(),
                    blocks: 1,
                })
            }))
        });
    }

    /// Every replica's leading run over the request's chain (weakest-link
    /// freshness), in replica-id order, keeping the runs `keep` accepts.
    #[cfg(test)]
    pub(crate) fn chain_raws<H: AsRef<[u8]>>(
        &self,
        part: u32,
        req: &LookupRequest<'_, H>,
        now: i64,
        ttl: i64,
        keep: impl Fn(&Run) -> bool,
    ) -> Vec<Raw> {
        let mut raws = Vec::new();
        self.chain_raws_into(part, req, now, ttl, keep, &mut raws);
        raws
    }

    /// [`Index::chain_raws`] into `raws` (cleared first).
    pub(crate) fn chain_raws_into<H: AsRef<[u8]>>(
        &self,
        part: u32,
        req: &LookupRequest<'_, H>,
        now: i64,
        ttl: i64,
        keep: impl Fn(&Run) -> bool,
        raws: &mut Vec<Raw>,
    ) {
        raws.clear();
        walk(
            &self.store.entries,
            part,
            req.block_hashes,
            req.block_token_counts,
            now,
            ttl,
            |runs: &[Run]| fresh_raws(runs, now, ttl, keep, raws),
        );
    }

    /// Rank `raws`: stats pressure (gated by stats freshness under the
    /// tenant TTL), the SLO bias and the distinguishing power make each
    /// score; the scores come back ordered by score descending, then
    /// replica name ascending, by id, with the names of the ids.
    fn score_raws(
        &self,
        ctx: &Ctx<'_>,
        raws: &[Raw],
        power: Power,
    ) -> (Vec<ScoreById>, ReplicaNames) {
        // No lock at all when no replica reports stats.
        let stats = self.stats.read_any();
        let per_replica = stats.as_ref().and_then(|s| s.get(&ctx.part.tm_id));
        let rank = |keys: &mut Vec<Key>, names: Names<'_>| {
            keys.clear();
            keys.extend(raws.iter().enumerate().map(|(i, r)| {
                let pressure = per_replica
                    .and_then(|m| m.get(&r.replica))
                    .filter(|s| freshness(ctx.now, s.stats_reported, ctx.ttl) > 0.0)
                    .map_or(0.0, |s| s.pressure);
                let pf = pressure_factor(self.settings.ranking.pressure_weight, pressure);
                let score = prefix_score(r.tokens, r.fresh, pf, ctx.c);
                (score, names.label(r.replica), i as u32)
            }));
            apply_power(keys, raws, power);
            let scores = ranked(keys, |score, i| {
                let r = &raws[i];
                ScoreById {
                    replica: ReplicaId(r.replica),
                    score,
                    matched_tokens: r.tokens,
                    estimated_cache_hit_prob: r.fresh,
                    tier: r.tier,
                }
            });
            (scores, names.for_answer(raws.iter().map(|r| r.replica)))
        };
        self.with_names(|names| crate::scratch::with(&RANK, |keys| rank(keys, names)))
    }

    /// TENANT_HOT candidates (§2.6.5) for (tenant, model, scheme).
    pub fn tenant_hot(
        &self,
        tenant: &str,
        model: &str,
        scheme: &str,
        slo_ttft_ms: i32,
    ) -> Vec<ReplicaScore> {
        self.tenant_hot_by_id(tenant, model, scheme, slo_ttft_ms)
            .map(|(scores, names)| scores.iter().map(|s| s.named(&names)).collect())
            .unwrap_or_default()
    }

    /// [`Index::tenant_hot`] by replica id, with the ids' names; `None`
    /// when there is no candidate.
    fn tenant_hot_by_id(
        &self,
        tenant: &str,
        model: &str,
        scheme: &str,
        slo_ttft_ms: i32,
    ) -> Option<(Vec<ScoreById>, ReplicaNames)> {
        let max_age = duration_ns(self.settings.ranking.tenant_hot_max_age);
        if max_age <= 0 || scheme.is_empty() {
            return None;
        }
        let ids = {
            let c = read(&self.store.catalog);
            c.find_tm(tenant, model)
                .zip(c.find_scope(tenant, model, scheme))
        };
        let (tm, scope) = ids?;
        let now = self.now();
        let mut cands: Vec<(u32, f32, f32, i64)> = {
            let stats = self.stats.read();
            let m = stats.get(&tm)?;
            m.iter()
                .filter(|(_, s)| {
                    now.saturating_sub(s.stats_reported) < max_age
                        && s.hit_rate >= self.settings.ranking.tenant_hot_min_hit_rate
                })
                .map(|(&r, s)| {
                    (
                        r,
                        s.hit_rate,
                        s.pressure,
                        now.saturating_sub(s.stats_reported),
                    )
                })
                .collect()
        };
        {
            let c = read(&self.store.counters);
            cands.retain(|(r, ..)| c.serves(scope, *r));
        }
        if cands.is_empty() {
            return None;
        }
        let c = slo_coefficient(&self.settings.ranking, slo_ttft_ms);
        self.with_names(|names| {
            let mut keys: Vec<Key> = cands
                .iter()
                .enumerate()
                .map(|(i, &(r, hit_rate, pressure, age))| {
                    let rec = recency(age, max_age);
                    let pf = pressure_factor(self.settings.ranking.pressure_weight, pressure);
                    let slo = 1.0 + rec * c;
                    (hit_rate * rec * pf * slo, names.label(r), i as u32)
                })
                .collect();
            let scores = ranked(&mut keys, |score, i| {
                let (r, hit_rate, ..) = cands[i];
                ScoreById {
                    replica: ReplicaId(r),
                    score,
                    matched_tokens: 0,
                    estimated_cache_hit_prob: hit_rate,
                    tier: Tier::UNSPECIFIED,
                }
            });
            Some((scores, names.for_answer(cands.iter().map(|c| c.0))))
        })
    }

    /// Credit delivered LFU hits (+1 each). Hits whose entry has since been
    /// removed are ignored. A chain of 8-byte keys (every engine's) is
    /// credited run by run ([`crate::arena::ChainArena::credit`]: one edit
    /// per run and replica); other keys one at a time.
    pub fn credit(&self, hits: &LfuHits) {
        if let HitKeys::Short { part, hashes } = &hits.keys {
            crate::scratch::with(&CREDITS, |credits| {
                credits.clear();
                credits.extend(hits.runs.iter().map(|h| Credit {
                    replica: h.replica,
                    blocks: h.blocks,
                }));
                self.store.entries.arena().credit(
                    *part,
                    hashes.len(),
                    |i| u64::from_le_bytes(hashes[i]),
                    &mut credits[..],
                );
            });
            return;
        }
        for h in &hits.runs {
            hits.keys.each_first(h.blocks as usize, |key| {
                self.store.entries.credit(key, h.replica);
            });
        }
    }

    /// Diagnostic: the replica and the number of entries of each captured
    /// run in `hits` (a name the sweep has since released reads as empty).
    pub fn hit_replicas(&self, hits: &LfuHits) -> Vec<(Arc<str>, usize)> {
        let catalog = read(&self.store.catalog);
        hits.runs
            .iter()
            .map(|h| (catalog.replica_name(h.replica), h.blocks as usize))
            .collect()
    }

    /// Diagnostic: the LFU access count of one (prefix key, replica) entry.
    pub fn access_count(
        &self,
        tenant: &str,
        model: &str,
        scheme: &str,
        adapter: &str,
        hash: &[u8],
        replica_id: &str,
    ) -> Option<u64> {
        let part = self.find_partition(tenant, model, scheme, adapter)?;
        let replica = read(&self.store.catalog).find_replica(replica_id)?;
        let key = KeyRef::new(part.id, hash);
        self.store
            .entries
            .holders(&key, |held| Some(held.access(holder::find(held, replica)?)))?
    }
}

/// The runs `keep` accepts that are still fresh, as raws, into `raws`
/// (cleared first).
fn fresh_raws(runs: &[Run], now: i64, ttl: i64, keep: impl Fn(&Run) -> bool, raws: &mut Vec<Raw>) {
    raws.clear();
    // One allocation, not a doubling per push (a new list each lookup on
    // the default path).
    raws.reserve(runs.len());
    for r in runs.iter().filter(|r| keep(r)) {
        let fresh = freshness(now, r.oldest, ttl);
        if fresh > 0.0 {
            raws.push(Raw {
                replica: r.replica,
                tokens: r.matched,
                fresh,
                tier: r.tier,
                blocks: r.blocks,
            });
        }
    }
}

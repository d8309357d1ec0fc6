//! Lookup (§2.6): orchestrator, exact and chain lookups, TENANT_HOT, LFU credit.

use crate::catalog::Partition;
use crate::chain::{Run, walk};
use crate::clock::duration_ns;
use crate::holder;
use crate::index::Index;
use crate::key::{EntryKey, KeyRef};
use crate::ranking::{
    distinguishing_power, freshness, prefix_score, pressure_factor, recency, slo_coefficient,
};
use crate::shard::read;
use crate::types::{
    HitRun, LfuHits, LookupRequest, LookupRouteResult, ReplicaScore, Strategy, Tier,
};
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

struct Ctx {
    now: i64,
    ttl: i64,
    c: f32,
    part: Arc<Partition>,
}

fn by_score(a: &ReplicaScore, b: &ReplicaScore) -> Ordering {
    b.score
        .partial_cmp(&a.score)
        .unwrap_or(Ordering::Equal)
        .then_with(|| a.replica_id.cmp(&b.replica_id))
}

impl Index {
    /// The index-level orchestrator (§2.6.1): PREFIX_MATCH → TENANT_HOT (non-chain
    /// only) → miss classifier. A request without any fingerprint input (no
    /// prefix hash, no chain) is `None` (spec decision 4).
    pub fn lookup_route<H: AsRef<[u8]>>(&self, req: &LookupRequest<'_, H>) -> LookupRouteResult {
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
            self.tenant_hot(req.tenant, req.model, req.hash_scheme, req.slo_ttft_ms)
        } else {
            Vec::new()
        };
        if !hot.is_empty() {
            return LookupRouteResult {
                strategy: Strategy::TenantHot,
                scores: hot,
                hits: LfuHits::default(),
            };
        }
        self.classified(req)
    }

    fn classified<H>(&self, req: &LookupRequest<'_, H>) -> LookupRouteResult {
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

    fn ctx<H>(&self, req: &LookupRequest<'_, H>) -> Option<Ctx> {
        let part = self.find_partition(req.tenant, req.model, req.hash_scheme, req.adapter)?;
        Some(Ctx {
            now: self.now(),
            ttl: self.request_ttl_ns(req),
            c: slo_coefficient(&self.settings.ranking, req.slo_ttft_ms),
            part,
        })
    }

    fn exact_lookup<H>(&self, req: &LookupRequest<'_, H>) -> LookupRouteResult {
        let Some(ctx) = self.ctx(req) else {
            return LookupRouteResult::default();
        };
        let key = KeyRef::new(ctx.part.id, req.prefix_hash);
        let raws = self.exact_raws(ctx.part.id, req.prefix_hash, ctx.now, ctx.ttl);
        if raws.is_empty() {
            return LookupRouteResult::default();
        }
        let mut scores = self.score_raws(&ctx, &raws);
        let total = ctx.part.serving.load(AtomicOrdering::Relaxed) as i64;
        let dp = distinguishing_power(scores.len() as i64, total);
        if dp != 1.0 {
            for s in &mut scores {
                s.score *= dp as f32;
            }
        }
        // Hits are captured for every tenant: delivered hits count towards
        // hot_prefixes everywhere, and only LFU tenants' eviction reads them.
        let mut hits = LfuHits::default();
        hits.runs
            .extend(raws.iter().filter(|r| r.tokens > 0).map(|r| HitRun {
                replica: r.replica,
                blocks: 1,
                matched_tokens: r.tokens,
            }));
        if !hits.runs.is_empty() {
            hits.keys.push(key.to_key());
        }
        scores.sort_by(by_score);
        LookupRouteResult {
            strategy: Strategy::PrefixMatch,
            scores,
            hits,
        }
    }

    fn chain_lookup<H: AsRef<[u8]>>(&self, req: &LookupRequest<'_, H>) -> LookupRouteResult {
        let Some(ctx) = self.ctx(req) else {
            return LookupRouteResult::default();
        };
        let raws = self.chain_raws(ctx.part.id, req, ctx.now, ctx.ttl, |r| r.matched > 0);
        if raws.is_empty() {
            return LookupRouteResult::default();
        }
        let mut scores = self.score_raws(&ctx, &raws);
        let depth = raws.iter().map(|r| r.blocks as usize).max().unwrap_or(0);
        let hits = LfuHits {
            keys: req
                .block_hashes
                .iter()
                .take(depth)
                .map(|h| EntryKey::new(ctx.part.id, h.as_ref()))
                .collect(),
            runs: raws
                .iter()
                .map(|r| HitRun {
                    replica: r.replica,
                    blocks: r.blocks,
                    matched_tokens: r.tokens,
                })
                .collect(),
        };
        let total = ctx.part.serving.load(AtomicOrdering::Relaxed) as i64;
        if total > 1 {
            // Grouped by depth only (the final order comes from `by_score`
            // below): no string compares for a lookup matched by many replicas.
            scores.sort_unstable_by_key(|s| std::cmp::Reverse(s.matched_tokens));
            let mut i = 0;
            while i < scores.len() {
                let depth = scores[i].matched_tokens;
                let mut right = i;
                while right < scores.len() && scores[right].matched_tokens == depth {
                    right += 1;
                }
                let dp = distinguishing_power(right as i64, total);
                if dp != 1.0 {
                    for s in &mut scores[i..right] {
                        s.score *= dp as f32;
                    }
                }
                i = right;
            }
        }
        scores.sort_by(by_score);
        LookupRouteResult {
            strategy: Strategy::PrefixMatch,
            scores,
            hits,
        }
    }

    /// The fresh holders of one exact key.
    pub(crate) fn exact_raws(&self, part: u32, hash: &[u8], now: i64, ttl: i64) -> Vec<Raw> {
        let key = KeyRef::new(part, hash);
        let shard = self.store.shards.read(key.shard());
        let Some(holders) = shard.get(&key) else {
            return Vec::new();
        };
        holders
            .iter()
            .filter_map(|h| {
                let fresh = freshness(now, h.last_seen, ttl);
                (fresh > 0.0).then_some(Raw {
                    replica: h.replica(),
                    tokens: h.tokens,
                    fresh,
                    tier: h.tier(),
                    blocks: 1,
                })
            })
            .collect()
    }

    /// Every replica's leading run over the request's chain (weakest-link
    /// freshness), in replica-id order, keeping the runs `keep` accepts.
    pub(crate) fn chain_raws<H: AsRef<[u8]>>(
        &self,
        part: u32,
        req: &LookupRequest<'_, H>,
        now: i64,
        ttl: i64,
        keep: impl Fn(&Run) -> bool,
    ) -> Vec<Raw> {
        walk(
            &self.store.shards,
            part,
            req.block_hashes,
            req.block_token_counts,
            now,
            ttl,
            |runs: &[Run]| {
                let mut raws = Vec::with_capacity(runs.len());
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
                raws
            },
        )
    }

    /// Attach names, stats pressure (gated by stats freshness under the tenant
    /// TTL) and the SLO bias; produce unsorted scores in `raws` order.
    fn score_raws(&self, ctx: &Ctx, raws: &[Raw]) -> Vec<ReplicaScore> {
        let stats = read(&self.stats);
        let per_replica = stats.get(&ctx.part.tm_id);
        let catalog = read(&self.store.catalog);
        raws.iter()
            .map(|r| {
                let pressure = per_replica
                    .and_then(|m| m.get(&r.replica))
                    .filter(|s| freshness(ctx.now, s.stats_reported, ctx.ttl) > 0.0)
                    .map_or(0.0, |s| s.pressure);
                let pf = pressure_factor(self.settings.ranking.pressure_weight, pressure);
                ReplicaScore {
                    replica_id: catalog.replica_name(r.replica),
                    score: prefix_score(r.tokens, r.fresh, pf, ctx.c),
                    matched_tokens: r.tokens,
                    estimated_cache_hit_prob: r.fresh,
                    tier: r.tier,
                }
            })
            .collect()
    }

    /// TENANT_HOT candidates (§2.6.5) for (tenant, model, scheme).
    pub fn tenant_hot(
        &self,
        tenant: &str,
        model: &str,
        scheme: &str,
        slo_ttft_ms: i32,
    ) -> Vec<ReplicaScore> {
        let max_age = duration_ns(self.settings.ranking.tenant_hot_max_age);
        if max_age <= 0 || scheme.is_empty() {
            return Vec::new();
        }
        let ids = {
            let c = read(&self.store.catalog);
            c.find_tm(tenant, model)
                .zip(c.find_scope(tenant, model, scheme))
        };
        let Some((tm, scope)) = ids else {
            return Vec::new();
        };
        let now = self.now();
        let mut cands: Vec<(u32, f32, f32, i64)> = {
            let stats = read(&self.stats);
            let Some(m) = stats.get(&tm) else {
                return Vec::new();
            };
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
            return Vec::new();
        }
        let c = slo_coefficient(&self.settings.ranking, slo_ttft_ms);
        let catalog = read(&self.store.catalog);
        let mut out: Vec<ReplicaScore> = cands
            .into_iter()
            .map(|(r, hit_rate, pressure, age)| {
                let rec = recency(age, max_age);
                let pf = pressure_factor(self.settings.ranking.pressure_weight, pressure);
                let slo = 1.0 + rec * c;
                ReplicaScore {
                    replica_id: catalog.replica_name(r),
                    score: hit_rate * rec * pf * slo,
                    matched_tokens: 0,
                    estimated_cache_hit_prob: hit_rate,
                    tier: Tier::UNSPECIFIED,
                }
            })
            .collect();
        drop(catalog);
        out.sort_by(by_score);
        out
    }

    /// Credit delivered LFU hits (+1 each). Hits whose entry has since been
    /// removed are ignored.
    pub fn credit(&self, hits: &LfuHits) {
        for h in &hits.runs {
            for key in hits.keys.iter().take(h.blocks as usize) {
                let key = key.as_ref();
                let shard = self.store.shards.read(key.shard());
                shard.credit(&key, h.replica);
            }
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
        let shard = self.store.shards.read(key.shard());
        let held = shard.held(&key)?;
        Some(held.access(holder::find(&held, replica)?))
    }
}

//! The default ranking as first written (issue 36's "straightforward
//! scan"): every live replica estimated one by one, the candidate sets
//! built as vectors, names sorted for the tie. Kept for the property test
//! (below): [`Index::route_ttft`] must give the same
//! answers.

use crate::affinity::tie_index;
use crate::index::Index;
use crate::load::LoadView;
use crate::lookup::Raw;
use crate::ranking::freshness;
use crate::routing::{Delivery, Estimate, RouteParams, TtftRoute, lfu_hits, room_bucket};
use crate::sync::read;
use crate::types::{LookupRequest, ReplicaScore, Strategy, Tier};
use std::sync::Arc;

/// A fleet member while ranking.
struct Cand {
    replica: u32,
    raw: Option<usize>,
    tentative_tokens: i32,
    matched: i32,
    queued: f64,
    recent: f64,
    /// `recent` in fixed point (`load.rs`): the mean sums these.
    recent_raw: u64,
    pressure: f32,
    usage: f32,
    work: f64,
    est: f64,
}

/// The bounded-load rule (module docs): `ok` without the replicas whose
/// recent hint count exceeds `bound` × the fleet mean + 1, unless that
/// leaves nobody.
fn bounded(load: &LoadView<'_>, cands: &[Cand], mut ok: Vec<usize>, bound: f64) -> Vec<usize> {
    if bound.is_nan() || bound <= 0.0 || cands.is_empty() {
        return ok;
    }
    let mean = load.mean_recent(
        cands.iter().map(|c| u128::from(c.recent_raw)).sum(),
        cands.len(),
    );
    let limit = bound * mean + 1.0;
    let under = |i: &usize| cands[*i].recent <= limit;
    // Filtered in place: no second vector on the lookup path.
    if ok.iter().any(under) {
        ok.retain(under);
    }
    ok
}

fn score_of(est_us: f64) -> f32 {
    (1e6 / (1e6 + est_us.max(0.0))) as f32
}

impl Index {
    /// The straightforward scan: every live replica estimated, the
    /// candidates filtered and tied in vectors (the ranking as first written).
    pub(crate) fn route_ttft_scan<H: AsRef<[u8]>>(
        &self,
        req: &LookupRequest<'_, H>,
        p: &RouteParams<'_>,
    ) -> TtftRoute {
        let mut out = TtftRoute::default();
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
        let (tm, scope, part) = {
            let c = read(&self.store.catalog);
            (
                c.find_tm(req.tenant, req.model),
                c.find_scope(req.tenant, req.model, req.hash_scheme),
                c.find_partition(req.tenant, req.model, req.hash_scheme, req.adapter)
                    .cloned(),
            )
        };
        let Some(tm) = tm else {
            out.result.strategy = self.classify_miss(req.tenant, req.model, req.hash_scheme);
            return out;
        };

        // Matches: real runs, then tentative extensions.
        let mut raws: Vec<Raw> = Vec::new();
        let mut tentative: Vec<(u32, i32)> = Vec::new();
        if let (Some(pt), false) = (&part, p.ignore_matches) {
            if chain {
                raws = self.chain_raws(pt.id, req, now, ttl, |_| true);
            } else {
                self.exact_raws(pt.id, req.prefix_hash, now, ttl, &mut raws);
            }
            if chain && self.routing.tentative.active() {
                tentative = self.tentative_runs(pt.id, req, &raws, now);
            }
        }

        // The fleet: fresh stats ∪ serving scope ∪ anyone matched.
        let mut fleet: Vec<(u32, f32)> = Vec::new();
        let mut usages: Vec<(u32, f32)> = Vec::new();
        {
            let stats = self.stats.read();
            if let Some(m) = stats.get(&tm) {
                let c = read(&self.store.counters);
                for (&r, s) in m {
                    if freshness(now, s.last_seen, ttl) > 0.0 {
                        let fresh_stats = freshness(now, s.stats_reported, ttl) > 0.0;
                        fleet.push((
                            r,
                            if fresh_stats {
                                s.ranking_pressure()
                            } else {
                                0.0
                            },
                        ));
                        if let (true, Some(l)) = (fresh_stats, &s.load) {
                            usages.push((r, c.room_usage(r, l.kv_cache_usage)));
                        }
                    }
                }
            }
        }
        if let Some(scope) = scope {
            let c = read(&self.store.counters);
            if let Some(sc) = c.scope(scope) {
                fleet.extend(sc.replicas().map(|r| (r, 0.0)));
            }
        }
        fleet.extend(raws.iter().map(|r| (r.replica, 0.0)));
        fleet.extend(tentative.iter().map(|&(r, _)| (r, 0.0)));
        // Keep the stats pressure where a replica appears twice.
        fleet.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.total_cmp(&a.1)));
        fleet.dedup_by_key(|x| x.0);
        if fleet.is_empty() {
            out.result.strategy = self.classify_miss(req.tenant, req.model, req.hash_scheme);
            return out;
        }

        let prompt: f64 = if chain {
            req.block_token_counts
                .iter()
                .map(|&c| f64::from(c.max(0)))
                .sum()
        } else {
            let stored = raws.iter().map(|r| r.tokens).max().unwrap_or(0);
            f64::from(req.prefix_token_count.max(stored).max(0))
        };
        let w = &p.weights;
        let load = self.routing.load.view(now);
        let cands: Vec<Cand> = fleet
            .iter()
            .map(|&(r, pressure)| {
                let raw = raws.iter().position(|x| x.replica == r);
                let ext = tentative.iter().find(|x| x.0 == r).map_or(0, |x| x.1);
                let (real, fresh, tier) = raw.map_or((0, 1.0, Tier::T1), |i| {
                    (raws[i].tokens.max(0), raws[i].fresh, raws[i].tier)
                });
                let matched = real.saturating_add(ext);
                let credited = f64::from(real) * w.credit(tier) * f64::from(fresh)
                    + f64::from(ext) * crate::routing::TENTATIVE_CREDIT;
                let work = w.work_us(prompt - credited);
                let queued = load.queued_us(r);
                let recent_raw = load.raw_recent(r);
                let recent = load.recent_of(recent_raw);
                let est = queued + work + w.pressure_us.max(0.0) * f64::from(pressure.max(0.0));
                Cand {
                    replica: r,
                    raw,
                    tentative_tokens: ext,
                    matched,
                    queued,
                    recent,
                    recent_raw,
                    pressure,
                    usage: usages.iter().find(|u| u.0 == r).map_or(f32::NAN, |u| u.1),
                    work,
                    est,
                }
            })
            .collect();
        let floor = p.min_matched_tokens.max(1);
        let is_match = |c: &Cand| c.matched >= floor;

        // Candidates: busy replicas without a match are skipped.
        let eligible: Vec<usize> = {
            let ok: Vec<usize> = (0..cands.len())
                .filter(|&i| is_match(&cands[i]) || cands[i].pressure < w.affinity_max_pressure)
                .collect();
            let ok = if ok.is_empty() {
                (0..cands.len()).collect()
            } else {
                ok
            };
            bounded(&load, &cands, ok, w.load_bound)
        };
        let best = eligible
            .iter()
            .map(|&i| cands[i].est)
            .fold(f64::INFINITY, f64::min);
        let catalog = read(&self.store.catalog);
        let mut tied: Vec<(Arc<str>, usize)> = eligible
            .iter()
            .filter(|&&i| cands[i].est <= best)
            .map(|&i| (catalog.replica_name(cands[i].replica), i))
            .collect();
        if let Some(room) = tied
            .iter()
            .filter_map(|t| room_bucket(cands[t.1].usage))
            .min()
        {
            tied.retain(|t| room_bucket(cands[t.1].usage) == Some(room));
        }
        tied.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let k = if p.seed.is_empty() {
            0
        } else {
            tie_index(p.seed, tied.len())
        };
        let Some((pick_name, pick)) = tied.get(k).cloned() else {
            return out;
        };
        out.delivery = Some(Delivery {
            replica_id: pick_name.clone(),
            work_us: cands[pick].work,
            real_blocks: cands[pick]
                .raw
                .filter(|_| chain)
                .map_or(0, |j| raws[j].blocks as usize),
        });

        let mut order: Vec<usize> = (0..cands.len()).collect();
        order.sort_by(|&a, &b| {
            (a != pick)
                .cmp(&(b != pick))
                .then(cands[a].est.total_cmp(&cands[b].est))
                .then(cands[a].replica.cmp(&cands[b].replica))
        });
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
        if !is_match(&cands[pick]) {
            out.pick = Some(pick_name);
            return out;
        }
        let matched: Vec<usize> = order.into_iter().filter(|&i| is_match(&cands[i])).collect();
        out.result.scores = matched
            .iter()
            .map(|&i| {
                let c = &cands[i];
                let raw = c.raw.map(|j| &raws[j]);
                ReplicaScore {
                    replica_id: catalog.replica_name(c.replica),
                    score: score_of(c.est),
                    matched_tokens: c.matched,
                    estimated_cache_hit_prob: raw.map_or(1.0, |r| r.fresh),
                    tier: raw.map_or(Tier::T1, |r| r.tier),
                }
            })
            .collect();
        drop(catalog);
        out.result.strategy = Strategy::PrefixMatch;
        // Hits are captured for every tenant: `hot_prefixes` counts delivered
        // hits for LRU tenants too; only LFU eviction reads the counters.
        if let Some(pt) = &part {
            let runs: Vec<Option<usize>> = matched.iter().map(|&i| cands[i].raw).collect();
            out.result.hits = lfu_hits(pt.id, req, &raws, &runs, &out.result.scores);
        }
        out
    }
}

#[cfg(test)]
mod equivalence {
    use crate::routing::{RouteParams, TtftRoute, TtftWeights};
    use crate::{
        CacheEvent, CacheUpdate, EventKind, IndexConfig, LookupRequest, ManualClock, PrefixEntry,
        ReplicaStatsReport, Tier, chain_seed,
    };
    use proptest::prelude::*;
    use std::sync::Arc;
    use std::time::Duration;

    const T0: i64 = 1_700_000_000_000_000_000;

    /// One step of a random history.
    #[derive(Debug, Clone)]
    enum Step {
        /// Replica holds the first `depth` blocks of chain `chain` on `tier`.
        Hold {
            replica: u8,
            chain: u8,
            depth: u8,
            tier: u8,
        },
        /// Replica reports stats with this pressure (and holds nothing new),
        /// and with `load` (running, waiting, KV usage step, capacity step:
        /// 0 unknown, else 4, 8 or 12 blocks, so the blocks held move the
        /// room) the engine's load.
        Stats {
            replica: u8,
            pressure: u8,
            load: Option<(u8, u8, u8, u8)>,
        },
        /// A delivered hint of `work` µs (and, with `ttl`, the chain's
        /// tentative holdings) on the replica.
        Deliver {
            replica: u8,
            chain: u8,
            work: u16,
            ttl: bool,
        },
        /// The replica evicts block `block` of `chain` (it may leave the
        /// serving scope), or with `clear` everything.
        Evict {
            replica: u8,
            chain: u8,
            block: u8,
            clear: bool,
        },
        /// Time passes (past the 2 s TTL now and then: stats and holdings
        /// go stale, queues drain).
        Advance { ms: u16 },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (0u8..10, 0u8..3, 1u8..6, 0u8..4).prop_map(|(replica, chain, depth, tier)| {
                Step::Hold {
                    replica,
                    chain,
                    depth,
                    tier,
                }
            }),
            2 => (
                0u8..10,
                0u8..5,
                proptest::option::of((0u8..3, 0u8..3, 0u8..4, 0u8..4))
            )
                .prop_map(|(replica, pressure, load)| Step::Stats {
                    replica,
                    pressure,
                    load
                }),
            3 => (0u8..10, 0u8..3, 0u16..4, any::<bool>()).prop_map(|(replica, chain, work, ttl)| {
                Step::Deliver {
                    replica,
                    chain,
                    work: work * 500,
                    ttl,
                }
            }),
            1 => (0u8..10, 0u8..3, 0u8..5, proptest::bool::weighted(0.2)).prop_map(
                |(replica, chain, block, clear)| Step::Evict {
                    replica,
                    chain,
                    block,
                    clear,
                }
            ),
            2 => prop_oneof![(0u16..3).prop_map(|ms| ms * 250), Just(1_100u16)]
                .prop_map(|ms| Step::Advance { ms }),
        ]
    }

    fn block(chain: u8, i: u8) -> Vec<u8> {
        // Chains 0 and 1 share their first two blocks.
        let c = if i < 2 && chain < 2 { 0 } else { chain };
        vec![c, i, 7, 7, 7, 7, 7, 7]
    }

    fn blocks(chain: u8, n: u8) -> Vec<Vec<u8>> {
        (0..n).map(|i| block(chain, i)).collect()
    }

    fn tier(t: u8) -> Tier {
        match t {
            0 => Tier::T1,
            1 => Tier::T2,
            2 => Tier::T3,
            _ => Tier::UNSPECIFIED,
        }
    }

    /// The same answer; with `estimates`, the same per-replica estimates.
    fn same(a: &TtftRoute, b: &TtftRoute, estimates: bool) -> Result<(), TestCaseError> {
        prop_assert_eq!(a.result.strategy, b.result.strategy);
        prop_assert_eq!(&a.result.scores, &b.result.scores);
        prop_assert_eq!(&a.result.hits, &b.result.hits);
        prop_assert_eq!(&a.pick, &b.pick);
        prop_assert_eq!(&a.delivery, &b.delivery);
        if estimates {
            prop_assert_eq!(&a.estimates, &b.estimates);
        } else {
            prop_assert!(a.estimates.is_empty());
        }
        Ok(())
    }

    type Lookup = (u8, u8, i32, bool, u8, bool);

    fn check(idx: &crate::Index, l: Lookup) -> Result<(), TestCaseError> {
        let (chain, n, min, ignore, bound, seeded) = l;
        let hs = blocks(chain, n);
        let counts = vec![16; n as usize];
        let seed = if seeded { chain_seed(&hs) } else { Vec::new() };
        let p = RouteParams {
            weights: TtftWeights {
                load_bound: [0.0, 1.25, 0.5][bound as usize],
                // Now and then a T3 match earns nothing: it ties the cold
                // replicas.
                t3_reload: if seeded && min == 0 { 1.0 } else { 0.75 },
                ..TtftWeights::default()
            },
            min_matched_tokens: min * 16,
            ignore_matches: ignore,
            seed: &seed,
        };
        let req = LookupRequest::new("t", "m", "s").chain(&hs, &counts);
        let scan = idx.route_ttft_scan(&req, &p);
        same(&idx.route_ttft_explained(&req, &p), &scan, true)?;
        // The lookup path (the fleet set, `cold.rs`): the same answer.
        same(&idx.route_ttft(&req, &p), &scan, false)?;
        let exact = LookupRequest::<Vec<u8>>::new("t", "m", "s").exact(&hs[0], 16);
        let scan = idx.route_ttft_scan(&exact, &p);
        same(&idx.route_ttft_explained(&exact, &p), &scan, true)?;
        same(&idx.route_ttft(&exact, &p), &scan, false)?;
        Ok(())
    }

    fn lookup() -> impl Strategy<Value = Lookup> {
        (
            0u8..4,
            1u8..6,
            0i32..3,
            proptest::bool::weighted(0.2),
            0u8..3,
            any::<bool>(),
        )
    }

    /// The tie merges a matched replica whose match earns nothing (T3 at
    /// a full reload cost: its estimate equals the cold replicas') into the cold
    /// class, past members excluded by the bounded-load rule: every seed
    /// picks as the scan does.
    #[test]
    fn a_tie_across_a_match_and_the_cold_class_skips_the_over_bound_members() {
        let clock = Arc::new(ManualClock::new(T0));
        let idx = IndexConfig::new().clock(clock.clone()).build();
        let hs = blocks(0, 3);
        let counts = vec![16; 3];
        let req = LookupRequest::new("t", "m", "s").chain(&hs, &counts);
        for r in 0..8u8 {
            let tier = if r == 5 { Tier::T3 } else { Tier::T1 };
            let chain = if r == 5 { 0 } else { 2 };
            idx.ingest(&CacheUpdate {
                replica_id: format!("replica-{r}"),
                model_id: "m".into(),
                tenant_id: "t".into(),
                hash_scheme: "s".into(),
                prefixes: vec![PrefixEntry {
                    block_hashes: blocks(chain, 2),
                    block_token_counts: vec![16; 2],
                    tier,
                    ..PrefixEntry::default()
                }],
                ..CacheUpdate::default()
            });
        }
        // Replicas 1 and 3 (below replica-5 in name order) are over the
        // bound; no work, so not busy.
        for r in [1u8, 3, 3, 1, 3] {
            let d = crate::Delivery {
                replica_id: format!("replica-{r}").into(),
                work_us: 0.0,
                real_blocks: 0,
            };
            idx.record_delivery(&req, &d, Duration::ZERO);
        }
        for seed in 0u8..64 {
            let seed = [seed];
            let p = RouteParams {
                weights: TtftWeights {
                    t3_reload: 1.0,
                    ..TtftWeights::default()
                },
                min_matched_tokens: 0,
                ignore_matches: false,
                seed: &seed,
            };
            let scan = idx.route_ttft_scan(&req, &p);
            assert!(
                scan.estimates
                    .iter()
                    .all(|e| e.ttft_us == scan.estimates[0].ttft_us)
            );
            let got = idx.route_ttft(&req, &p);
            assert_eq!(got.delivery, scan.delivery, "seed {seed:?}");
            assert_eq!(got.pick, scan.pick, "seed {seed:?}");
            assert_eq!(got.result.scores, scan.result.scores, "seed {seed:?}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// `route_ttft` (the fleet set) and `route_ttft_explained` (one pass)
        /// give the straightforward scan's answers (issue 36), looked up
        /// after every step of the history, so the kept fleet sets see every
        /// change: holdings, evictions and clears (scope membership), stats
        /// and load reports (pressure, KV room, queues), deliveries (queues,
        /// recent counts, tentative holdings), time (stale stats, drained
        /// queues, decayed counts).
        #[test]
        fn route_ttft_answers_as_the_scan(
            steps in proptest::collection::vec((step(), lookup()), 0..40),
            lookups in proptest::collection::vec(lookup(), 1..6),
        ) {
            let clock = Arc::new(ManualClock::new(T0));
            let idx = IndexConfig::new()
                .clock(clock.clone())
                .default_ttl(Duration::from_secs(2))
                .build();
            let name = |r: u8| format!("replica-{}", (b'a' + r) as char);
            let update = |r: u8, prefixes: Vec<PrefixEntry>, stats: Option<ReplicaStatsReport>| CacheUpdate {
                replica_id: name(r),
                model_id: "m".into(),
                tenant_id: "t".into(),
                hash_scheme: "s".into(),
                prefixes,
                stats,
                ..CacheUpdate::default()
            };
            for (s, l) in &steps {
                match *s {
                    Step::Hold { replica, chain, depth, tier: t } => {
                        idx.ingest(&update(replica, vec![PrefixEntry {
                            block_hashes: blocks(chain, depth),
                            block_token_counts: vec![16; depth as usize],
                            tier: tier(t),
                            ..PrefixEntry::default()
                        }], None));
                    }
                    Step::Stats { replica, pressure, load } => {
                        idx.ingest(&update(replica, Vec::new(), Some(ReplicaStatsReport {
                            pressure: f32::from(pressure) * 0.5 - 0.5,
                            load: load.map(|(running, waiting, usage, cap)| crate::EngineLoad {
                                running_requests: u32::from(running),
                                waiting_requests: u32::from(waiting),
                                kv_cache_usage: f32::from(usage) * 0.3,
                                kv_cache_capacity_tokens: u64::from(cap) * 4 * 16,
                            }),
                            ..ReplicaStatsReport::default()
                        })));
                    }
                    Step::Deliver { replica, chain, work, ttl } => {
                        let hs = blocks(chain, 5);
                        let counts = vec![16; 5];
                        let d = crate::Delivery {
                            replica_id: name(replica).into(),
                            work_us: f64::from(work),
                            real_blocks: 0,
                        };
                        let ttl = if ttl { Duration::from_secs(120) } else { Duration::ZERO };
                        idx.record_delivery(&LookupRequest::new("t", "m", "s").chain(&hs, &counts), &d, ttl);
                    }
                    Step::Evict { replica, chain, block: i, clear } => {
                        idx.apply_event(&CacheEvent {
                            kind: if clear { EventKind::AllCleared } else { EventKind::PrefixEvicted },
                            replica_id: name(replica),
                            model_id: "m".into(),
                            tenant_id: "t".into(),
                            prefix_hash: if clear { Vec::new() } else { block(chain, i) },
                            timestamp_us: 0,
                            adapter_id: String::new(),
                        });
                    }
                    Step::Advance { ms } => {
                        clock.advance(Duration::from_millis(u64::from(ms)));
                        if ms > 1_000 {
                            idx.sweep();
                        }
                    }
                }
                check(&idx, *l)?;
            }
            for l in lookups {
                check(&idx, l)?;
            }
        }
    }
}

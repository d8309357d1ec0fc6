//! Property test: random ingest / event / sweep / lookup / policy sequences run
//! against the index and against a deliberately naive model (BTreeMaps, full
//! scans, full sorts) written straight from server.md §2; results must agree.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;
use proptest::prelude::{
    Just, ProptestConfig, TestCaseError, any, prop_assert, prop_assert_eq, prop_oneof, proptest,
};
use proptest::strategy::Strategy as PStrategy;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const TENANTS: [&str; 3] = ["a", "b", PROBE_TENANT];
const MODELS: [&str; 2] = ["m1", "m2"];
const SCHEMES: [&str; 3] = ["vllm", "sglang", ""];
const ADAPTERS: [&str; 3] = ["", "x", "y"];
const REPLICAS: [&str; 4] = ["r0", "r1", "r2", "r3"];
const HIT_RATES: [f32; 6] = [0.0, 0.05, 0.1, 0.5, 0.9, f32::NAN];
const PRESSURES: [f32; 6] = [0.0, 0.25, 0.5, 1.0, 2.0, f32::INFINITY];
const DEFAULT_TTL_NS: i64 = 30 * 60 * 1_000_000_000;
const HOT_MAX_AGE_NS: i64 = 5 * 60 * 1_000_000_000;

/// A key's bytes: mostly 8 bytes (the chain-run arena's keys), every third
/// value 4 bytes (the odd-key map's), so one index holds keys in both stores
/// and chains mix them.
fn hb(h: Option<u8>) -> Vec<u8> {
    match h {
        Some(x) if x % 3 == 2 => vec![x; 4],
        Some(x) => (x as u64).to_be_bytes().to_vec(),
        None => Vec::new(),
    }
}

#[derive(Debug, Clone)]
struct EntrySpec {
    hash: Option<u8>,
    tokens: i32,
    chain: Option<(Vec<Option<u8>>, Vec<i32>)>,
    tier: i32,
    adapter: usize, // 0 = inherit, 1 = "x", 2 = "y"
}

#[derive(Debug, Clone)]
enum Op {
    Ingest {
        t: usize,
        m: usize,
        s: usize,
        r: usize,
        adapter: usize,
        ts_off_s: Option<i64>,
        entries: Vec<EntrySpec>,
        stats: Option<(usize, usize)>,
    },
    Evict {
        t: usize,
        m: usize,
        r: usize,
        h: u8,
        adapter: usize,
    },
    Clear {
        t: usize,
        m: usize,
        r: usize,
    },
    Updated {
        t: usize,
        m: usize,
        r: usize,
    },
    Added {
        t: usize,
        m: usize,
        r: usize,
        h: u8,
    },
    Sweep,
    Advance(u64),
    Lookup {
        t: usize,
        m: usize,
        s: usize,
        adapter: usize,
        exact: Option<u8>,
        chain: Option<(Vec<u8>, Vec<i32>)>,
        ttft: i32,
        deliver: bool,
    },
    SetTtl {
        t: usize,
        mins: u64,
    },
    SetLfu {
        t: usize,
        on: bool,
    },
    SetQuota {
        t: usize,
        q: Option<i64>,
    },
    /// Ingest / event ops applied with one `Index::apply_batch`.
    Batch(Vec<Op>),
}

fn tenant() -> impl PStrategy<Value = usize> {
    prop_oneof![6 => Just(0usize), 2 => Just(1usize), 1 => Just(2usize)]
}

fn model() -> impl PStrategy<Value = usize> {
    prop_oneof![4 => Just(0usize), 1 => Just(1usize)]
}

fn scheme() -> impl PStrategy<Value = usize> {
    prop_oneof![8 => Just(0usize), 2 => Just(1usize), 1 => Just(2usize)]
}

fn adapter() -> impl PStrategy<Value = usize> {
    prop_oneof![6 => Just(0usize), 1 => Just(1usize), 1 => Just(2usize)]
}

/// A chain that is usually a prefix of 0,1,2,3,4,5 (so runs overlap), sometimes random.
fn chain_hashes() -> impl PStrategy<Value = Vec<u8>> {
    prop_oneof![
        3 => (1usize..7).prop_map(|n| (0..n as u8).collect::<Vec<u8>>()),
        1 => proptest::collection::vec(0u8..6, 1..6),
    ]
}

fn entry_spec() -> impl PStrategy<Value = EntrySpec> {
    let hash = prop_oneof![9 => (0u8..6).prop_map(Some), 1 => Just(None)];
    let chain = prop_oneof![
        2 => Just(None),
        3 => chain_hashes().prop_flat_map(|h| {
            let n = h.len();
            (Just(h), proptest::collection::vec(-2i32..40, n), proptest::collection::vec(0u8..20, n))
        })
        .prop_map(|(h, c, holes)| Some((h.into_iter().zip(holes).map(|(x, hole)| if hole == 0 { None } else { Some(x) }).collect(), c))),
        1 => (proptest::collection::vec((0u8..8).prop_map(Some), 0..3), proptest::collection::vec(1i32..20, 0..3))
            .prop_map(|(h, c)| Some((h, c))),
    ];
    (
        hash,
        -2i32..200,
        chain,
        prop_oneof![1 => Just(-1i32), 2 => 0i32..4, 1 => 4i32..6],
        adapter(),
    )
        .prop_map(|(hash, tokens, chain, tier, adapter)| EntrySpec {
            hash,
            tokens,
            chain,
            tier,
            adapter,
        })
}

/// The write ops, shared by `op()` and `batch_item()` (each weights them).
#[rustfmt::skip]
fn ingest_op() -> impl PStrategy<Value = Op> {
    (tenant(), model(), scheme(), 0usize..4, adapter(),
     prop_oneof![3 => Just(None), 1 => (-1200i64..120).prop_map(Some)],
     proptest::collection::vec(entry_spec(), 0..4),
     prop_oneof![2 => Just(None), 1 => (0usize..6, 0usize..6).prop_map(Some)])
        .prop_map(|(t, m, s, r, adapter, ts_off_s, entries, stats)| Op::Ingest { t, m, s, r, adapter, ts_off_s, entries, stats })
}

fn evict_op() -> impl PStrategy<Value = Op> {
    (tenant(), model(), 0usize..4, 0u8..6, adapter()).prop_map(|(t, m, r, h, adapter)| Op::Evict {
        t,
        m,
        r,
        h,
        adapter,
    })
}

fn clear_op() -> impl PStrategy<Value = Op> {
    (tenant(), model(), 0usize..4).prop_map(|(t, m, r)| Op::Clear { t, m, r })
}

fn updated_op() -> impl PStrategy<Value = Op> {
    (tenant(), model(), 0usize..4).prop_map(|(t, m, r)| Op::Updated { t, m, r })
}

fn added_op() -> impl PStrategy<Value = Op> {
    (tenant(), model(), 0usize..4, 0u8..6).prop_map(|(t, m, r, h)| Op::Added { t, m, r, h })
}

fn op() -> impl PStrategy<Value = Op> {
    prop_oneof![
        8 => ingest_op(),
        1 => evict_op(),
        1 => clear_op(),
        1 => updated_op(),
        1 => added_op(),
        1 => Just(Op::Sweep),
        2 => prop_oneof![0u64..60, 60u64..1200, 1200u64..2400].prop_map(Op::Advance),
        8 => (tenant(), model(), scheme(), adapter(),
              prop_oneof![2 => (0u8..6).prop_map(Some), 1 => Just(None)],
              prop_oneof![1 => Just(None),
                          2 => chain_hashes().prop_flat_map(|h| {
                              let n = h.len();
                              (Just(h), proptest::collection::vec(-1i32..40, n))
                          }).prop_map(Some),
                          1 => (proptest::collection::vec(0u8..8, 0..3), proptest::collection::vec(1i32..20, 0..3)).prop_map(Some)],
              prop_oneof![Just(0), Just(100), Just(199), Just(200), Just(500)],
              any::<bool>())
            .prop_map(|(t, m, s, adapter, exact, chain, ttft, deliver)| Op::Lookup { t, m, s, adapter, exact, chain, ttft, deliver }),
        1 => (tenant(), prop_oneof![Just(0u64), Just(2), Just(10), Just(45)]).prop_map(|(t, mins)| Op::SetTtl { t, mins }),
        1 => (tenant(), any::<bool>()).prop_map(|(t, on)| Op::SetLfu { t, on }),
        2 => (tenant(), prop_oneof![1 => Just(None), 1 => Just(Some(-1i64)), 4 => (0i64..8).prop_map(Some)]).prop_map(|(t, q)| Op::SetQuota { t, q }),
    ]
}

/// The writes a batch may hold: ingests and every event kind (the
/// generators of `op()`, weighted towards events: eviction bursts).
fn batch_item() -> impl PStrategy<Value = Op> {
    prop_oneof![
        6 => ingest_op(),
        4 => evict_op(),
        1 => clear_op(),
        1 => updated_op(),
        1 => added_op(),
    ]
}

/// `op()` mixed with batches of writes.
fn op_or_batch() -> impl PStrategy<Value = Op> {
    prop_oneof![
        3 => op(),
        1 => proptest::collection::vec(batch_item(), 0..10).prop_map(Op::Batch),
    ]
}

// ---------------------------------------------------------------- the model

type Key = (String, String, String, String, Vec<u8>);

#[derive(Debug, Clone)]
struct MEntry {
    tokens: i32,
    last_seen: i64,
    tier: i32,
    access: u64,
}

#[derive(Debug, Clone)]
struct MStats {
    hit_rate: f32,
    pressure: f32,
    last_seen: i64,
    reported: i64,
}

#[derive(Debug, Clone, PartialEq)]
struct MScore {
    replica: String,
    score: f32,
    matched: i32,
    prob: f32,
    tier: i32,
}

#[derive(Default)]
struct Model {
    now: i64,
    max_entries: i64,
    ttl: BTreeMap<String, i64>,
    lfu: BTreeSet<String>,
    quota: BTreeMap<String, i64>,
    entries: BTreeMap<Key, BTreeMap<String, MEntry>>,
    stats: BTreeMap<(String, String, String), MStats>,
}

fn m_tier(wire: i32) -> i32 {
    if wire < 0 {
        i32::MAX
    } else if wire == 0 {
        1
    } else {
        wire
    }
}

fn m_worst(a: i32, b: i32) -> i32 {
    if a == 0 || b == 0 { 0 } else { a.max(b) }
}

fn m_fresh(now: i64, last: i64, ttl: i64) -> f32 {
    if ttl <= 0 {
        return 0.0;
    }
    let age = now - last;
    if age <= 0 {
        1.0
    } else if age >= ttl {
        0.0
    } else {
        (1.0 - age as f64 / ttl as f64) as f32
    }
}

fn m_dpf(matching: i64, total: i64) -> f64 {
    if total <= 1 || matching < 0 {
        1.0
    } else if matching >= total {
        0.0
    } else {
        1.0 - matching as f64 / total as f64
    }
}

fn m_sort(v: &mut [MScore]) {
    v.sort_by(|a, b| {
        b.score
            .partial_cmp(&a.score)
            .unwrap()
            .then(a.replica.cmp(&b.replica))
    });
}

impl Model {
    fn ttl_of(&self, t: &str) -> i64 {
        self.ttl.get(t).copied().unwrap_or(DEFAULT_TTL_NS)
    }

    fn total_entries(&self) -> usize {
        self.entries.values().map(|m| m.len()).sum()
    }

    fn reserved_entries(&self) -> usize {
        self.entries
            .iter()
            .filter(|(k, _)| k.0 == PROBE_TENANT)
            .map(|(_, m)| m.len())
            .sum()
    }

    fn upsert(&mut self, k: Key, r: &str, tokens: i32, tier: i32, ts: i64) {
        let e = self
            .entries
            .entry(k)
            .or_default()
            .entry(r.to_string())
            .or_insert(MEntry {
                tokens,
                last_seen: ts,
                tier,
                access: 0,
            });
        e.tokens = tokens;
        e.last_seen = ts;
        e.tier = tier;
    }

    fn remove(&mut self, k: &Key, r: &str) {
        if let Some(m) = self.entries.get_mut(k) {
            m.remove(r);
            if m.is_empty() {
                self.entries.remove(k);
            }
        }
    }

    fn ingest(&mut self, u: &CacheUpdate, wire_tiers: &[i32]) -> (u64, u64, u64) {
        self.ingest_writes(u, wire_tiers);
        let quota_removed = self.enforce_quota(&u.tenant_id);
        let (lru, lfu) = self.cap();
        (quota_removed, lru, lfu)
    }

    /// An update's writes without the quota and the cap.
    fn ingest_writes(&mut self, u: &CacheUpdate, wire_tiers: &[i32]) {
        let ts = if u.timestamp_us == 0 {
            self.now
        } else {
            u.timestamp_us * 1000
        };
        if !u.hash_scheme.is_empty() {
            for (e, &wt) in u.prefixes.iter().zip(wire_tiers) {
                let adapter = if !e.adapter_id.is_empty() {
                    e.adapter_id.clone()
                } else {
                    u.adapter_id.clone()
                };
                let tier = m_tier(wt);
                let key = |h: &[u8]| {
                    (
                        u.tenant_id.clone(),
                        u.model_id.clone(),
                        u.hash_scheme.clone(),
                        adapter.clone(),
                        h.to_vec(),
                    )
                };
                if !e.block_hashes.is_empty() || !e.block_token_counts.is_empty() {
                    if e.block_hashes.len() != e.block_token_counts.len() {
                        continue;
                    }
                    let mut cum = 0i32;
                    for (h, c) in e.block_hashes.iter().zip(&e.block_token_counts) {
                        cum = cum.wrapping_add(*c);
                        if !h.is_empty() {
                            self.upsert(key(h), &u.replica_id, cum, tier, ts);
                        }
                    }
                    if !e.prefix_hash.is_empty() {
                        self.upsert(key(&e.prefix_hash), &u.replica_id, e.token_count, tier, ts);
                    }
                } else if !e.prefix_hash.is_empty() {
                    self.upsert(key(&e.prefix_hash), &u.replica_id, e.token_count, tier, ts);
                }
            }
        }
        if let Some(s) = &u.stats {
            let fin = |v: f32| if v.is_finite() { v } else { 0.0 };
            self.stats.insert(
                (
                    u.tenant_id.clone(),
                    u.model_id.clone(),
                    u.replica_id.clone(),
                ),
                MStats {
                    hit_rate: fin(s.hit_rate),
                    pressure: fin(s.pressure),
                    last_seen: ts,
                    reported: ts,
                },
            );
        }
    }

    /// The tenant's quota: whole keys removed.
    fn enforce_quota(&mut self, tenant: &str) -> u64 {
        let mut quota_removed = 0u64;
        if let Some(&q) = self.quota.get(tenant) {
            if q >= 0 {
                let mut keys: Vec<(i64, Key)> = self
                    .entries
                    .iter()
                    .filter(|(k, _)| k.0 == tenant)
                    .map(|(k, m)| (m.values().map(|e| e.last_seen).max().unwrap(), k.clone()))
                    .collect();
                if keys.len() as i64 > q {
                    keys.sort_by(|a, b| {
                        a.0.cmp(&b.0)
                            .then(a.1.1.cmp(&b.1.1))
                            .then(a.1.2.cmp(&b.1.2))
                            .then(a.1.3.cmp(&b.1.3))
                            .then(a.1.4.cmp(&b.1.4))
                    });
                    let n = keys.len() - q as usize;
                    for (_, k) in keys.into_iter().take(n) {
                        self.entries.remove(&k);
                        quota_removed += 1;
                    }
                }
            }
        }
        quota_removed
    }

    /// Returns (lru, lfu) cap evictions.
    fn cap(&mut self) -> (u64, u64) {
        if self.max_entries <= 0 {
            return (0, 0);
        }
        let live = (self.total_entries() - self.reserved_entries()) as i64;
        if live <= self.max_entries {
            return (0, 0);
        }
        let mut cands: Vec<(u64, i64, Key, String)> = Vec::new();
        for (k, m) in &self.entries {
            if k.0 == PROBE_TENANT {
                continue;
            }
            for (r, e) in m {
                let eff = if self.lfu.contains(&k.0) { e.access } else { 0 };
                cands.push((eff, e.last_seen, k.clone(), r.clone()));
            }
        }
        cands.sort();
        let (mut lru, mut lfu) = (0, 0);
        for (_, _, k, r) in cands.into_iter().take((live - self.max_entries) as usize) {
            if self.lfu.contains(&k.0) {
                lfu += 1;
            } else {
                lru += 1;
            }
            self.remove(&k, &r);
        }
        (lru, lfu)
    }

    /// Returns (ttl lru, ttl lfu, cap lru, cap lfu, stats removed).
    fn sweep(&mut self) -> (u64, u64, u64, u64, u64) {
        let (mut tl, mut tf) = (0u64, 0u64);
        let now = self.now;
        let keys: Vec<Key> = self.entries.keys().cloned().collect();
        for k in keys {
            let ttl = self.ttl_of(&k.0);
            let is_lfu = self.lfu.contains(&k.0);
            let m = self.entries.get_mut(&k).unwrap();
            let before = m.len() as u64;
            m.retain(|_, e| now - e.last_seen < ttl);
            let gone = before - m.len() as u64;
            if is_lfu {
                tf += gone;
            } else {
                tl += gone;
            }
            if m.is_empty() {
                self.entries.remove(&k);
            }
        }
        let ttls: BTreeMap<String, i64> = self
            .stats
            .keys()
            .map(|k| (k.0.clone(), self.ttl_of(&k.0)))
            .collect();
        let before = self.stats.len();
        self.stats.retain(|k, s| now - s.last_seen < ttls[&k.0]);
        let stats_removed = (before - self.stats.len()) as u64;
        let (cl, cf) = self.cap();
        (tl, tf, cl, cf, stats_removed)
    }

    fn serving(&self, t: &str, m: &str, s: &str) -> BTreeSet<String> {
        self.entries
            .iter()
            .filter(|(k, _)| k.0 == t && k.1 == m && k.2 == s)
            .flat_map(|(_, h)| h.keys().cloned())
            .collect()
    }

    fn pressure(&self, t: &str, m: &str, r: &str, ttl: i64) -> f32 {
        match self
            .stats
            .get(&(t.to_string(), m.to_string(), r.to_string()))
        {
            Some(s) if m_fresh(self.now, s.reported, ttl) > 0.0 => s.pressure,
            _ => 0.0,
        }
    }

    fn classify(&self, t: &str, m: &str, s: &str) -> Strategy {
        if self.entries.is_empty() {
            Strategy::None
        } else if !self.entries.keys().any(|k| k.0 == t) {
            Strategy::UnknownTenant
        } else if !self.entries.keys().any(|k| k.0 == t && k.1 == m) {
            Strategy::UnknownModel
        } else if !self
            .entries
            .keys()
            .any(|k| k.0 == t && k.1 == m && k.2 == s)
        {
            Strategy::UnknownHashScheme
        } else {
            Strategy::None
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn lookup_route(
        &self,
        t: &str,
        m: &str,
        s: &str,
        a: &str,
        ph: &[u8],
        bh: &[Vec<u8>],
        bc: &[i32],
        ttft: i32,
    ) -> (Strategy, Vec<MScore>, Vec<(Key, String)>) {
        if t.is_empty() || m.is_empty() || s.is_empty() {
            return (Strategy::None, vec![], vec![]);
        }
        let ttl = self.ttl_of(t);
        let c: f32 = if ttft > 0 && ttft < 200 { 1.0 } else { 0.0 };
        let total = self.serving(t, m, s).len() as i64;
        let key = |h: &[u8]| {
            (
                t.to_string(),
                m.to_string(),
                s.to_string(),
                a.to_string(),
                h.to_vec(),
            )
        };
        if !bh.is_empty() || !bc.is_empty() {
            if bh.len() != bc.len() {
                return (Strategy::None, vec![], vec![]);
            }
            let mut scores = Vec::new();
            let mut hits = Vec::new();
            if let Some(holders) = self.entries.get(&key(&bh[0])) {
                for (r, e0) in holders {
                    if m_fresh(self.now, e0.last_seen, ttl) <= 0.0 {
                        continue;
                    }
                    let (mut matched, mut oldest, mut tier, mut blocks) =
                        (bc[0], e0.last_seen, e0.tier, 1usize);
                    while blocks < bh.len() {
                        match self.entries.get(&key(&bh[blocks])).and_then(|h| h.get(r)) {
                            Some(e) if m_fresh(self.now, e.last_seen, ttl) > 0.0 => {
                                matched = matched.wrapping_add(bc[blocks]);
                                oldest = oldest.min(e.last_seen);
                                tier = m_worst(tier, e.tier);
                                blocks += 1;
                            }
                            _ => break,
                        }
                    }
                    if matched <= 0 {
                        continue;
                    }
                    let fresh = m_fresh(self.now, oldest, ttl);
                    if fresh <= 0.0 {
                        continue;
                    }
                    let pf = (1.0f32 - 1.0f32 * self.pressure(t, m, r, ttl)).clamp(0.0, 1.0);
                    let slo = 1.0 + fresh * c;
                    let score = matched as f32 * fresh * pf * slo;
                    scores.push(MScore {
                        replica: r.clone(),
                        score,
                        matched,
                        prob: fresh,
                        tier,
                    });
                    // Hits are captured for every tenant (issue 15).
                    for h in &bh[..blocks] {
                        hits.push((key(h), r.clone()));
                    }
                }
            }
            if scores.is_empty() {
                return (self.classify(t, m, s), vec![], vec![]);
            }
            if total > 1 {
                scores.sort_by(|x, y| y.matched.cmp(&x.matched).then(x.replica.cmp(&y.replica)));
                let n = scores.len();
                for i in 0..n {
                    let right = (i..n)
                        .take_while(|&j| scores[j].matched == scores[i].matched)
                        .last()
                        .unwrap()
                        + 1;
                    let dp = m_dpf(right as i64, total);
                    if dp != 1.0 {
                        scores[i].score *= dp as f32;
                    }
                }
            }
            m_sort(&mut scores);
            return (Strategy::PrefixMatch, scores, hits);
        }
        if ph.is_empty() {
            return (Strategy::None, vec![], vec![]);
        }
        let mut scores = Vec::new();
        let mut hits = Vec::new();
        if let Some(holders) = self.entries.get(&key(ph)) {
            for (r, e) in holders {
                let fresh = m_fresh(self.now, e.last_seen, ttl);
                if fresh <= 0.0 {
                    continue;
                }
                let pf = (1.0f32 - 1.0f32 * self.pressure(t, m, r, ttl)).clamp(0.0, 1.0);
                let slo = 1.0 + fresh * c;
                let score = if e.tokens > 0 {
                    e.tokens as f32 * fresh * pf * slo
                } else {
                    0.0
                };
                scores.push(MScore {
                    replica: r.clone(),
                    score,
                    matched: e.tokens,
                    prob: fresh,
                    tier: e.tier,
                });
                if e.tokens > 0 {
                    hits.push((key(ph), r.clone()));
                }
            }
        }
        if !scores.is_empty() {
            let dp = m_dpf(scores.len() as i64, total);
            if dp != 1.0 {
                for x in &mut scores {
                    x.score *= dp as f32;
                }
            }
            m_sort(&mut scores);
            return (Strategy::PrefixMatch, scores, hits);
        }
        // TENANT_HOT
        let serving = self.serving(t, m, s);
        let mut hot = Vec::new();
        for ((st, sm, r), x) in &self.stats {
            if st != t || sm != m {
                continue;
            }
            let age = self.now - x.reported;
            if !(age < HOT_MAX_AGE_NS && x.hit_rate >= 0.1 && serving.contains(r)) {
                continue;
            }
            let rec = if age <= 0 {
                1.0
            } else {
                1.0 - age as f32 / HOT_MAX_AGE_NS as f32
            };
            let pf = (1.0f32 - 1.0f32 * x.pressure).clamp(0.0, 1.0);
            let slo = 1.0 + rec * c;
            hot.push(MScore {
                replica: r.clone(),
                score: x.hit_rate * rec * pf * slo,
                matched: 0,
                prob: x.hit_rate,
                tier: 0,
            });
        }
        if !hot.is_empty() {
            m_sort(&mut hot);
            return (Strategy::TenantHot, hot, vec![]);
        }
        (self.classify(t, m, s), vec![], vec![])
    }
}

// ---------------------------------------------------------------- batches

/// The update of an `Op::Ingest` at model time `now`, with its wire tiers.
#[allow(clippy::too_many_arguments)]
fn build_update(
    now: i64,
    t: usize,
    m: usize,
    s: usize,
    r: usize,
    adapter: usize,
    ts_off_s: Option<i64>,
    entries: &[EntrySpec],
    stats: Option<(usize, usize)>,
) -> (CacheUpdate, Vec<i32>) {
    let wire: Vec<i32> = entries.iter().map(|x| x.tier).collect();
    let prefixes: Vec<PrefixEntry> = entries
        .iter()
        .map(|x| {
            let (bh, bc) = x.chain.clone().unwrap_or_default();
            PrefixEntry {
                prefix_hash: hb(x.hash),
                token_count: x.tokens,
                block_hashes: bh.into_iter().map(hb).collect(),
                block_token_counts: bc,
                tier: Tier::from_wire(x.tier),
                adapter_id: match x.adapter {
                    0 => String::new(),
                    i => ADAPTERS[i].to_string(),
                },
                no_match_end: false,
            }
        })
        .collect();
    let mut u = upd(TENANTS[t], MODELS[m], SCHEMES[s], REPLICAS[r], prefixes);
    u.adapter_id = ADAPTERS[adapter].to_string();
    u.timestamp_us = ts_off_s.map_or(0, |o| now / 1000 + o * 1_000_000);
    u.stats = stats.map(|(h, p)| ReplicaStatsReport {
        hit_rate: HIT_RATES[h],
        pressure: PRESSURES[p],
        ..Default::default()
    });
    (u, wire)
}

fn build_event(
    kind: EventKind,
    t: usize,
    m: usize,
    r: usize,
    h: Option<u8>,
    adapter: &str,
) -> CacheEvent {
    CacheEvent {
        kind,
        replica_id: REPLICAS[r].into(),
        model_id: MODELS[m].into(),
        tenant_id: TENANTS[t].into(),
        prefix_hash: hb(h),
        timestamp_us: 0,
        adapter_id: adapter.into(),
    }
}

/// One write in the index's form, applied to the model at once (without
/// budgets). Returns the write and the tenant whose quota a batch's end must
/// enforce (stores only). Single events use it too.
fn batch_write(model: &mut Model, op: &Op) -> (Result<CacheUpdate, CacheEvent>, Option<String>) {
    match *op {
        Op::Ingest {
            t,
            m,
            s,
            r,
            adapter,
            ts_off_s,
            ref entries,
            stats,
        } => {
            let (u, wire) = build_update(model.now, t, m, s, r, adapter, ts_off_s, entries, stats);
            model.ingest_writes(&u, &wire);
            let tenant = u.tenant_id.clone();
            (Ok(u), Some(tenant))
        }
        Op::Evict {
            t,
            m,
            r,
            h,
            adapter,
        } => {
            let keys: Vec<Key> = model
                .entries
                .keys()
                .filter(|k| {
                    k.0 == TENANTS[t]
                        && k.1 == MODELS[m]
                        && k.4 == hb(Some(h))
                        && (adapter == 0 || k.3 == ADAPTERS[adapter])
                })
                .cloned()
                .collect();
            for k in keys {
                model.remove(&k, REPLICAS[r]);
            }
            (
                Err(build_event(
                    EventKind::PrefixEvicted,
                    t,
                    m,
                    r,
                    Some(h),
                    ADAPTERS[adapter],
                )),
                None,
            )
        }
        Op::Clear { t, m, r } => {
            let keys: Vec<Key> = model
                .entries
                .keys()
                .filter(|k| k.0 == TENANTS[t] && k.1 == MODELS[m])
                .cloned()
                .collect();
            for k in keys {
                model.remove(&k, REPLICAS[r]);
            }
            model
                .stats
                .remove(&(TENANTS[t].into(), MODELS[m].into(), REPLICAS[r].into()));
            (
                Err(build_event(EventKind::AllCleared, t, m, r, None, "x")),
                None,
            )
        }
        Op::Updated { t, m, r } => {
            let now = model.now;
            if let Some(s) =
                model
                    .stats
                    .get_mut(&(TENANTS[t].into(), MODELS[m].into(), REPLICAS[r].into()))
            {
                s.last_seen = now;
            }
            (
                Err(build_event(EventKind::ReplicaUpdated, t, m, r, None, "")),
                None,
            )
        }
        Op::Added { t, m, r, h } => (
            Err(build_event(EventKind::PrefixAdded, t, m, r, Some(h), "")),
            None,
        ),
        _ => unreachable!("not a batch write: {op:?}"),
    }
}

// ---------------------------------------------------------------- the driver

/// Counts observer notifications: adds − removals must equal live entries.
#[derive(Default)]
struct Tally {
    added: std::sync::atomic::AtomicI64,
    removed: std::sync::atomic::AtomicI64,
}

impl IndexObserver for Tally {
    fn prefix_added(&self, _c: &PrefixChange) {
        self.added.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
    fn prefix_removed(&self, _c: &PrefixChange, _r: RemovalReason) {
        self.removed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

fn run(ops: Vec<Op>, max_entries: i64, reserve: usize) -> Result<(), TestCaseError> {
    let tally = std::sync::Arc::new(Tally::default());
    let e = Env::with(|c| {
        c.max_entries(max_entries)
            .cap_reserve(reserve)
            .observer(tally.clone())
    });
    let mut model = Model {
        now: T0,
        max_entries,
        ..Model::default()
    };
    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Ingest {
                t,
                m,
                s,
                r,
                adapter,
                ts_off_s,
                entries,
                stats,
            } => {
                let (u, wire) =
                    build_update(model.now, t, m, s, r, adapter, ts_off_s, &entries, stats);
                let out = e.idx.ingest(&u);
                let (q, cl, cf) = model.ingest(&u, &wire);
                let got_q: u64 = out.evictions.quota.iter().map(|x| x.1).sum();
                prop_assert_eq!(
                    (got_q, out.evictions.cap_lru, out.evictions.cap_lfu),
                    (q, cl, cf),
                    "step {} ingest evictions",
                    step
                );
            }
            op @ (Op::Evict { .. } | Op::Clear { .. } | Op::Updated { .. } | Op::Added { .. }) => {
                // The model's side is the batch driver's; the index gets the
                // event on its own.
                if let (Err(event), _) = batch_write(&mut model, &op) {
                    e.idx.apply_event(&event);
                }
            }
            Op::Batch(items) => {
                let mut writes = Vec::new();
                let mut tenants: Vec<String> = Vec::new();
                for it in &items {
                    let (w, tenant) = batch_write(&mut model, it);
                    if let Some(t) = tenant.filter(|t| !tenants.contains(t)) {
                        tenants.push(t);
                    }
                    writes.push(w);
                }
                let out = e.idx.apply_batch(writes.iter().map(|w| match w {
                    Ok(u) => BatchWrite::Store(u),
                    Err(ev) => BatchWrite::Event(ev),
                }));
                let stores = writes.iter().filter(|w| w.is_ok()).count() as u64;
                prop_assert_eq!(out.refused_at, None, "step {} refused", step);
                prop_assert_eq!(
                    (out.stores, out.events),
                    (stores, writes.len() as u64 - stores)
                );
                // Budgets once, at the end: the stored tenants' quotas, then the cap.
                let mut q = 0;
                for t in &tenants {
                    q += model.enforce_quota(t);
                }
                let (cl, cf) = if stores > 0 { model.cap() } else { (0, 0) };
                let ev = &out.ingest.evictions;
                let got_q: u64 = ev.quota.iter().map(|x| x.1).sum();
                prop_assert_eq!(
                    (got_q, ev.cap_lru, ev.cap_lfu),
                    (q, cl, cf),
                    "step {} batch evictions",
                    step
                );
            }
            Op::Sweep => {
                let out = e.idx.sweep();
                let ev = &out.evictions;
                prop_assert_eq!(
                    (
                        ev.ttl_lru,
                        ev.ttl_lfu,
                        ev.cap_lru,
                        ev.cap_lfu,
                        out.stats_removed
                    ),
                    model.sweep(),
                    "step {} sweep",
                    step
                );
            }
            Op::Advance(secs) => {
                e.advance(Duration::from_secs(secs));
                model.now += secs as i64 * 1_000_000_000;
            }
            Op::SetTtl { t, mins } => {
                if mins == 0 {
                    e.pol.ttl.write().unwrap().remove(TENANTS[t]);
                    model.ttl.remove(TENANTS[t]);
                } else {
                    e.pol.set_ttl(TENANTS[t], Duration::from_secs(mins * 60));
                    model
                        .ttl
                        .insert(TENANTS[t].into(), mins as i64 * 60_000_000_000);
                }
            }
            Op::SetLfu { t, on } => {
                if on {
                    e.pol.set_lfu(TENANTS[t]);
                    model.lfu.insert(TENANTS[t].into());
                } else {
                    e.pol.set_lru(TENANTS[t]);
                    model.lfu.remove(TENANTS[t]);
                }
            }
            Op::SetQuota { t, q } => match q {
                Some(q) => {
                    e.pol.set_quota(TENANTS[t], q);
                    model.quota.insert(TENANTS[t].into(), q);
                }
                None => {
                    e.pol.quota.write().unwrap().remove(TENANTS[t]);
                    model.quota.remove(TENANTS[t]);
                }
            },
            Op::Lookup {
                t,
                m,
                s,
                adapter,
                exact,
                chain,
                ttft,
                deliver,
            } => {
                let ph = exact.map(|x| hb(Some(x))).unwrap_or_default();
                let (bh, bc): (Vec<Vec<u8>>, Vec<i32>) = chain
                    .map(|(h, c)| (h.into_iter().map(|x| hb(Some(x))).collect(), c))
                    .unwrap_or_default();
                let req = LookupRequest::new(TENANTS[t], MODELS[m], SCHEMES[s])
                    .adapter(ADAPTERS[adapter])
                    .exact(&ph, 0)
                    .chain(&bh, &bc)
                    .slo_ttft_ms(ttft);
                let got = e.idx.lookup_route(&req);
                let (strategy, want, hits) = model.lookup_route(
                    TENANTS[t],
                    MODELS[m],
                    SCHEMES[s],
                    ADAPTERS[adapter],
                    &ph,
                    &bh,
                    &bc,
                    ttft,
                );
                prop_assert_eq!(got.strategy, strategy, "step {} strategy", step);
                prop_assert_eq!(
                    got.scores.len(),
                    want.len(),
                    "step {} len: {:?} vs {:?}",
                    step,
                    got.scores,
                    want
                );
                for (g, w) in got.scores.iter().zip(&want) {
                    prop_assert_eq!(
                        &*g.replica_id,
                        w.replica.as_str(),
                        "step {} order {:?} vs {:?}",
                        step,
                        got.scores,
                        want
                    );
                    prop_assert!(
                        (g.score - w.score).abs() <= 1e-4 * w.score.abs().max(1.0),
                        "step {} score {} vs {}",
                        step,
                        g.score,
                        w.score
                    );
                    prop_assert_eq!(g.matched_tokens, w.matched);
                    prop_assert!((g.estimated_cache_hit_prob - w.prob).abs() <= 1e-6);
                    prop_assert_eq!(g.tier.raw(), w.tier);
                }
                let mut gh: Vec<String> = e
                    .idx
                    .hit_replicas(&got.hits)
                    .into_iter()
                    .flat_map(|(name, n)| std::iter::repeat_n(name.to_string(), n))
                    .collect();
                let mut wh: Vec<String> = hits.iter().map(|h| h.1.clone()).collect();
                gh.sort();
                wh.sort();
                prop_assert_eq!(gh, wh, "step {} hits {:?}", step, got.hits);
                if deliver && strategy == Strategy::PrefixMatch {
                    e.idx.credit(&got.hits);
                    for (k, r) in hits {
                        if let Some(x) = model.entries.get_mut(&k).and_then(|m| m.get_mut(&r)) {
                            x.access += 1;
                        }
                    }
                }
            }
        }
        // Invariants after every step.
        let live = tally.added.load(std::sync::atomic::Ordering::SeqCst)
            - tally.removed.load(std::sync::atomic::Ordering::SeqCst);
        prop_assert_eq!(
            live as usize,
            model.total_entries(),
            "step {} observer tally",
            step
        );
        prop_assert_eq!(
            e.idx.total_entries() as usize,
            model.total_entries(),
            "step {} entries",
            step
        );
        prop_assert_eq!(
            e.idx.distinct_prefixes() as usize,
            model.entries.len(),
            "step {} keys",
            step
        );
        let agg = e.idx.aggregate();
        let mut want_agg: BTreeMap<String, i64> = BTreeMap::new();
        for k in model.entries.keys().filter(|k| k.0 != PROBE_TENANT) {
            *want_agg.entry(k.0.clone()).or_default() += 1;
        }
        let got_agg: BTreeMap<String, i64> = agg
            .per_tenant
            .iter()
            .map(|(t, n)| (t.to_string(), *n))
            .collect();
        prop_assert_eq!(got_agg, want_agg, "step {} aggregate", step);
        for t in TENANTS {
            for m in MODELS {
                let cs = e.idx.cache_state(t, m);
                let keys: Vec<&Key> = model
                    .entries
                    .keys()
                    .filter(|k| k.0 == t && k.1 == m)
                    .collect();
                prop_assert_eq!(cs.total_prefixes as usize, keys.len());
                let hot = model
                    .entries
                    .iter()
                    .filter(|(k, h)| {
                        k.0 == t && k.1 == m && h.values().map(|x| x.access).sum::<u64>() >= 1
                    })
                    .count();
                prop_assert_eq!(cs.hot_prefixes as usize, hot, "step {} hot", step);
                let reps: Vec<String> = model
                    .stats
                    .keys()
                    .filter(|k| k.0 == t && k.1 == m)
                    .map(|k| k.2.clone())
                    .collect();
                let got: Vec<String> = cs
                    .replicas
                    .iter()
                    .map(|r| r.replica_id.to_string())
                    .collect();
                prop_assert_eq!(got, reps, "step {} stats", step);
                for s in ["vllm", "sglang"] {
                    let serving: Vec<String> = model.serving(t, m, s).into_iter().collect();
                    let want = (!serving.is_empty()).then(|| {
                        serving[(affinity_seed_value(b"seed") % serving.len() as u64) as usize]
                            .clone()
                    });
                    let got = e.idx.affinity_hint(t, m, s, b"seed").map(|r| r.to_string());
                    prop_assert_eq!(got, want, "step {} affinity", step);
                    prop_assert_eq!(
                        e.idx.has_any_for_tenant_model_scheme(t, m, s),
                        !model.serving(t, m, s).is_empty()
                    );
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    #[test]
    fn index_matches_naive_model(
        max_entries in prop_oneof![Just(0i64), Just(4), Just(12), Just(40)],
        reserve in prop_oneof![Just(1usize), Just(2), Just(5), Just(4096)],
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        run(ops, max_entries, reserve)?;
    }

    /// The same model with batches of writes (`Index::apply_batch`) mixed in.
    #[test]
    fn batches_match_naive_model(
        max_entries in prop_oneof![Just(0i64), Just(4), Just(12), Just(40)],
        reserve in prop_oneof![Just(1usize), Just(2), Just(5), Just(4096)],
        ops in proptest::collection::vec(op_or_batch(), 1..60),
    ) {
        run(ops, max_entries, reserve)?;
    }
}

//! Lookup requests and their ranked answers (§2.6).

use super::Tier;
use std::sync::Arc;
use std::time::Duration;

/// Lookup outcome strategy (§2.6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// No hint.
    #[default]
    None,
    /// At least one replica holds the prefix.
    PrefixMatch,
    /// Fallback on recent tenant hit rates (non-chain requests).
    TenantHot,
    /// The tenant has no prefixes.
    UnknownTenant,
    /// The tenant has no prefixes for this model.
    UnknownModel,
    /// No replica serves (tenant, model, hash_scheme).
    UnknownHashScheme,
}

/// A lookup request. Borrowed so the handler can pass its request fields
/// without copying; `H` is any byte container (`Vec<u8>`, `[u8; 8]`, `Bytes`).
#[derive(Debug)]
pub struct LookupRequest<'a, H = Vec<u8>> {
    /// Tenant.
    pub tenant: &'a str,
    /// Model.
    pub model: &'a str,
    /// Engine hash scheme.
    pub hash_scheme: &'a str,
    /// Adapter partition (`""` = base).
    pub adapter: &'a str,
    /// Legacy exact key.
    pub prefix_hash: &'a [u8],
    /// Legacy exact token count (informational; the index uses stored counts).
    pub prefix_token_count: i32,
    /// Chain hashes.
    pub block_hashes: &'a [H],
    /// Chain token counts (matched tokens are computed from these).
    pub block_token_counts: &'a [i32],
    /// SLO time-to-first-token in ms (0 = none).
    pub slo_ttft_ms: i32,
    /// The tenant's policy as the caller already resolved it; `None` = the
    /// index asks its [`crate::PolicyResolver`].
    pub policy: Option<LookupPolicy>,
}

/// What a lookup needs of the tenant's policy, passed in by a caller that
/// has already read it (the server reads the whole tenant policy per
/// request), so the lookup makes no resolver call and computes nothing the
/// policy then discards.
///
/// The eviction algorithm is not part of it: a lookup captures delivered-hit
/// counters for every tenant (they feed `hot_prefixes`), so its work does
/// not depend on the algorithm; only cap eviction reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupPolicy {
    /// Tenant TTL; `None` or zero = the index default.
    pub ttl: Option<Duration>,
    /// The TENANT_HOT fallback is enabled. When false, [`crate::Index::lookup_route`]
    /// goes straight to the miss classifier (whose answer is `None` whenever
    /// TENANT_HOT would have had candidates, so the result equals a
    /// TENANT_HOT answer demoted by the caller).
    pub tenant_hot: bool,
}

impl Default for LookupPolicy {
    /// No policy: the default TTL, TENANT_HOT enabled.
    fn default() -> Self {
        Self {
            ttl: None,
            tenant_hot: true,
        }
    }
}

impl<H> Clone for LookupRequest<'_, H> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<H> Copy for LookupRequest<'_, H> {}

impl<'a, H> LookupRequest<'a, H> {
    /// A request with no fingerprint input yet.
    pub fn new(tenant: &'a str, model: &'a str, hash_scheme: &'a str) -> Self {
        Self {
            tenant,
            model,
            hash_scheme,
            adapter: "",
            prefix_hash: &[],
            prefix_token_count: 0,
            block_hashes: &[],
            block_token_counts: &[],
            slo_ttft_ms: 0,
            policy: None,
        }
    }

    /// Pass the tenant's resolved policy (no resolver call).
    pub fn policy(mut self, policy: LookupPolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Set the adapter partition.
    pub fn adapter(mut self, adapter: &'a str) -> Self {
        self.adapter = adapter;
        self
    }

    /// Set the legacy exact key.
    pub fn exact(mut self, prefix_hash: &'a [u8], token_count: i32) -> Self {
        self.prefix_hash = prefix_hash;
        self.prefix_token_count = token_count;
        self
    }

    /// Set the chain.
    pub fn chain(mut self, block_hashes: &'a [H], block_token_counts: &'a [i32]) -> Self {
        self.block_hashes = block_hashes;
        self.block_token_counts = block_token_counts;
        self
    }

    /// Set the SLO TTFT.
    pub fn slo_ttft_ms(mut self, ms: i32) -> Self {
        self.slo_ttft_ms = ms;
        self
    }

    /// Either chain array is non-empty.
    pub fn is_chain_bearing(&self) -> bool {
        !self.block_hashes.is_empty() || !self.block_token_counts.is_empty()
    }
}

/// One ranked replica, named (what the public lookups return:
/// [`crate::Index::lookup_route`], [`crate::Index::route_ttft`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaScore {
    /// Replica.
    pub replica_id: Arc<str>,
    /// Score (f32, §2.6).
    pub score: f32,
    /// Matched tokens.
    pub matched_tokens: i32,
    /// Estimated cache-hit probability (freshness, or hit rate for TENANT_HOT).
    pub estimated_cache_hit_prob: f32,
    /// Tier (use [`Tier::to_wire`]).
    pub tier: Tier,
}

/// A replica by its interned id, resolved to its name by the
/// [`ReplicaNames`] of the answer that carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(pub(crate) u32);

impl ReplicaId {
    /// The `i`-th name of [`ReplicaNames::listed`].
    pub fn listed(i: u32) -> Self {
        Self(i)
    }
}

/// One ranked replica by id: what the lookups build (issue 36). A name
/// costs a reference count to attach and another to drop, and an answer
/// at 64 replicas carries 64 of them; by id, the answer holds one
/// reference to the names ([`ReplicaNames`]) and the caller reads each
/// name where it uses it (`serve` as it encodes the response).
/// [`LookupRouteResult::named`] turns the answer into [`ReplicaScore`]s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreById {
    /// Replica (its name: [`ReplicaNames::name`]).
    pub replica: ReplicaId,
    /// Score (f32, §2.6).
    pub score: f32,
    /// Matched tokens.
    pub matched_tokens: i32,
    /// Estimated cache-hit probability (freshness, or hit rate for TENANT_HOT).
    pub estimated_cache_hit_prob: f32,
    /// Tier (use [`Tier::to_wire`]).
    pub tier: Tier,
}

impl ScoreById {
    /// The named score, its name from `names`.
    pub fn named(&self, names: &ReplicaNames) -> ReplicaScore {
        ReplicaScore {
            replica_id: names.arc(self.replica),
            score: self.score,
            matched_tokens: self.matched_tokens,
            estimated_cache_hit_prob: self.estimated_cache_hit_prob,
            tier: self.tier,
        }
    }
}

/// A score an answer ranks ([`ReplicaScore`] or [`ScoreById`]).
pub trait RankedScore {
    /// Matched tokens.
    fn matched_tokens(&self) -> i32;
}

impl RankedScore for ReplicaScore {
    fn matched_tokens(&self) -> i32 {
        self.matched_tokens
    }
}

impl RankedScore for ScoreById {
    fn matched_tokens(&self) -> i32 {
        self.matched_tokens
    }
}

/// The names of an answer's [`ReplicaId`]s: the index's published name
/// table as the lookup read it (one reference count per answer; the table
/// is immutable, so a name stays what the lookup saw even if the sweep
/// later recycles the id), or the answer's own list (fleets past the
/// table's size, answers built outside the index).
#[derive(Clone, Default)]
pub struct ReplicaNames(NamesRepr);

#[derive(Clone, Default)]
enum NamesRepr {
    #[default]
    Empty,
    /// The published table's names, by id.
    Table(Arc<[Arc<str>]>),
    /// (id, name), sorted by id.
    Listed(Arc<[(u32, Arc<str>)]>),
}

impl std::fmt::Debug for ReplicaNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            NamesRepr::Empty => f.write_str("ReplicaNames(empty)"),
            NamesRepr::Table(_) => f.write_str("ReplicaNames(table)"),
            NamesRepr::Listed(l) => f.debug_tuple("ReplicaNames").field(l).finish(),
        }
    }
}

impl ReplicaNames {
    /// Names for ids `ReplicaId::listed(0..)`, in `names`' order.
    pub fn listed(names: impl IntoIterator<Item = Arc<str>>) -> Self {
        let list: Vec<(u32, Arc<str>)> = names
            .into_iter()
            .enumerate()
            .map(|(i, n)| (i as u32, n))
            .collect();
        Self(NamesRepr::Listed(list.into()))
    }

    /// The published table.
    pub(crate) fn table(t: Arc<[Arc<str>]>) -> Self {
        Self(NamesRepr::Table(t))
    }

    /// The names of `ids` as `name` gives them (no published table).
    pub(crate) fn of_ids(
        ids: impl IntoIterator<Item = u32>,
        mut name: impl FnMut(u32) -> Arc<str>,
    ) -> Self {
        let mut list: Vec<(u32, Arc<str>)> = ids.into_iter().map(|id| (id, name(id))).collect();
        list.sort_unstable_by_key(|e| e.0);
        list.dedup_by_key(|e| e.0);
        Self(NamesRepr::Listed(list.into()))
    }

    fn get(&self, id: ReplicaId) -> Option<&Arc<str>> {
        match &self.0 {
            NamesRepr::Empty => None,
            NamesRepr::Table(t) => t.get(id.0 as usize),
            NamesRepr::Listed(l) => l.binary_search_by_key(&id.0, |e| e.0).ok().map(|i| &l[i].1),
        }
    }

    /// The name of `id` (`""` for an id these names do not know).
    pub fn name(&self, id: ReplicaId) -> &str {
        self.get(id).map_or("", |n| n)
    }

    /// The name of `id` as a shared string (empty when unknown).
    pub fn arc(&self, id: ReplicaId) -> Arc<str> {
        self.get(id).cloned().unwrap_or_else(|| Arc::from(""))
    }
}

/// The LFU-captured entries of a lookup: per matched replica, the first
/// `blocks` keys of the request (1 for an exact hit, the run length for a
/// chain hit), credited by [`crate::Index::credit`] only when the handler
/// delivers the hint. One key list serves every replica's run, and a run
/// names its replica by interned id: capturing hits costs a lookup two
/// allocations and no reference count (names are resolved only by the
/// diagnostic [`crate::Index::hit_replicas`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LfuHits {
    pub(crate) keys: HitKeys,
    pub(crate) runs: Vec<HitRun>,
}

/// The captured keys of [`LfuHits`], in request order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HitKeys {
    /// Every key 8 bytes long (the fingerprint's wire form, so nearly
    /// every lookup): 8 bytes a key, half an [`crate::key::EntryKey`], and
    /// nothing to drop key by key (a 128-block hit was 7 % of its lookup).
    Short { part: u32, hashes: Vec<[u8; 8]> },
    /// Keys of other lengths.
    Any(Vec<crate::key::EntryKey>),
}

impl Default for HitKeys {
    fn default() -> Self {
        HitKeys::Any(Vec::new())
    }
}

impl HitKeys {
    /// The keys of `hashes` in partition `part`.
    fn of<H: AsRef<[u8]>>(part: u32, hashes: &[H]) -> Self {
        let mut short = Vec::with_capacity(hashes.len());
        for h in hashes {
            match <[u8; 8]>::try_from(h.as_ref()) {
                Ok(b) => short.push(b),
                Err(_) => {
                    let keys = hashes
                        .iter()
                        .map(|h| crate::key::EntryKey::new(part, h.as_ref()));
                    return HitKeys::Any(keys.collect());
                }
            }
        }
        HitKeys::Short {
            part,
            hashes: short,
        }
    }

    /// `f` of each of the first `n` keys.
    pub(crate) fn each_first(&self, n: usize, mut f: impl FnMut(&crate::key::KeyRef<'_>)) {
        match self {
            HitKeys::Short { part, hashes } => {
                for h in hashes.iter().take(n) {
                    f(&crate::key::KeyRef::new(*part, h));
                }
            }
            HitKeys::Any(keys) => {
                for k in keys.iter().take(n) {
                    f(&k.as_ref());
                }
            }
        }
    }

    fn clear(&mut self) {
        match self {
            HitKeys::Short { hashes, .. } => hashes.clear(),
            HitKeys::Any(keys) => keys.clear(),
        }
    }
}

/// One replica's captured run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HitRun {
    pub(crate) replica: u32,
    pub(crate) blocks: u32,
    /// The matched tokens of the replica's score, so the matched-tokens
    /// floor prunes hits and scores alike.
    pub(crate) matched_tokens: i32,
}

impl LfuHits {
    /// Number of replicas with captured entries.
    pub fn len(&self) -> usize {
        self.runs.len()
    }

    /// True when nothing was captured.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Total (prefix, replica) entries the hits would credit.
    pub fn entries(&self) -> usize {
        self.runs.iter().map(|r| r.blocks as usize).sum()
    }

    /// The hits of `runs` over `req` in partition `part`: the request's
    /// keys up to the deepest run (a chain request) or its prefix key; empty
    /// when no run is left.
    pub(crate) fn capture<H: AsRef<[u8]>>(
        part: u32,
        req: &LookupRequest<'_, H>,
        runs: Vec<HitRun>,
    ) -> Self {
        if runs.is_empty() {
            return Self::default();
        }
        let keys = if req.is_chain_bearing() {
            let depth = runs.iter().map(|r| r.blocks as usize).max().unwrap_or(0);
            HitKeys::of(part, &req.block_hashes[..depth.min(req.block_hashes.len())])
        } else {
            HitKeys::of(part, &[req.prefix_hash])
        };
        Self { keys, runs }
    }

    fn clear(&mut self) {
        self.keys.clear();
        self.runs.clear();
    }
}

/// The result of [`crate::Index::lookup_route`] / [`crate::Index::lookup`]
/// (named scores) and of their `_by_id` forms ([`ScoreById`]s with their
/// [`ReplicaNames`]).
#[derive(Debug, Clone)]
pub struct LookupRouteResult<S = ReplicaScore> {
    /// Strategy (the server maps it to the wire reason code).
    pub strategy: Strategy,
    /// Ranked replicas: score desc, replica id asc.
    pub scores: Vec<S>,
    /// Access-counter hits to credit if the hint is delivered (every tenant;
    /// only LFU tenants' eviction reads the counters).
    pub hits: LfuHits,
    /// The names of [`ScoreById`] scores (empty for named ones).
    pub names: ReplicaNames,
}

impl<S> Default for LookupRouteResult<S> {
    fn default() -> Self {
        Self {
            strategy: Strategy::None,
            scores: Vec::new(),
            hits: LfuHits::default(),
            names: ReplicaNames::default(),
        }
    }
}

/// Named answers compare by strategy, scores and hits (they carry no names).
impl PartialEq for LookupRouteResult<ReplicaScore> {
    fn eq(&self, other: &Self) -> bool {
        self.strategy == other.strategy && self.scores == other.scores && self.hits == other.hits
    }
}

impl LookupRouteResult<ScoreById> {
    /// The name of a score's replica.
    pub fn name(&self, s: &ScoreById) -> &str {
        self.names.name(s.replica)
    }

    /// The answer with named scores (one reference count per score).
    pub fn named(self) -> LookupRouteResult<ReplicaScore> {
        let names = &self.names;
        LookupRouteResult {
            strategy: self.strategy,
            scores: self.scores.iter().map(|s| s.named(names)).collect(),
            hits: self.hits,
            names: ReplicaNames::default(),
        }
    }
}

impl<S: RankedScore> LookupRouteResult<S> {
    /// Matched-tokens floor (§3.2 13b): keep replicas with `matched_tokens >= floor`,
    /// pruning LFU hits of dropped replicas too (order preserved). If nothing is
    /// left the strategy becomes `None`. Returns whether anything is left.
    pub fn retain_min_matched_tokens(&mut self, floor: i32) -> bool {
        self.scores.retain(|s| s.matched_tokens() >= floor);
        if self.scores.is_empty() {
            self.demote();
            return false;
        }
        self.hits.runs.retain(|h| h.matched_tokens >= floor);
        true
    }

    /// Total (prefix, replica) entries the hits would credit.
    pub fn hit_entries(&self) -> usize {
        self.hits.entries()
    }

    /// Demote to `None`: scores and hits cleared.
    pub fn demote(&mut self) {
        self.strategy = Strategy::None;
        self.scores.clear();
        self.hits.clear();
    }
}

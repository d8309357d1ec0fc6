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

/// One ranked replica.
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

/// The result of [`crate::Index::lookup_route`] / [`crate::Index::lookup`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LookupRouteResult {
    /// Strategy (the server maps it to the wire reason code).
    pub strategy: Strategy,
    /// Ranked replicas: score desc, replica id asc.
    pub scores: Vec<ReplicaScore>,
    /// Access-counter hits to credit if the hint is delivered (every tenant;
    /// only LFU tenants' eviction reads the counters).
    pub hits: LfuHits,
}

impl LookupRouteResult {
    /// Matched-tokens floor (§3.2 13b): keep replicas with `matched_tokens >= floor`,
    /// pruning LFU hits of dropped replicas too (order preserved). If nothing is
    /// left the strategy becomes `None`. Returns whether anything is left.
    pub fn retain_min_matched_tokens(&mut self, floor: i32) -> bool {
        self.scores.retain(|s| s.matched_tokens >= floor);
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

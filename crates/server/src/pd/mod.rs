//! Prefill/decode topologies and `LookupPDRoute`.
//!
//! A topology names a prefill pool and a decode pool of replica ids and the
//! KV transport between them. The operator resolves PDTopology pools' label
//! selectors to replica ids and pushes the list to `POST /pd-topologies`
//! (replace-on-write); a standalone server reads the same list from
//! `--pd-topology-file` (reloaded on change).
//!
//! `LookupPDRoute` picks a pair:
//! - **prefill**: the best prefix match among the prefill replicas, from the
//!   same index and ranking as LookupRoute (exact `prefix_hash` lookup, the
//!   tenant's `minimumMatchedTokens` floor; a request under the tenant's
//!   `minimumPrefixTokens` is not matched). The request carries no
//!   `hash_scheme`, so the prefix is looked up in every scheme the
//!   (tenant, model) is served under, each domain on its own (bytes are never
//!   matched across schemes), and the best score wins. Ties on score go to
//!   the least-loaded, then to the affinity rule. No match: the
//!   least-loaded prefill replica.
//! - **decode**: the least-loaded decode replica. Load is the replica's
//!   reported `pressure` for (tenant, model) while its stats are fresh, else
//!   0 (the ranking's own pressure input). Ties are broken by the affinity
//!   rule: SHA-256 of `prefix_hash` (big-endian u64 of the first 8 bytes)
//!   modulo the byte-sorted tied replicas, so repeats of a prefix land on the
//!   same replica while loads are equal.
//! - reason `PREFIX_MATCH` when the prefill replica matched, `AFFINITY_HINT`
//!   when it was chosen by load, `NO_HINT` (fail-open, empty ids) for an
//!   unknown `pd_topology_ref`, an empty pool or the reserved probe tenant.
//!
//! Like LookupRoute it is side-effect-free apart from metrics: a PD prefix
//! hit credits no access counter.

mod source;

pub(crate) use source::{PD_TOPOLOGY_FILE, decode_pd_topologies_json};

use crate::metrics::Metrics;
use crate::named::NamedStore;
use crate::policy::PolicyStore;
use crate::reserved_tenant::is_reserved;
use inferencecache_index::{Index, LookupRequest, affinity_index};
use inferencecache_proto::Reason;

/// One topology, validated: pools sorted byte-wise and deduplicated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Prefill replica ids.
    pub prefill: Vec<String>,
    /// Decode replica ids.
    pub decode: Vec<String>,
    /// `Mooncake`, `NIXL` or `Direct` (the response's `transport_hint`).
    pub transport: String,
}

/// The loaded topologies, by `namespace/name`.
pub(crate) type PdTopologyStore = NamedStore<Topology>;

/// One LookupPDRoute question (`convert` borrows it from the wire request).
#[derive(Debug, Clone, Copy, Default)]
pub struct PdRequest<'a> {
    /// Tenant.
    pub tenant: &'a str,
    /// Model.
    pub model: &'a str,
    /// The prompt's prefix hash (any scheme the tenant/model is served under).
    pub prefix_hash: &'a [u8],
    /// Tokens the prefix covers.
    pub prefix_token_count: i32,
    /// `namespace/name` of the topology.
    pub topology: &'a str,
}

/// LookupPDRoute's answer: a prefill and a decode replica, or none
/// (`NO_HINT`, fail-open: empty ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PdPick {
    /// The prefill replica (empty with `NO_HINT`).
    pub prefill: String,
    /// The decode replica (empty with `NO_HINT`).
    pub decode: String,
    /// The topology's KV transport (empty with `NO_HINT`).
    pub transport: String,
    /// `PREFIX_MATCH`, `AFFINITY_HINT` or `NO_HINT`.
    pub reason: Reason,
}

impl PdPick {
    fn no_hint() -> Self {
        Self {
            prefill: String::new(),
            decode: String::new(),
            transport: String::new(),
            reason: Reason::NoHint,
        }
    }
}

/// What LookupPDRoute reads.
#[derive(Debug, Clone, Copy)]
pub struct PdRouter<'a> {
    /// Topologies.
    pub topologies: &'a PdTopologyStore,
    /// The prefix index.
    pub index: &'a Index,
    /// Tenant policies (matched-tokens floor, minimum prefix).
    pub policies: &'a PolicyStore,
    /// Metrics.
    pub metrics: &'a Metrics,
}

/// Among `pool`, the least-loaded replicas; ties broken by the affinity
/// rule over the byte-sorted tied set.
fn least_loaded<'p>(index: &Index, req: &PdRequest<'_>, pool: &[&'p str]) -> Option<&'p str> {
    let loads = index.replica_pressures(req.tenant, req.model, pool);
    let min = loads.iter().copied().fold(f32::INFINITY, f32::min);
    let mut tied: Vec<&str> = pool
        .iter()
        .zip(&loads)
        .filter(|(_, l)| **l <= min)
        .map(|(r, _)| *r)
        .collect();
    tied.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    tied.dedup();
    tied.get(affinity_index(req.prefix_hash, tied.len()))
        .copied()
}

impl PdRouter<'_> {
    /// Answers one LookupPDRoute (counted by reason).
    pub fn route(&self, req: &PdRequest<'_>) -> PdPick {
        let pick = self.pick(req);
        self.metrics
            .stores
            .lookup_pd_route_call(pick.reason.as_str());
        pick
    }

    fn pick(&self, req: &PdRequest<'_>) -> PdPick {
        if is_reserved(req.tenant) {
            return PdPick::no_hint();
        }
        let Some(t) = self.topologies.get(req.topology) else {
            return PdPick::no_hint();
        };
        let prefill_pool: Vec<&str> = t.prefill.iter().map(String::as_str).collect();
        let decode_pool: Vec<&str> = t.decode.iter().map(String::as_str).collect();
        let (prefill, reason) = match self.cached_prefill(req, &prefill_pool) {
            Some(r) => (Some(r), Reason::PrefixMatch),
            None => (
                least_loaded(self.index, req, &prefill_pool),
                Reason::AffinityHint,
            ),
        };
        let decode = least_loaded(self.index, req, &decode_pool);
        let (Some(prefill), Some(decode)) = (prefill, decode) else {
            return PdPick::no_hint();
        };
        PdPick {
            prefill: prefill.to_owned(),
            decode: decode.to_owned(),
            transport: t.transport.clone(),
            reason,
        }
    }

    /// The best-scoring prefill replica holding the prefix, if any.
    fn cached_prefill<'p>(&self, req: &PdRequest<'_>, pool: &[&'p str]) -> Option<&'p str> {
        if req.prefix_hash.is_empty() || req.tenant.is_empty() || req.model.is_empty() {
            return None;
        }
        let policy = self.policies.policy(req.tenant);
        let min_prefix = policy.minimum_prefix_tokens;
        if min_prefix > 0 && req.prefix_token_count < min_prefix {
            return None;
        }
        let floor = policy.minimum_matched_tokens;
        // (score, pool member) of every prefill replica holding the prefix.
        let mut matched: Vec<(f32, &'p str)> = Vec::new();
        for scheme in self.index.served_hash_schemes(req.tenant, req.model) {
            let lookup = LookupRequest::<Vec<u8>>::new(req.tenant, req.model, &scheme)
                .exact(req.prefix_hash, req.prefix_token_count)
                .policy(policy.lookup());
            for s in self.index.lookup(&lookup).scores {
                if s.matched_tokens < floor.max(1) {
                    continue;
                }
                if let Ok(i) = pool.binary_search_by(|p| p.as_bytes().cmp(s.replica_id.as_bytes()))
                {
                    matched.push((s.score, pool[i]));
                }
            }
        }
        let best = matched
            .iter()
            .map(|(s, _)| *s)
            .fold(f32::NEG_INFINITY, f32::max);
        let top: Vec<&'p str> = matched
            .iter()
            .filter(|(s, _)| *s >= best)
            .map(|(_, r)| *r)
            .collect();
        least_loaded(self.index, req, &top)
    }
}

//! The `/policy` JSON document (`server.md` §4.1), exactly as the
//! controller marshals it: versions 3–7, every field optional, unknown fields
//! rejected. The server decodes and normalizes it into its own policy set;
//! the operator builds it from CachePolicy and CacheTenant objects.

use serde::{Deserialize, Serialize};

/// Newest version accepted (8 adds the `routing` object; the reference
/// controller writes 7).
pub const POLICY_PROPAGATION_VERSION: i64 = 8;
/// Version the reference's controller writes, and ours when a push carries
/// no v8 field: every server, the reference's included, accepts it.
pub const POLICY_CONTROLLER_VERSION: i64 = 7;
/// Oldest version still accepted (and normalized).
pub const POLICY_MINIMUM_ACCEPTED_VERSION: i64 = 3;
/// Matched-tokens floor when a tenant has no policy (and for v3 bodies that leave it 0).
pub const DEFAULT_MINIMUM_MATCHED_TOKENS: i32 = 64;
/// Routing floor when a tenant has no policy or leaves it null.
pub const DEFAULT_ROUTING_FLOOR_SCORE: f32 = 0.1;
/// Largest accepted `/policy` body.
pub const MAX_POLICY_BODY_BYTES: usize = 1 << 20;

/// The pushed document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySnapshot {
    /// Wire version, 3 to 8.
    #[serde(default)]
    pub version: i64,
    /// One entry per CachePolicy namespace (== tenant_id).
    #[serde(default)]
    pub policies: Option<Vec<ResolvedPolicy>>,
    /// CacheTenant quotas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<ResolvedTenant>>,
}

/// One namespace's policy. Every field is optional on the wire; `null` and
/// absent mean the same.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResolvedPolicy {
    /// Namespace, matched against `tenant_id`. Empty entries are dropped.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Index TTL in nanoseconds (Go `time.Duration`); <= 0 keeps the default.
    #[serde(default, rename = "evictionTTL", skip_serializing_if = "is_zero_opt")]
    pub eviction_ttl: Option<i64>,
    /// Prompts shorter than this get no prefix hint; <= 0 disables.
    #[serde(default, skip_serializing_if = "is_zero_opt")]
    pub minimum_prefix_tokens: Option<i32>,
    /// Matches shorter than this are not hints; 0 opts out (v4+).
    #[serde(default, skip_serializing_if = "is_zero_opt")]
    pub minimum_matched_tokens: Option<i32>,
    /// Top scores below this are not hints; null = 0.1, 0 opts out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_floor_score: Option<f32>,
    /// Per-lookup budget in milliseconds; <= 0 = none.
    #[serde(default, skip_serializing_if = "is_zero_opt")]
    pub lookup_timeout_ms: Option<i32>,
    /// AFFINITY_HINT fallback; null = on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_routing: Option<bool>,
    /// Cap victim order: "lfu" (any case) or LRU.
    #[serde(default, skip_serializing_if = "is_empty_opt")]
    pub eviction: Option<String>,
    /// Matching strategy switches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<StrategyWire>,
    /// Ranking mode and estimated-TTFT weights (v8; ignored before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingWire>,
}

/// `strategy` object; each switch null = its default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StrategyWire {
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_chain_matching: Option<bool>,
    /// Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_chain: Option<bool>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_tenant_hot: Option<bool>,
}

/// One CacheTenant quota.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolvedTenant {
    /// Tenant id; empty entries are dropped.
    #[serde(default, rename = "tenantID")]
    pub tenant_id: Option<String>,
    /// Budget of distinct prefixes; negative is clamped to 0.
    #[serde(default, rename = "maxIndexEntries")]
    pub max_index_entries: Option<i64>,
    /// Carried, unused (only Fairness exists).
    #[serde(
        default,
        rename = "isolationMode",
        skip_serializing_if = "is_empty_opt"
    )]
    pub isolation_mode: Option<String>,
}

#[allow(clippy::ref_option)] // serde's skip_serializing_if passes &Option<T>
fn is_zero_opt<T: Default + PartialEq>(v: &Option<T>) -> bool {
    v.as_ref().is_none_or(|x| *x == T::default())
}

#[allow(clippy::ref_option)]
fn is_empty_opt(v: &Option<String>) -> bool {
    v.as_ref().is_none_or(String::is_empty)
}

/// The `routing` object of a v8 policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RoutingWire {
    /// `ttft` or `contract`; null = the server's `--ranking`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranking: Option<String>,
    /// µs per uncached prompt token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_micros_per_token: Option<f64>,
    /// µs of fixed cost per prefill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_overhead_micros: Option<f64>,
    /// µs of queued work per unit of reported pressure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure_micros: Option<f64>,
    /// Reload cost of a T2 match, as a fraction of recomputing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t2_reload_cost: Option<f64>,
    /// Reload cost of a T3 match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t3_reload_cost: Option<f64>,
    /// Pressure at or above which a replica without a match is skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_max_pressure: Option<f32>,
    /// Lifetime of tentative holdings, seconds; 0 turns approximate mode off.
    #[serde(
        default,
        rename = "tentativeTTLSeconds",
        skip_serializing_if = "Option::is_none"
    )]
    pub tentative_ttl_seconds: Option<f64>,
    /// Bounded-load factor over the fleet's mean recent hint count; 0 = off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_bound: Option<f64>,
}

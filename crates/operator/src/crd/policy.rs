//! CachePolicy: per-namespace routing policy, pushed to the server's `/policy`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The routing and eviction policy of one namespace (== tenant). At most one
/// per namespace: the webhook rejects a second, and the push loop keeps the
/// first by name if one slips through.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "inferencecache.io",
    version = "v1alpha1",
    kind = "CachePolicy",
    plural = "cachepolicies",
    namespaced,
    shortname = "cpol",
    status = "CachePolicyStatus",
    printcolumn = r#"{"name":"Eviction","type":"string","jsonPath":".spec.eviction"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CachePolicySpec {
    /// Victim order when the index cap is reached.
    #[serde(default)]
    pub eviction: Eviction,
    /// Index entry lifetime without a refresh, as a Go duration ("45m").
    /// Must be positive when set; absent = the server's 30 m.
    #[serde(
        default,
        rename = "evictionTTL",
        skip_serializing_if = "Option::is_none"
    )]
    pub eviction_ttl: Option<String>,
    /// Prompts shorter than this many tokens get no prefix hint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub minimum_prefix_tokens: Option<i32>,
    /// Matches shorter than this many tokens are not hints (0 opts out).
    #[serde(
        default = "default_minimum_matched_tokens",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0))]
    pub minimum_matched_tokens: Option<i32>,
    /// Top scores below this are not hints: a decimal string, e.g. "0.1".
    #[serde(
        default = "default_routing_floor_score",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(regex(pattern = r"^(0|[1-9][0-9]{0,7})(\.[0-9]{1,6})?$"))]
    pub routing_floor_score: Option<String>,
    /// Per-lookup budget in milliseconds; absent or 0 = none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub lookup_timeout_ms: Option<i32>,
    /// Matching strategy switches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
    /// Whether a lookup without a prefix match may still get an
    /// AFFINITY_HINT.
    #[serde(
        default = "default_affinity_routing",
        skip_serializing_if = "Option::is_none"
    )]
    pub affinity_routing: Option<AffinityRouting>,
    /// Ranking mode and estimated-TTFT weights (the `/policy` v8 `routing`
    /// object). Absent = the server's `--ranking` and default weights; a
    /// cluster where no CachePolicy sets it is pushed as version 7.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<Routing>,
}

/// Cap victim order.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Eviction {
    /// Least recently used first.
    #[default]
    #[serde(rename = "LRU")]
    Lru,
    /// Least frequently used first.
    #[serde(rename = "LFU")]
    Lfu,
}

impl Eviction {
    /// The lower-case form the `/policy` wire carries.
    pub fn wire(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::Lfu => "lfu",
        }
    }
}

/// AFFINITY_HINT fallback switch.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AffinityRouting {
    /// Fall back to tenant/model affinity (the default).
    #[default]
    Enabled,
    /// NO_HINT instead.
    Disabled,
}

/// Matching strategy switches; each absent one takes its default.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Strategy {
    /// Match chained prefixes (default true).
    #[serde(default = "some_true", skip_serializing_if = "Option::is_none")]
    pub enable_chain_matching: Option<bool>,
    /// Only chained matches count (default false; needs chain matching).
    #[serde(default = "some_false", skip_serializing_if = "Option::is_none")]
    pub require_chain: Option<bool>,
    /// Tenant-hot boost (default true).
    #[serde(default = "some_true", skip_serializing_if = "Option::is_none")]
    pub enable_tenant_hot: Option<bool>,
}

/// Largest `tentativeTTLSeconds`: the server caps holdings at a day.
pub const MAX_TENTATIVE_TTL_SECONDS: f64 = 86_400.0;

/// `spec.routing`: the ranking mode and the estimated-TTFT weights. Each
/// absent field takes the server's default (docs/decisions.md, "Routing").
/// The ranges are the server's `/policy` validation: what the schema admits,
/// the server uses unchanged.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Routing {
    /// `Ttft` (estimated time to first token over every live replica) or
    /// `Contract` (the reference's longest-prefix ranking). Absent = the
    /// server's `--ranking`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranking: Option<Ranking>,
    /// Microseconds of prefill per uncached prompt token (server default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub prefill_micros_per_token: Option<f64>,
    /// Microseconds of fixed cost per prefill (server default 5000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub request_overhead_micros: Option<f64>,
    /// Microseconds of queued work per unit of reported pressure (server
    /// default 50000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub pressure_micros: Option<f64>,
    /// Reload cost of a host-memory (T2) match as a fraction of recomputing
    /// it, 0 to 1 (server default 0.25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1))]
    pub t2_reload_cost: Option<f64>,
    /// Reload cost of a disk / remote (T3) match, 0 to 1 (server default
    /// 0.75).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1))]
    pub t3_reload_cost: Option<f64>,
    /// Reported pressure at or above which a replica without a match is
    /// skipped (server default 1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub affinity_max_pressure: Option<f32>,
    /// Lifetime of tentative holdings in seconds, at most a day; 0 turns
    /// approximate mode off (server default 120).
    #[serde(
        default,
        rename = "tentativeTTLSeconds",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0, max = MAX_TENTATIVE_TTL_SECONDS))]
    pub tentative_ttl_seconds: Option<f64>,
    /// Bounded-load factor over the fleet's mean recent hint count; 0 = off
    /// (server default 1.25).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub load_bound: Option<f64>,
}

impl Routing {
    /// The values outside the schema's ranges, as Kubernetes field errors
    /// (the webhook's check, for objects that reached the apiserver before
    /// the schema had them).
    pub fn field_errors(&self) -> Vec<String> {
        let at_least_zero = [
            ("prefillMicrosPerToken", self.prefill_micros_per_token),
            ("requestOverheadMicros", self.request_overhead_micros),
            ("pressureMicros", self.pressure_micros),
            ("t2ReloadCost", self.t2_reload_cost),
            ("t3ReloadCost", self.t3_reload_cost),
            (
                "affinityMaxPressure",
                self.affinity_max_pressure.map(f64::from),
            ),
            ("tentativeTTLSeconds", self.tentative_ttl_seconds),
            ("loadBound", self.load_bound),
        ];
        let at_most = [
            ("t2ReloadCost", self.t2_reload_cost, 1.0),
            ("t3ReloadCost", self.t3_reload_cost, 1.0),
            (
                "tentativeTTLSeconds",
                self.tentative_ttl_seconds,
                MAX_TENTATIVE_TTL_SECONDS,
            ),
        ];
        let mut errs = Vec::new();
        for (field, v) in at_least_zero {
            if let Some(x) = v.filter(|x| x.is_nan() || *x < 0.0) {
                errs.push(format!(
                    "spec.routing.{field}: Invalid value: {x}: must be greater than or equal to 0"
                ));
            }
        }
        for (field, v, max) in at_most {
            if let Some(x) = v.filter(|x| *x > max) {
                errs.push(format!(
                    "spec.routing.{field}: Invalid value: {x}: must be less than or equal to {max}"
                ));
            }
        }
        errs
    }
}

/// `Ttft` (lowest estimated time to first token over every live replica)
/// or `Contract` (the reference's longest-prefix ranking); absent = the
/// server's `--ranking`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Ranking {
    /// Lowest estimated time to first token wins (the server's default).
    Ttft,
    /// The reference's ranking and affinity, exactly.
    Contract,
}

impl Ranking {
    /// The lower-case form the `/policy` wire carries (the server reads it
    /// case-insensitively; lower case is what it documents and writes).
    pub fn wire(self) -> &'static str {
        match self {
            Self::Ttft => "ttft",
            Self::Contract => "contract",
        }
    }
}

/// Reserved: no component writes it (as in the reference).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CachePolicyStatus {
    /// Generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions, keyed by type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,
}

#[allow(clippy::unnecessary_wraps)] // serde default functions return the field type
fn default_minimum_matched_tokens() -> Option<i32> {
    Some(64)
}

#[allow(clippy::unnecessary_wraps)]
fn default_routing_floor_score() -> Option<String> {
    Some("0.1".into())
}

#[allow(clippy::unnecessary_wraps)]
fn default_affinity_routing() -> Option<AffinityRouting> {
    Some(AffinityRouting::Enabled)
}

#[allow(clippy::unnecessary_wraps)]
fn some_true() -> Option<bool> {
    Some(true)
}

#[allow(clippy::unnecessary_wraps)]
fn some_false() -> Option<bool> {
    Some(false)
}

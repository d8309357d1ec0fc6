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

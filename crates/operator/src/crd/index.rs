//! CacheIndex: the cluster-scoped singleton `cluster-default` that shows what
//! the server's index holds (written by the poller from `/snapshot`).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The singleton's name.
pub const CACHE_INDEX_NAME: &str = "cluster-default";

/// Empty: the object exists to carry status.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "inferencecache.io",
    version = "v1alpha1",
    kind = "CacheIndex",
    plural = "cacheindices",
    shortname = "ci",
    status = "CacheIndexStatus",
    printcolumn = r#"{"name":"Prefixes","type":"integer","jsonPath":".status.prefixes.summary.total"}"#,
    printcolumn = r#"{"name":"Changed","type":"date","jsonPath":".status.lastUpdated"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct CacheIndexSpec {}

/// The index as last seen in `/snapshot`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheIndexStatus {
    /// One row per replica, sorted by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "replicas_schema")]
    pub replicas: Vec<IndexedReplica>,
    /// One row per tenant ("" = untenanted), sorted by id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "tenants_schema")]
    pub tenants: Vec<IndexedTenant>,
    /// Prefix totals.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefixes: Option<Prefixes>,
    /// The snapshot URL this was read from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_server: Option<String>,
    /// When the content last changed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::opt_date_time")]
    pub last_updated: Option<String>,
}

/// One replica.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IndexedReplica {
    /// Replica id (the engine pod's name).
    pub id: String,
    /// Tenant (the pod's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// KV cache bytes the replica reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_memory_bytes: Option<i64>,
    /// Prefix-cache hit rate as a decimal string; absent = not reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_rate: Option<String>,
    /// Cache pressure as a decimal string. (No schema default: a 1.20
    /// apiserver reads `default: ""` as null and refuses the CRD.)
    pub pressure: String,
    /// Last stats report (RFC 3339).
    #[schemars(schema_with = "super::schema::date_time")]
    pub last_update: String,
}

/// One tenant.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IndexedTenant {
    /// Tenant id; "" is the untenanted bucket.
    pub id: String,
    /// Distinct prefixes held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_entries: Option<i64>,
    /// Hit rate as a decimal string, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_rate: Option<String>,
    /// Deprecated, always 0 (kept for the reference's readers).
    #[serde(default)]
    pub memory_used: i64,
}

/// Prefix totals.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct Prefixes {
    /// The counts.
    pub summary: PrefixSummary,
}

/// Prefix counts, both always rendered.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct PrefixSummary {
    /// Distinct prefixes.
    pub total: i64,
    /// Hot prefixes (always 0, as in the reference).
    pub hot: i64,
}

fn replicas_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    super::schema::map_list::<IndexedReplica>(g, "id")
}

fn tenants_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    super::schema::map_list::<IndexedTenant>(g, "id")
}

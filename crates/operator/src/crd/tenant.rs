//! CacheTenant: a tenant's index-entry quota, pushed with the policies.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use schemars::{Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// One tenant's quota. The quota unit is a distinct
/// `(tenant, model, hash_scheme, prefix_hash)`; there is deliberately no
/// memory quota.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "inferencecache.io",
    version = "v1alpha1",
    kind = "CacheTenant",
    namespaced,
    shortname = "ct",
    status = "CacheTenantStatus",
    printcolumn = r#"{"name":"Tenant","type":"string","jsonPath":".spec.tenantID"}"#,
    printcolumn = r#"{"name":"Entries","type":"integer","jsonPath":".status.indexEntries"}"#,
    printcolumn = r#"{"name":"Quota","type":"integer","jsonPath":".spec.quota.maxIndexEntries"}"#,
    printcolumn = r#"{"name":"Isolation","type":"string","jsonPath":".spec.isolationMode"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CacheTenantSpec {
    /// The tenant id lookups carry. `inferencecache.io/probe` is reserved.
    #[serde(rename = "tenantID")]
    #[schemars(length(min = 1))]
    pub tenant_id: String,
    /// Index budget; absent = unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<TenantQuota>,
    /// Isolation between tenants (only Fairness exists).
    #[serde(default)]
    pub isolation_mode: IsolationMode,
    /// Reserved: must be empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "reserved_empty_object")]
    pub crypto: Option<serde_json::Value>,
}

/// Index budget.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantQuota {
    /// Distinct prefixes the tenant may hold (0 admits nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_index_entries: Option<i64>,
}

/// Isolation mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum IsolationMode {
    /// Quota-based fairness (the only mode).
    #[default]
    Fairness,
}

/// Written by the CacheIndex poller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheTenantStatus {
    /// Generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Distinct prefixes the server holds for this tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_entries: Option<i64>,
    /// `Ready` and `QuotaExceeded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,
}

fn reserved_empty_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "maxProperties": 0,
        "nullable": true,
    })
}

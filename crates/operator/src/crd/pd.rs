//! PDTopology: prefill/decode pools; the operator resolves each pool's
//! `matchLabels` to pod names (= replica ids) and pushes the result to the
//! server's `/pd-topologies`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Prefill and decode pools of one disaggregated deployment.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "inferencecache.io",
    version = "v1alpha1",
    kind = "PDTopology",
    plural = "pdtopologies",
    namespaced,
    shortname = "pdt",
    status = "PDTopologyStatus",
    printcolumn = r#"{"name":"Prefill","type":"string","jsonPath":".spec.prefillPools[*].name"}"#,
    printcolumn = r#"{"name":"Decode","type":"string","jsonPath":".spec.decodePools[*].name"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PDTopologySpec {
    /// Pools that run prefill.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "pools_schema")]
    pub prefill_pools: Vec<Pool>,
    /// Pools that run decode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "pools_schema")]
    pub decode_pools: Vec<Pool>,
    /// Accelerator descriptions the pools refer to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "accelerators_schema")]
    pub accelerator_types: Vec<AcceleratorType>,
    /// How KV moves from prefill to decode (our extension; default Direct).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<Transport>,
}

/// One pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// Pool name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Pods of the pool (same namespace).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::string_map")]
    pub match_labels: BTreeMap<String, String>,
    /// Desired replicas (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub replicas: Option<i32>,
    /// An `acceleratorTypes[].name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accelerator_type: Option<String>,
}

/// One accelerator description.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcceleratorType {
    /// Name pools refer to.
    pub name: String,
    /// Vendor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<String>,
    /// Model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Node labels of this accelerator.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::string_map")]
    pub match_labels: BTreeMap<String, String>,
}

/// KV transfer between prefill and decode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Transport {
    /// Mooncake transfer engine.
    Mooncake,
    /// NVIDIA NIXL.
    #[serde(rename = "NIXL")]
    Nixl,
    /// Engine-to-engine, no transfer service (the default).
    #[default]
    Direct,
}

/// Reserved, as in the reference.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PDTopologyStatus {
    /// Generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Conditions, keyed by type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,
}

fn pools_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    super::schema::map_list::<Pool>(g, "name")
}

fn accelerators_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    super::schema::map_list::<AcceleratorType>(g, "name")
}

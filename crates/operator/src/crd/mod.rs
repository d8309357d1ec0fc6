//! The custom resources of group `inferencecache.io`, version `v1alpha1`,
//! generated from Rust types (kube's `CustomResource` derive and schemars).
//!
//! Kinds, short names, print columns and field names are the reference's, so
//! its manifests apply unchanged. Validation lives in the OpenAPI schema where
//! a 1.20 apiserver can express it (enums, minimums, patterns, defaults,
//! map-lists); the rest (one CachePolicy per namespace, the reserved probe
//! tenant, `requireChain` needing chain matching) is the admission webhook's
//! job, because CEL rules need a newer apiserver.

mod backend;
mod index;
mod pd;
mod policy;
mod template;
mod tenant;

pub use backend::{
    CACHE_DOMAIN_LABEL, CacheBackend, CacheBackendSpec, CacheBackendStatus, EngineSelector,
    IndexParticipation, Integration, IntegrationMode, Observation, Runtime,
};
pub use index::{
    CACHE_INDEX_NAME, CacheIndex, CacheIndexSpec, CacheIndexStatus, IndexedReplica, IndexedTenant,
    PrefixSummary, Prefixes,
};
pub use pd::{AcceleratorType, PDTopology, PDTopologySpec, PDTopologyStatus, Pool, Transport};
pub use policy::{
    AffinityRouting, CachePolicy, CachePolicySpec, CachePolicyStatus, Eviction,
    MAX_TENTATIVE_TTL_SECONDS, Ranking, Routing, Strategy,
};
pub use template::{PromptTemplate, PromptTemplateSpec, PromptTemplateStatus, Slot, SlotType};
pub use tenant::{CacheTenant, CacheTenantSpec, CacheTenantStatus, IsolationMode, TenantQuota};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// The API group of every kind.
pub const GROUP: &str = "inferencecache.io";
/// The tenant the server reserves for its functional self-test.
pub use inferencecache_control_api::PROBE_TENANT;

/// Every CRD, in the order `inferencecache crds` prints them.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![
        CacheBackend::crd(),
        CacheIndex::crd(),
        CachePolicy::crd(),
        CacheTenant::crd(),
        PDTopology::crd(),
        PromptTemplate::crd(),
    ]
}

/// Why the CRDs could not be rendered.
#[derive(Debug, thiserror::Error)]
#[error("render CRD YAML: {0}")]
pub struct RenderError(String);

impl RenderError {
    /// A render failure with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// One CRD as a YAML document (the file under `config/crd/bases/`).
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, RenderError> {
    // Through serde_json::Value: the CRD types serialize their optional
    // fields away, and a Value renders with stable key order.
    let value = serde_json::to_value(crd).map_err(|e| RenderError(e.to_string()))?;
    serde_saphyr::to_string(&value).map_err(|e| RenderError(e.to_string()))
}

/// Every CRD as one multi-document YAML stream, ready for `kubectl apply -f -`.
pub fn all_yaml() -> Result<String, RenderError> {
    let mut out = String::new();
    for crd in all() {
        out.push_str("---\n");
        out.push_str(&to_yaml(&crd)?);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

/// The file name of a CRD under `config/crd/bases/` (`<group>_<plural>.yaml`,
/// the kubebuilder convention the reference uses).
pub fn file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// Schema helpers shared by the kinds.
pub(crate) mod schema {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

    /// `conditions[]`: a map-list keyed by `type`, like metav1 conditions.
    pub(crate) fn conditions(generator: &mut SchemaGenerator) -> Schema {
        let item = generator.subschema_for::<Condition>();
        json_schema!({
            "type": "array",
            "items": item,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        })
    }

    /// An RFC 3339 timestamp kept as a string (the server's `/snapshot`
    /// already writes them that way).
    pub(crate) fn date_time(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "format": "date-time"})
    }

    /// An optional RFC 3339 timestamp.
    pub(crate) fn opt_date_time(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "string", "format": "date-time", "nullable": true})
    }

    /// A map-list of `T` keyed by `key`.
    pub(crate) fn map_list<T: JsonSchema>(generator: &mut SchemaGenerator, key: &str) -> Schema {
        let item = generator.subschema_for::<T>();
        json_schema!({
            "type": "array",
            "items": item,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": [key],
        })
    }

    /// `matchLabels`-style string maps.
    pub(crate) fn string_map(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": "object", "additionalProperties": {"type": "string"}})
    }
}

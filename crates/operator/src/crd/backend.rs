//! CacheBackend, slim: which engine pods take part (engineSelector), what
//! they run, and how the subscriber sidecar observes them. The reference's
//! LMCache / Redis provisioning is deliberately not here (see
//! `docs/decisions.md`); the kind exists so the pod webhook can select pods
//! and the poller can report `status.indexParticipation`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The label key an engine selector must use.
pub const CACHE_DOMAIN_LABEL: &str = "inferencecache.io/cache-domain";

/// A cache backend for a group of engine pods.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "inferencecache.io",
    version = "v1alpha1",
    kind = "CacheBackend",
    namespaced,
    shortname = "cb",
    status = "CacheBackendStatus",
    // Only fields something writes: the spec's runtime, and the poller's
    // matchedEnginePods and indexParticipation (no Ready condition or
    // remote storage: the provisioning side is not implemented).
    printcolumn = r#"{"name":"Runtime","type":"string","jsonPath":".spec.runtime"}"#,
    printcolumn = r#"{"name":"Matched","type":"integer","jsonPath":".status.matchedEnginePods"}"#,
    printcolumn = r#"{"name":"Prefixes","type":"integer","jsonPath":".status.indexParticipation.prefixCount"}"#,
    printcolumn = r#"{"name":"LastEvent","type":"date","jsonPath":".status.indexParticipation.lastEventAt"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CacheBackendSpec {
    /// The engine the selected pods run.
    pub runtime: Runtime,
    /// Backend type (kept for the reference's manifests; only the
    /// observation side is implemented).
    #[serde(default, rename = "type")]
    pub backend_type: BackendType,
    /// Pods of this backend: `{inferencecache.io/cache-domain: <value>}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_selector: Option<EngineSelector>,
    /// How the subscriber sidecar observes the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation: Option<Observation>,
    /// Integration with the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integration: Option<Integration>,
}

/// Engine kind.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Runtime {
    /// vLLM.
    #[default]
    #[serde(rename = "VLLM")]
    Vllm,
    /// SGLang.
    #[serde(rename = "SGLang")]
    SgLang,
}

impl Runtime {
    /// The subscriber's `--hash-scheme`.
    pub fn hash_scheme(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::SgLang => "sglang",
        }
    }

    /// The engine's default HTTP (metrics) port.
    pub fn default_port(self) -> u16 {
        match self {
            Self::Vllm => 8000,
            Self::SgLang => 30000,
        }
    }
}

/// Backend type.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum BackendType {
    /// LMCache (default).
    #[default]
    #[serde(rename = "LMCache")]
    LmCache,
    /// SGLang's host-memory cache.
    #[serde(rename = "SGLangHiCache")]
    SgLangHiCache,
}

/// Engine pod selector.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EngineSelector {
    /// Exactly one key, `inferencecache.io/cache-domain`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::schema::string_map")]
    pub match_labels: BTreeMap<String, String>,
}

impl EngineSelector {
    /// Whether a pod with `labels` is selected (an empty selector selects
    /// nothing: injection must be opted into).
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.match_labels.is_empty()
            && self
                .match_labels
                .iter()
                .all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// Observation settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Observation {
    /// Model id the sidecar reports (required for injection).
    #[serde(default, rename = "modelID", skip_serializing_if = "Option::is_none")]
    pub model_id: Option<String>,
    /// How long to wait for the first KV event, as a Go duration.
    #[serde(
        default = "default_first_event_timeout",
        skip_serializing_if = "Option::is_none"
    )]
    pub first_event_timeout: Option<String>,
}

/// Integration settings.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Integration {
    /// Offload (default) or EventsOnly.
    #[serde(default)]
    pub mode: IntegrationMode,
}

/// Integration mode.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum IntegrationMode {
    /// The engine offloads to the backend (T2 tier).
    #[default]
    Offload,
    /// Observe KV events only.
    EventsOnly,
}

/// Backend status (the slice this operator writes).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CacheBackendStatus {
    /// Generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Engine pods the selector matches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched_engine_pods: Option<i32>,
    /// What the index holds for this backend's pods (the CacheIndex poller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_participation: Option<IndexParticipation>,
    /// Conditions, keyed by type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// The index's view of a backend.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IndexParticipation {
    /// Prefixes summed over the backend's replicas.
    #[serde(default)]
    pub prefix_count: i64,
    /// Newest KV event of any of its replicas (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::schema::opt_date_time")]
    pub last_event_at: Option<String>,
    /// Never populated (as in the reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hit_rate: Option<String>,
    /// T2 hit rate over the replicas that report T2 queries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t2_hit_rate: Option<String>,
}

#[allow(clippy::unnecessary_wraps)]
fn default_first_event_timeout() -> Option<String> {
    Some("5m".into())
}

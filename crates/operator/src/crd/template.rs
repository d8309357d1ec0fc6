//! PromptTemplate: a prompt template the server renders (RenderTemplate);
//! the operator pushes every template to the server's `/templates`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A template body with named slots.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "inferencecache.io",
    version = "v1alpha1",
    kind = "PromptTemplate",
    namespaced,
    shortname = "pt",
    status = "PromptTemplateStatus",
    printcolumn = r#"{"name":"Revision","type":"string","jsonPath":".status.templateRevision"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
pub struct PromptTemplateSpec {
    /// The template text.
    #[schemars(length(min = 1))]
    pub body: String,
    /// Its slots, keyed by name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "slots_schema")]
    pub slots: Vec<Slot>,
}

/// One slot of a template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Slot {
    /// Slot name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Whether the slot's content is stable across requests (cacheable).
    #[serde(rename = "type")]
    pub slot_type: SlotType,
    /// Whether a render must fill it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Slot kind.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SlotType {
    /// Same across requests: part of the cacheable prefix.
    #[default]
    Stable,
    /// Changes per request.
    Mutable,
}

/// Reserved, as in the reference.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromptTemplateStatus {
    /// Generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Revision the server holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_revision: Option<String>,
    /// Conditions, keyed by type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "super::schema::conditions")]
    pub conditions: Vec<Condition>,
}

fn slots_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
    super::schema::map_list::<Slot>(g, "name")
}

//! The `/templates` push body: prompt templates for `RenderTemplate`.
//!
//! `POST /templates` takes a JSON array of [`PromptTemplate`] and replaces the
//! whole set (replace-on-write, like `/policy`). A `--templates-dir` holds one
//! YAML or JSON file per template with the same object. The operator builds
//! these from PromptTemplate objects (`spec.body`, `spec.slots`) plus the
//! object's namespace and name.

use serde::{Deserialize, Serialize};

/// One template, addressed as `namespace/name` by `RenderTemplate.template_ref`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PromptTemplate {
    /// Namespace (the tenant); the first half of the ref.
    pub namespace: String,
    /// Name; the second half of the ref.
    pub name: String,
    /// Revision reported back by `RenderTemplate`; when absent the server
    /// uses the first 16 hex digits of SHA-256 of the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The template body (minijinja syntax).
    pub body: String,
    /// The named slots, in the order they appear.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<TemplateSlot>,
}

/// One slot of a template.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TemplateSlot {
    /// Variable name used in the body.
    pub name: String,
    /// Whether the slot's value is part of the stable prefix.
    #[serde(rename = "type")]
    pub kind: SlotKind,
    /// A required slot must be present in `RenderTemplate.variables`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    /// Free text for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Slot type, spelled as in the PromptTemplate CRD.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SlotKind {
    /// Same value across requests: part of the cacheable prefix.
    #[default]
    Stable,
    /// Changes per request: the stable prefix ends where the first one starts.
    Mutable,
}

//! Prompt templates and `RenderTemplate`.
//!
//! Templates are PromptTemplate objects (`subscriber-and-control-plane.md`
//! B.1, plus `namespace`, `name` and an optional `revision`), loaded from
//! `--templates-dir` (one YAML or JSON file per template, reloaded on change)
//! or pushed by the operator to `POST /templates` (a JSON array,
//! replace-on-write). Every body is compiled once when it is loaded; a push
//! or directory with one bad template is refused whole and the last good set
//! stays in force.
//!
//! `RenderTemplate` renders with minijinja (strict undefined, bounded fuel)
//! and keys the stable part of the prompt (see [`render`] for the cut).

mod render;
mod source;

pub use render::{
    CompileError, CompiledTemplate, MAX_TEMPLATE_BODY_BYTES, MUTABLE_SENTINEL, RENDER_FUEL,
    RenderError, Rendered, Slot, SlotKind, default_revision,
};
pub use source::{TEMPLATES_DIR, decode_templates_json, load_templates_dir};

use crate::metrics::Metrics;
use crate::named::NamedStore;
use inferencecache_proto::Reason;
use inferencecache_proto::v1alpha1::{RenderTemplateRequest, RenderTemplateResponse};

/// The loaded templates, by `namespace/name`.
pub type TemplateStore = NamedStore<CompiledTemplate>;

/// Answers one RenderTemplate: `OK`, `TEMPLATE_NOT_FOUND` or `RENDER_ERROR`
/// (logged with the reason, never with variable values). Counted by reason.
pub fn render_template(
    store: &TemplateStore,
    metrics: &Metrics,
    req: &RenderTemplateRequest,
) -> RenderTemplateResponse {
    let resp = match store.get(&req.template_ref) {
        None => RenderTemplateResponse {
            reason_code: Reason::TemplateNotFound.as_str().into(),
            ..Default::default()
        },
        Some(t) => match t.render(&req.variables) {
            Ok(r) => RenderTemplateResponse {
                stable_prefix_hash: r.stable_prefix_hash(),
                rendered_prompt: r.prompt.into_bytes(),
                tenant_namespace: t.namespace().as_bytes().to_vec(),
                reason_code: Reason::Ok.as_str().into(),
                template_revision: t.revision().to_owned(),
            },
            Err(e) => {
                tracing::warn!(
                    template_ref = %req.template_ref,
                    revision = t.revision(),
                    reason = e.label(),
                    error = %e,
                    "render_template_failed"
                );
                RenderTemplateResponse {
                    reason_code: Reason::RenderError.as_str().into(),
                    template_revision: t.revision().to_owned(),
                    tenant_namespace: t.namespace().as_bytes().to_vec(),
                    ..Default::default()
                }
            }
        },
    };
    metrics.stores.render_template_call(&resp.reason_code);
    resp
}

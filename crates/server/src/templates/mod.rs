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

pub(crate) use render::{CompiledTemplate, Rendered};
pub(crate) use source::{TEMPLATES_DIR, decode_templates_json};

use crate::metrics::Metrics;
use crate::named::NamedStore;
use inferencecache_proto::Reason;
use std::collections::HashMap;
use std::sync::Arc;

/// The loaded templates, by `namespace/name`.
pub(crate) type TemplateStore = NamedStore<CompiledTemplate>;

/// One RenderTemplate question (`convert` borrows it from the wire request).
#[derive(Debug, Clone, Copy)]
pub struct RenderRequest<'a> {
    /// `namespace/name` of the template.
    pub template: &'a str,
    /// The values of its slots.
    pub variables: &'a HashMap<String, String>,
}

/// What RenderTemplate answers.
#[derive(Debug)]
pub enum RenderOutcome {
    /// `TEMPLATE_NOT_FOUND`.
    NotFound,
    /// `OK`: the prompt and the template it came from.
    Rendered {
        /// The template.
        template: Arc<CompiledTemplate>,
        /// The prompt and its stable part.
        rendered: Rendered,
    },
    /// `RENDER_ERROR` (logged with the reason, never with variable values).
    Failed {
        /// The template.
        template: Arc<CompiledTemplate>,
    },
}

impl RenderOutcome {
    /// The response's reason code.
    pub fn reason(&self) -> Reason {
        match self {
            Self::NotFound => Reason::TemplateNotFound,
            Self::Rendered { .. } => Reason::Ok,
            Self::Failed { .. } => Reason::RenderError,
        }
    }
}

/// Answers one RenderTemplate: `OK`, `TEMPLATE_NOT_FOUND` or `RENDER_ERROR`
/// (logged with the reason, never with variable values). Counted by reason.
pub(crate) fn render_template(
    store: &TemplateStore,
    metrics: &Metrics,
    req: &RenderRequest<'_>,
) -> RenderOutcome {
    let out = match store.get(req.template) {
        None => RenderOutcome::NotFound,
        Some(t) => match t.render(req.variables) {
            Ok(rendered) => RenderOutcome::Rendered {
                template: t,
                rendered,
            },
            Err(e) => {
                tracing::warn!(
                    template_ref = %req.template,
                    revision = t.revision(),
                    reason = e.label(),
                    error = %e,
                    "render_template_failed"
                );
                RenderOutcome::Failed { template: t }
            }
        },
    };
    metrics.stores.render_template_call(out.reason().as_str());
    out
}

//! One compiled prompt template and its rendering, including the
//! stable-prefix cut.
//!
//! # The stable-prefix cut
//!
//! `stable_prefix_hash` keys the part of a rendered prompt that is the same
//! for every request that passes the same Stable values: the text before the
//! first Mutable slot's value. A template is free Jinja, so a slot's value
//! can land anywhere (or nowhere, or transformed by a filter), and text
//! before it can even depend on it (`{% if question %}`). The cut is
//! therefore found by rendering twice:
//!
//! 1. the real rendering `R` with the request's variables;
//! 2. a probe rendering `S` where the value of every Mutable slot the request
//!    sets is replaced by [`MUTABLE_SENTINEL`] (three Unicode private-use
//!    characters no prompt contains and no filter changes).
//!
//! The stable prefix is the longest common prefix of `R` and `S`, shortened
//! to a UTF-8 character boundary: everything the Mutable values cannot have
//! influenced. When the first Mutable value is inserted verbatim that is
//! exactly the text before it; when a Mutable value also steers earlier text,
//! the cut moves up to the first byte it changed. A template with no Mutable
//! slot (or a request that sets none) is stable as a whole and is rendered
//! once. An empty stable prefix (a Mutable value comes first) yields an empty
//! `stable_prefix_hash`: there is nothing stable to key on (decision 4, "no
//! empty keys").

use inferencecache_fingerprint::{SEED, to_wire};
use minijinja::{Environment, UndefinedBehavior, Value};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};

/// What replaces a Mutable slot's value in the probe rendering.
pub(crate) const MUTABLE_SENTINEL: &str = "\u{E000}\u{E001}\u{E002}";

/// Template instructions one rendering may execute (minijinja fuel): a
/// template loop cannot pin a handler thread.
pub(crate) const RENDER_FUEL: u64 = 1_000_000;

/// Most bytes of one template body.
pub(crate) const MAX_TEMPLATE_BODY_BYTES: usize = 256 * 1024;

/// A slot's role in the stable-prefix cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// The same value across many requests (a system prompt, a tool list).
    Stable,
    /// Differs per request (the user's question).
    Mutable,
}

/// One declared slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// Variable name.
    pub name: String,
    /// Stable or Mutable.
    pub kind: SlotKind,
    /// A request that leaves it out gets RENDER_ERROR.
    pub required: bool,
}

/// Why a template was refused when loaded.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// Namespace or name is empty or holds a `/`.
    #[error(
        "template {namespace:?}/{name:?}: namespace and name must be non-empty and hold no '/'"
    )]
    BadRef {
        /// Namespace as given.
        namespace: String,
        /// Name as given.
        name: String,
    },
    /// The body is empty or too large.
    #[error("template {template}: body must be 1..={MAX_TEMPLATE_BODY_BYTES} bytes, got {len}")]
    BodySize {
        /// `namespace/name`.
        template: String,
        /// Its length.
        len: usize,
    },
    /// Two slots share a name, or a slot name is empty.
    #[error("template {template}: slot names must be unique and non-empty ({slot:?})")]
    BadSlot {
        /// `namespace/name`.
        template: String,
        /// The offending slot name.
        slot: String,
    },
    /// The body is not valid Jinja.
    #[error("template {template}: {source}")]
    Syntax {
        /// `namespace/name`.
        template: String,
        /// The parser's error.
        #[source]
        source: minijinja::Error,
    },
}

/// Why a rendering failed (RENDER_ERROR). Messages never hold variable values.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// A required slot was not among the variables.
    #[error("required slot {0:?} is missing")]
    MissingSlot(String),
    /// The template failed (undefined variable, bad operation, out of fuel).
    #[error("{kind:?} at line {line}")]
    Template {
        /// minijinja's error kind.
        kind: minijinja::ErrorKind,
        /// Template line, 0 if unknown.
        line: usize,
    },
}

impl RenderError {
    /// A short label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Self::MissingSlot(_) => "missing_slot",
            Self::Template {
                kind: minijinja::ErrorKind::UndefinedError,
                ..
            } => "undefined",
            Self::Template {
                kind: minijinja::ErrorKind::OutOfFuel,
                ..
            } => "out_of_fuel",
            Self::Template { .. } => "template",
        }
    }
}

/// A successful rendering.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// The full prompt.
    pub prompt: String,
    /// Byte length of the stable prefix (a char boundary of `prompt`).
    pub stable_len: usize,
}

impl Rendered {
    /// The stable prefix text.
    pub fn stable_prefix(&self) -> &str {
        self.prompt.get(..self.stable_len).unwrap_or_default()
    }

    /// 8-byte big-endian XXH3-64 (seed 1337) of the stable prefix; empty
    /// when the prefix is empty.
    pub fn stable_prefix_hash(&self) -> Vec<u8> {
        if self.stable_len == 0 {
            return Vec::new();
        }
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(self.stable_prefix().as_bytes(), SEED);
        to_wire(h).to_vec()
    }
}

/// A loaded template, compiled once.
pub struct CompiledTemplate {
    namespace: String,
    name: String,
    revision: String,
    slots: Vec<Slot>,
    env: Environment<'static>,
}

impl std::fmt::Debug for CompiledTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledTemplate")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .field("revision", &self.revision)
            .finish_non_exhaustive()
    }
}

/// The name the body is registered under: no file extension, so minijinja
/// never turns on HTML auto-escaping.
const BODY: &str = "body";

/// `revision`, or the first 16 hex digits of SHA-256(body).
pub(crate) fn default_revision(body: &str) -> String {
    let d = Sha256::digest(body.as_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

impl CompiledTemplate {
    /// Validates and compiles a template.
    pub fn compile(
        namespace: &str,
        name: &str,
        revision: Option<&str>,
        body: &str,
        slots: Vec<Slot>,
    ) -> Result<Self, CompileError> {
        let bad_part = |s: &str| s.is_empty() || s.contains('/');
        if bad_part(namespace) || bad_part(name) {
            return Err(CompileError::BadRef {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            });
        }
        let template = format!("{namespace}/{name}");
        if body.is_empty() || body.len() > MAX_TEMPLATE_BODY_BYTES {
            return Err(CompileError::BodySize {
                template,
                len: body.len(),
            });
        }
        let mut seen = std::collections::HashSet::new();
        for s in &slots {
            if s.name.is_empty() || !seen.insert(s.name.as_str()) {
                return Err(CompileError::BadSlot {
                    template,
                    slot: s.name.clone(),
                });
            }
        }
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        // The body is the prompt: a final newline is part of it.
        env.set_keep_trailing_newline(true);
        env.set_fuel(Some(RENDER_FUEL));
        env.add_template_owned(BODY, body.to_owned())
            .map_err(|source| CompileError::Syntax {
                template: template.clone(),
                source,
            })?;
        let revision = match revision {
            Some(r) if !r.is_empty() => r.to_owned(),
            _ => default_revision(body),
        };
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            revision,
            slots,
            env,
        })
    }

    /// The namespace (RenderTemplate's `tenant_namespace`).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The revision in force.
    pub fn revision(&self) -> &str {
        &self.revision
    }

    /// The declared slots.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    fn render_with(&self, vars: &BTreeMap<&str, &str>) -> Result<String, RenderError> {
        let ctx: BTreeMap<&str, Value> = vars.iter().map(|(k, v)| (*k, Value::from(*v))).collect();
        self.env
            .get_template(BODY)
            .and_then(|t| t.render(ctx))
            .map_err(|e| RenderError::Template {
                kind: e.kind(),
                line: e.line().unwrap_or(0),
            })
    }

    /// Renders the body over `variables` (strict undefined) and finds the
    /// stable prefix (see the module docs). Deterministic: the same
    /// variables always give the same bytes.
    pub fn render(&self, variables: &HashMap<String, String>) -> Result<Rendered, RenderError> {
        if let Some(missing) = self
            .slots
            .iter()
            .find(|s| s.required && !variables.contains_key(&s.name))
        {
            return Err(RenderError::MissingSlot(missing.name.clone()));
        }
        // A sorted map: iteration order never depends on the hasher.
        let real: BTreeMap<&str, &str> = variables
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let prompt = self.render_with(&real)?;
        let mut probe = real.clone();
        let mut any_mutable = false;
        for s in self.slots.iter().filter(|s| s.kind == SlotKind::Mutable) {
            if let Some(v) = probe.get_mut(s.name.as_str()) {
                *v = MUTABLE_SENTINEL;
                any_mutable = true;
            }
        }
        if !any_mutable {
            let stable_len = prompt.len();
            return Ok(Rendered { prompt, stable_len });
        }
        let probed = self.render_with(&probe)?;
        let mut stable_len = prompt
            .bytes()
            .zip(probed.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        while !prompt.is_char_boundary(stable_len) {
            stable_len -= 1;
        }
        Ok(Rendered { prompt, stable_len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(name: &str, kind: SlotKind, required: bool) -> Slot {
        Slot {
            name: name.into(),
            kind,
            required,
        }
    }

    fn vars(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn t(body: &str, slots: Vec<Slot>) -> CompiledTemplate {
        CompiledTemplate::compile("ns", "t", None, body, slots).unwrap()
    }

    #[test]
    fn the_cut_is_the_text_before_the_first_mutable_value() {
        let tpl = t(
            "System: {{ sys }}\nUser: {{ q }}\nTools: {{ tools }}",
            vec![
                slot("sys", SlotKind::Stable, true),
                slot("q", SlotKind::Mutable, true),
                slot("tools", SlotKind::Stable, false),
            ],
        );
        let r = tpl
            .render(&vars(&[("sys", "be brief"), ("q", "why?"), ("tools", "x")]))
            .unwrap();
        assert_eq!(r.prompt, "System: be brief\nUser: why?\nTools: x");
        assert_eq!(r.stable_prefix(), "System: be brief\nUser: ");
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(b"System: be brief\nUser: ", 1337);
        assert_eq!(r.stable_prefix_hash(), h.to_be_bytes().to_vec());
        // Another question, same stable part: same key.
        let r2 = tpl
            .render(&vars(&[("sys", "be brief"), ("q", "how?"), ("tools", "y")]))
            .unwrap();
        assert_eq!(r2.stable_prefix_hash(), r.stable_prefix_hash());
    }

    #[test]
    fn mutable_first_gives_an_empty_prefix_and_no_key() {
        let tpl = t(
            "{{ q }} -- {{ sys }}",
            vec![
                slot("q", SlotKind::Mutable, true),
                slot("sys", SlotKind::Stable, true),
            ],
        );
        let r = tpl.render(&vars(&[("q", "hi"), ("sys", "s")])).unwrap();
        assert_eq!(r.prompt, "hi -- s");
        assert_eq!(r.stable_len, 0);
        assert!(r.stable_prefix_hash().is_empty());
    }

    #[test]
    fn a_mutable_value_that_steers_earlier_text_moves_the_cut_up() {
        let tpl = t(
            "A{% if q|length > 3 %}long{% endif %}B{{ q }}",
            vec![slot("q", SlotKind::Mutable, true)],
        );
        let r = tpl.render(&vars(&[("q", "abcdef")])).unwrap();
        assert_eq!(r.prompt, "AlongBabcdef");
        // The sentinel is 3 chars, so the probe renders "AB...": the cut is "A".
        assert_eq!(r.stable_prefix(), "A");
    }

    #[test]
    fn no_mutable_value_means_all_stable() {
        let tpl = t(
            "Hello {{ who }}\n",
            vec![slot("who", SlotKind::Stable, true)],
        );
        let r = tpl.render(&vars(&[("who", "you")])).unwrap();
        assert_eq!(
            r.stable_prefix(),
            "Hello you\n",
            "the final newline is kept"
        );
    }

    #[test]
    fn cut_lands_on_a_char_boundary() {
        // U+E003 shares its first two UTF-8 bytes with the sentinel's first
        // char: the byte-wise common prefix ends inside it and is cut back.
        let tpl = t("é{{ q }}", vec![slot("q", SlotKind::Mutable, true)]);
        let r = tpl.render(&vars(&[("q", "\u{E003}")])).unwrap();
        assert_eq!(r.stable_prefix(), "é");
    }

    #[test]
    fn missing_required_slot_and_undefined_variable_are_errors() {
        let tpl = t(
            "{{ a }}{{ b }}",
            vec![
                slot("a", SlotKind::Stable, true),
                slot("b", SlotKind::Mutable, false),
            ],
        );
        let e = tpl.render(&vars(&[("b", "x")])).unwrap_err();
        assert_eq!(e.label(), "missing_slot");
        let e = tpl.render(&vars(&[("a", "x")])).unwrap_err();
        assert_eq!(e.label(), "undefined", "{e}");
    }

    #[test]
    fn runaway_loops_run_out_of_fuel() {
        let tpl = t(
            "{% for i in range(10000) %}{% for j in range(10000) %}x{% endfor %}{% endfor %}",
            vec![],
        );
        assert_eq!(
            tpl.render(&HashMap::new()).unwrap_err().label(),
            "out_of_fuel"
        );
    }

    #[test]
    fn html_is_never_escaped_and_revision_defaults_to_the_body_digest() {
        let tpl = t("<b>{{ x }}</b>", vec![]);
        assert_eq!(
            tpl.render(&vars(&[("x", "<&>")])).unwrap().prompt,
            "<b><&></b>"
        );
        assert_eq!(tpl.revision().len(), 16);
        assert_eq!(tpl.revision(), default_revision("<b>{{ x }}</b>"));
        let pinned = CompiledTemplate::compile("a", "b", Some("v7"), "x", vec![]).unwrap();
        assert_eq!(pinned.revision(), "v7");
    }

    #[test]
    fn bad_templates_are_refused_at_load() {
        let c = |ns, n, body: &str, slots| CompiledTemplate::compile(ns, n, None, body, slots);
        assert!(matches!(
            c("", "n", "x", vec![]),
            Err(CompileError::BadRef { .. })
        ));
        assert!(matches!(
            c("a/b", "n", "x", vec![]),
            Err(CompileError::BadRef { .. })
        ));
        assert!(matches!(
            c("a", "n", "", vec![]),
            Err(CompileError::BodySize { .. })
        ));
        assert!(matches!(
            c("a", "n", "{% if %}", vec![]),
            Err(CompileError::Syntax { .. })
        ));
        let dup = vec![
            slot("x", SlotKind::Stable, false),
            slot("x", SlotKind::Mutable, false),
        ];
        assert!(matches!(
            c("a", "n", "x", dup),
            Err(CompileError::BadSlot { .. })
        ));
    }
}

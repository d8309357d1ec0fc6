//! `prompt_text` support (`server.md` §3.3, §3.8, decision 3): the model's own
//! Hugging Face tokenizer and chat template, so the server tokenizes exactly
//! as the engine will. The text is wrapped as one user message, the template
//! is applied with the generation prompt the way HF transformers does
//! (`trim_blocks`, `lstrip_blocks`, `tojson`, `raise_exception`, Python string
//! methods, special-token variables from the config), and the rendered text
//! is encoded without adding special tokens.
//!
//! Models are loaded eagerly at startup from `--tokenizer-models-dir`: every
//! directory holding a `tokenizer.json` (or, for tiktoken models, a
//! `tiktoken.model` / `*.tiktoken` file: see [`crate::tokenize::tiktoken`]) is a model
//! whose id is its path relative to the root (e.g. `Qwen/Qwen3-8B`). A
//! request's `model_id` is only ever a key into that set, never a path.
//!
//! Inside: [`prefix`] (the bounded per-model cache that reuses a re-sent
//! conversation's ids), `split` (the encode without HF's offset bookkeeping
//! for GPT-4-style tokenizers), `bpe` (its merges without HF's per-word
//! allocations) and `tiktoken` (a model's BPE file).

pub(crate) mod bpe;
pub mod prefix;
pub(crate) mod split;
pub(crate) mod tiktoken;

use crate::tokenize::prefix::{CutRule, PrefixCache, PrefixCacheMetrics};
/// The template value type [`ChatRender`] carries (minijinja's).
pub use minijinja::Value;
use minijinja::{Environment, Error as JinjaError, ErrorKind};
use std::collections::HashMap;
use std::path::{Component, Path};
use std::sync::Arc;

/// Why a tokenization failed (the lookup then fails open).
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// No model with this id was loaded.
    #[error("no tokenizer loaded for model {0:?}")]
    UnknownModel(String),
    /// The model has no chat template.
    #[error("model {0:?} has no chat_template in tokenizer_config.json")]
    NoTemplate(String),
    /// Template rendering failed.
    #[error("chat template: {0}")]
    Template(String),
    /// The tokenizer failed.
    #[error("encode: {0}")]
    Encode(String),
    /// Loading failed.
    #[error("load {path}: {message}")]
    Load {
        /// The model directory.
        path: String,
        /// What went wrong.
        message: String,
    },
}

/// A model's encoder: Hugging Face `tokenizer.json` or a tiktoken BPE file.
enum Encoder {
    Hf(Box<tokenizers::Tokenizer>),
    /// HF with the split regex on a DFA ([`crate::tokenize::split`]).
    Fast(
        Box<crate::tokenize::split::FastTokenizer>,
        Box<crate::tokenize::split::FastEncoder>,
    ),
    Tiktoken(Box<crate::tokenize::tiktoken::TiktokenEncoder>),
}

type HfImpl = tokenizers::TokenizerImpl<
    tokenizers::ModelWrapper,
    tokenizers::NormalizerWrapper,
    tokenizers::PreTokenizerWrapper,
    tokenizers::PostProcessorWrapper,
    tokenizers::DecoderWrapper,
>;

fn hf_impl(t: &tokenizers::Tokenizer) -> &HfImpl {
    t
}

/// True for a directory that holds a model's tokenizer.
fn is_model_dir(dir: &Path) -> bool {
    dir.join("tokenizer.json").is_file()
        || crate::tokenize::tiktoken::find_tiktoken_file(dir).is_some()
}

/// One model: its tokenizer and chat template.
pub struct ChatTokenizer {
    id: String,
    tokenizer: Encoder,
    env: Option<Environment<'static>>,
    specials: HashMap<String, String>,
    /// Where a Hugging Face encode may be split (None: this tokenizer's
    /// shape is outside the argument in [`crate::tokenize::prefix`]).
    cut_rule: Option<CutRule>,
    prefix: Option<PrefixCache>,
}

impl std::fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTokenizer")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A special-token entry of `tokenizer_config.json`: a string or an
/// `{"content": ...}` object.
fn token_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{name, template}` where
/// "default" wins.
fn chat_template(config: &serde_json::Value) -> Option<String> {
    match config.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => {
            let named = |n: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(|x| x.as_str()) == Some(n))
                    .and_then(|t| t.get("template")?.as_str().map(str::to_owned))
            };
            named("default").or_else(|| {
                list.first()
                    .and_then(|t| t.get("template")?.as_str().map(str::to_owned))
            })
        }
        _ => None,
    }
}

fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

fn environment(template: String) -> Result<Environment<'static>, JinjaError> {
    let mut env = Environment::new();
    // HF transformers renders chat templates with these settings.
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_template_owned("chat", template)?;
    Ok(env)
}

impl ChatTokenizer {
    /// Loads `dir/tokenizer.json` and, if present, `dir/tokenizer_config.json`.
    pub fn load(id: &str, dir: &Path) -> Result<Self, TokenizeError> {
        let err = |message: String| TokenizeError::Load {
            path: dir.display().to_string(),
            message,
        };
        let config: serde_json::Value = match std::fs::read(dir.join("tokenizer_config.json")) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| err(format!("tokenizer_config.json: {e}")))?,
            Err(_) => serde_json::Value::Null,
        };
        let hf = dir.join("tokenizer.json");
        let mut cut_rule = None;
        let tokenizer = match crate::tokenize::tiktoken::find_tiktoken_file(dir) {
            Some(file) if !hf.is_file() => Encoder::Tiktoken(Box::new(
                crate::tokenize::tiktoken::TiktokenEncoder::load(&file, &config)
                    .map_err(|e| err(format!("{}: {e}", file.display())))?,
            )),
            _ => {
                let bytes = std::fs::read(&hf).map_err(|e| err(format!("tokenizer.json: {e}")))?;
                let json: serde_json::Value = serde_json::from_slice(&bytes)
                    .map_err(|e| err(format!("tokenizer.json: {e}")))?;
                cut_rule = CutRule::for_tokenizer(&json)
                    .inspect_err(|why| {
                        tracing::info!(model_id = %id, why, "tokenize: no prefix cache for this tokenizer");
                    })
                    .ok();
                // Read before `json` becomes the HF tokenizer.
                let bpe = cut_rule.is_some().then(|| {
                    crate::tokenize::bpe::ByteBpe::from_tokenizer_json(
                        &json,
                        &crate::tokenize::split::byte_chars(),
                    )
                    .inspect_err(|why| {
                        tracing::info!(model_id = %id, why = %why, "tokenize: HF BPE merges");
                    })
                    .ok()
                });
                let fast = cut_rule
                    .is_some()
                    .then(|| serde_json::from_value(json))
                    .and_then(|r| {
                        r.inspect_err(|e| {
                            tracing::info!(model_id = %id, error = %e, "tokenize: plain HF split");
                        })
                        .ok()
                    });
                let fast = fast.and_then(|f: crate::tokenize::split::FastTokenizer| {
                    crate::tokenize::split::FastEncoder::new(&f, bpe.flatten())
                        .inspect_err(|e| {
                            tracing::info!(model_id = %id, error = %e, "tokenize: plain HF encode");
                        })
                        .ok()
                        .map(|e| (f, e))
                });
                match fast {
                    Some((f, e)) => Encoder::Fast(Box::new(f), Box::new(e)),
                    None => Encoder::Hf(Box::new(
                        tokenizers::Tokenizer::from_bytes(&bytes)
                            .map_err(|e| err(format!("tokenizer.json: {e}")))?,
                    )),
                }
            }
        };
        let mut specials = HashMap::new();
        for key in [
            "bos_token",
            "eos_token",
            "unk_token",
            "pad_token",
            "sep_token",
            "cls_token",
            "mask_token",
        ] {
            if let Some(t) = config.get(key).and_then(token_text) {
                specials.insert(key.to_owned(), t);
            }
        }
        let env = match chat_template(&config) {
            Some(t) => Some(environment(t).map_err(|e| err(format!("chat_template: {e}")))?),
            None => None,
        };
        Ok(Self {
            id: id.to_owned(),
            tokenizer,
            env,
            specials,
            cut_rule,
            prefix: None,
        })
    }

    /// Keeps up to `budget` bytes of encoded prefixes for reuse (0 or a
    /// tokenizer outside the cut argument: none).
    pub fn with_prefix_cache(mut self, budget: usize, metrics: &PrefixCacheMetrics) -> Self {
        self.prefix = match (&self.cut_rule, budget) {
            (Some(rule), 1..) => Some(PrefixCache::new(rule.clone(), budget, &self.id, metrics)),
            _ => None,
        };
        self
    }

    /// The prefix cache, if enabled.
    pub fn prefix_cache(&self) -> Option<&PrefixCache> {
        self.prefix.as_ref()
    }

    /// Renders `text` as one user message with the generation prompt.
    pub fn render(&self, text: &str) -> Result<String, TokenizeError> {
        let message: HashMap<&str, &str> = HashMap::from([("role", "user"), ("content", text)]);
        self.render_chat(&ChatRender {
            messages: Value::from_serialize([message]),
            add_generation_prompt: true,
            extra: Vec::new(),
        })
    }

    /// Renders a whole conversation the way the engine's chat endpoint does
    /// (HF `apply_chat_template`): the special-token variables, then the
    /// request's extra variables (`tools`, `chat_template_kwargs`, ...), then
    /// `messages` and `add_generation_prompt`. The gateway renders OpenAI
    /// chat requests here, so its tokens are the ones `prompt_text` gets.
    pub fn render_chat(&self, chat: &ChatRender) -> Result<String, TokenizeError> {
        let env = self
            .env
            .as_ref()
            .ok_or_else(|| TokenizeError::NoTemplate(self.id.clone()))?;
        let template = env
            .get_template("chat")
            .map_err(|e| TokenizeError::Template(e.to_string()))?;
        let mut ctx: HashMap<&str, Value> = self
            .specials
            .iter()
            .map(|(k, v)| (k.as_str(), Value::from(v.as_str())))
            .collect();
        for (k, v) in &chat.extra {
            ctx.insert(k.as_str(), v.clone());
        }
        ctx.insert("messages", chat.messages.clone());
        ctx.insert(
            "add_generation_prompt",
            Value::from(chat.add_generation_prompt),
        );
        template
            .render(ctx)
            .map_err(|e| TokenizeError::Template(format!("{e:#}")))
    }

    /// Token ids of a rendered conversation (see [`ChatTokenizer::render_chat`]).
    pub fn encode_messages(&self, chat: &ChatRender) -> Result<Vec<u32>, TokenizeError> {
        let rendered = self.render_chat(chat)?;
        self.encode_rendered(&rendered)
    }

    /// Working memory one tokenization needs per prompt byte, what the
    /// tokenize budget charges (`crate::tokenize_budget`): HF's own encode
    /// keeps offsets and alignment tables, the fast encode and tiktoken do
    /// not.
    pub fn working_bytes_per_prompt_byte(&self) -> usize {
        match self.tokenizer {
            Encoder::Hf(_) => crate::limits::HF_TOKENIZE_BYTES_PER_PROMPT_BYTE,
            Encoder::Fast(..) | Encoder::Tiktoken(_) => {
                crate::limits::TOKENIZE_BYTES_PER_PROMPT_BYTE
            }
        }
    }

    /// The model id this tokenizer was loaded as.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Token ids of `text` wrapped as a chat (no special tokens added on
    /// top of what the template writes).
    pub fn encode_chat(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        let rendered = self.render(text)?;
        self.encode_rendered(&rendered)
    }

    /// Token ids of an already rendered text, through the prefix cache when
    /// there is one.
    pub fn encode_rendered(&self, rendered: &str) -> Result<Vec<u32>, TokenizeError> {
        use crate::tokenize::prefix::{encode, encode_fresh, encode_with_starts};
        match (&self.tokenizer, &self.prefix) {
            (Encoder::Fast(t, fast), cache) => {
                // A segment that is not NFC yet goes the HF way.
                let rest = |s: &str| match fast.encode(t, s) {
                    Some(r) => Ok(r),
                    None => encode_with_starts(t.as_ref(), s),
                };
                match cache {
                    Some(cache) => encode(cache, rendered, rest),
                    None => rest(rendered).map(|(ids, _)| ids),
                }
            }
            (Encoder::Hf(t), Some(cache)) => {
                encode(cache, rendered, |s| encode_with_starts(hf_impl(t), s))
            }
            (Encoder::Hf(t), None) => encode_fresh(hf_impl(t), rendered),
            (Encoder::Tiktoken(t), _) => t.encode(rendered).map_err(TokenizeError::Encode),
        }
    }
}

/// One conversation to render with a model's chat template.
#[derive(Debug, Clone)]
pub struct ChatRender {
    /// The `messages` list (role/content maps, as the template expects).
    pub messages: Value,
    /// Whether to append the assistant turn's opening (`add_generation_prompt`).
    pub add_generation_prompt: bool,
    /// More template variables (`tools`, the request's `chat_template_kwargs`),
    /// set before `messages`.
    pub extra: Vec<(String, Value)>,
}

/// Every loaded model, by id.
#[derive(Debug, Default, Clone)]
pub struct Tokenizers {
    models: Arc<HashMap<String, Arc<ChatTokenizer>>>,
}

/// A model id is safe when it is a plain relative path: non-empty, no
/// backslash, no drive letter, no empty, `.` or `..` segment.
pub fn is_safe_model_id(id: &str) -> bool {
    if id.is_empty() || id.contains('\\') || id.starts_with('/') {
        return false;
    }
    if id.len() >= 2 && id.as_bytes()[1] == b':' {
        return false;
    }
    id.split('/')
        .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        && Path::new(id)
            .components()
            .all(|c| matches!(c, Component::Normal(_)))
}

impl Tokenizers {
    /// No models: every prompt_text lookup fails open.
    pub fn none() -> Self {
        Self::default()
    }

    /// Loads every model under `root`. Unreadable roots, unsafe ids and
    /// broken models are logged and skipped: one bad model must not take the
    /// others (or the server) down.
    pub fn load_dir(root: &Path) -> Self {
        Self::load_dir_cached(root, 0, &PrefixCacheMetrics::default())
    }

    /// As [`Tokenizers::load_dir`], each Hugging Face model with a prefix
    /// cache of `prefix_budget` bytes (0: none).
    pub fn load_dir_cached(
        root: &Path,
        prefix_budget: usize,
        metrics: &PrefixCacheMetrics,
    ) -> Self {
        let mut models = HashMap::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "tokenize: unreadable directory");
                    continue;
                }
            };
            if is_model_dir(&dir) {
                let id = dir
                    .strip_prefix(root)
                    .ok()
                    .and_then(|p| p.to_str())
                    .map(|s| s.replace(std::path::MAIN_SEPARATOR, "/"))
                    .unwrap_or_default();
                if !is_safe_model_id(&id) {
                    tracing::warn!(model_id = %id, "tokenize: skipping unsafe model id");
                    continue;
                }
                match ChatTokenizer::load(&id, &dir) {
                    Ok(t) => {
                        models.insert(id, Arc::new(t.with_prefix_cache(prefix_budget, metrics)));
                    }
                    Err(e) => tracing::warn!(model_id = %id, error = %e, "tokenize: failed model"),
                }
                continue; // a model directory is not searched further
            }
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
        tracing::info!(dir = %root.display(), count = models.len(), "tokenize: loaded tokenizers");
        Self {
            models: Arc::new(models),
        }
    }

    /// Number of loaded models.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// True when no model is loaded.
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// The model's tokenizer.
    pub fn get(&self, model_id: &str) -> Result<Arc<ChatTokenizer>, TokenizeError> {
        self.models
            .get(model_id)
            .cloned()
            .ok_or_else(|| TokenizeError::UnknownModel(model_id.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_must_be_plain_relative_paths() {
        for ok in ["Qwen/Qwen3-8B", "m", "a/b/c"] {
            assert!(is_safe_model_id(ok), "{ok}");
        }
        for bad in [
            "", "/abs", "../x", "a/../b", "a//b", "./a", "a\\b", "C:x", "a/.",
        ] {
            assert!(!is_safe_model_id(bad), "{bad}");
        }
    }

    #[test]
    fn template_settings_match_hf() {
        let env = environment(
            "{% for m in messages %}\n  {{- m.role }}:{{ m.content.strip() | tojson }}\n{% endfor %}\
             {% if add_generation_prompt %}>{% endif %}"
                .into(),
        )
        .unwrap();
        let out = env
            .get_template("chat")
            .unwrap()
            .render(minijinja::context! {
                messages => vec![HashMap::from([("role", "user"), ("content", " hi ")])],
                add_generation_prompt => true,
            })
            .unwrap();
        // Same as Python jinja2 with trim_blocks + lstrip_blocks.
        assert_eq!(out, "user:\"hi\"\n>");
    }

    #[test]
    fn raise_exception_fails_the_render() {
        let env = environment("{{ raise_exception('no system role') }}".into()).unwrap();
        let e = env.get_template("chat").unwrap().render(()).unwrap_err();
        assert!(e.to_string().contains("no system role"));
    }

    #[test]
    fn chat_template_list_form_prefers_default() {
        let cfg = serde_json::json!({"chat_template": [
            {"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]});
        assert_eq!(chat_template(&cfg).as_deref(), Some("D"));
        let obj = serde_json::json!({"content": "<s>", "lstrip": false});
        assert_eq!(token_text(&obj).as_deref(), Some("<s>"));
    }
}

//! From an OpenAI request body to the prompt's token ids, rendered and
//! encoded the way the engine will (the server's `prompt_text` code: the
//! model's chat template through minijinja with HF's settings, and its
//! tokenizer).
//!
//! Chat requests render `messages` (text parts of a list content joined with
//! a newline, as vLLM's "string" content format does) with `tools` and
//! `chat_template_kwargs` as template variables and the request's
//! `add_generation_prompt` (default true). Completion prompts are a string
//! (encoded as is) or token ids (used as is). Anything the gateway cannot
//! reproduce exactly (a per-request `chat_template`, `continue_final_message`,
//! batched prompts, non-text parts) yields no tokens: the request is routed
//! without a hint rather than with a wrong one.

use inferencecache_server::tokenize::{ChatRender, ChatTokenizer, Value};
use inferencecache_server::tokenize_prefix::{DEFAULT_BUDGET_BYTES, PrefixCacheMetrics};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

/// Which OpenAI endpoint a body is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

impl Api {
    /// The path on the engine.
    pub fn path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Completions => "/v1/completions",
        }
    }

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Completions => "completions",
        }
    }
}

/// The routing-relevant facts of a request body.
#[derive(Debug, Clone, Default)]
pub struct Prompt {
    /// `model`.
    pub model: String,
    /// `stream`.
    pub stream: bool,
    /// `cache_salt` (vLLM): passed to the engine untouched.
    pub cache_salt: Option<String>,
    /// The token ids, or empty when they cannot be known exactly.
    pub tokens: Vec<u32>,
    /// Why `tokens` is empty (a metric label), when it is.
    pub no_tokens: Option<&'static str>,
}

/// Text for the tokenizer's warm-up: words, digits, punctuation and
/// whitespace runs, as prompts mix them.
const WARM_UP_TEXT: &str = "You are a helpful assistant. Answer the question below in \
    2-3 sentences; cite sources (e.g. [1], [2]) where you can.\n\n  Question 42: \
    What's the capital of France, and how many people lived there in 1999?\t\
    {\"key\": \"value\", \"n\": 3.14}  <tag>ÄÖÜ ß café naïve — “quoted” 東京 😀</tag>";

/// Tokenizers by base model name (filled as engines are discovered).
#[derive(Debug, Default)]
pub struct Tokenizers {
    by_model: RwLock<HashMap<String, Arc<ChatTokenizer>>>,
    /// Held while an engine's attach loads a model's tokenizer: engines of
    /// one model attach at once, and each loading it (a second or more of
    /// CPU for a 150 K-token vocabulary, then dropping all but one) took
    /// the cores the engines were starting on.
    loading: std::sync::Mutex<()>,
}

impl Tokenizers {
    /// Loads `dir` for `model` (replacing any earlier one).
    pub fn load(&self, model: &str, dir: &Path) -> Result<(), String> {
        // The server's prefix cache: a re-sent conversation (the next turn
        // of a chat) reuses the ids of the part it already encoded.
        let t = ChatTokenizer::load(model, dir).map_err(|e| e.to_string())?;
        // The first render and encode of a process paid its one-off costs
        // (the template's first evaluation, the encoder's first pages and
        // caches): 4-40 ms on the first request of a fresh gateway on the
        // loaded benchmark host, against 2-10 ms for other cold prompts.
        // Paid here, at attach, off the request path; before the prefix
        // cache exists, so it keeps nothing of this text.
        if let Err(e) = t.encode_chat(WARM_UP_TEXT) {
            tracing::debug!(model, error = %e, "tokenizer warm-up failed");
        }
        let t = t.with_prefix_cache(DEFAULT_BUDGET_BYTES, &PrefixCacheMetrics::default());
        if let Ok(mut m) = self.by_model.write() {
            m.insert(model.to_owned(), Arc::new(t));
        }
        Ok(())
    }

    /// Loads `dir` for `model` unless it has a tokenizer already (then
    /// `Ok(false)`); concurrent callers load it once.
    pub fn load_once(&self, model: &str, dir: &Path) -> Result<bool, String> {
        let _one = self
            .loading
            .lock()
            .map_err(|_| "tokenizer loader poisoned")?;
        if self.has(model) {
            return Ok(false);
        }
        self.load(model, dir).map(|()| true)
    }

    /// Whether `model` has a tokenizer.
    pub fn has(&self, model: &str) -> bool {
        self.by_model.read().is_ok_and(|m| m.contains_key(model))
    }

    /// The tokenizer of `model`.
    pub fn get(&self, model: &str) -> Option<Arc<ChatTokenizer>> {
        self.by_model.read().ok()?.get(model).cloned()
    }
}

/// Reads `model`, `stream` and `cache_salt` from a parsed body.
pub fn header_fields(body: &Json) -> Prompt {
    Prompt {
        model: body["model"].as_str().unwrap_or_default().to_owned(),
        stream: body["stream"].as_bool().unwrap_or(false),
        cache_salt: body["cache_salt"].as_str().map(str::to_owned),
        tokens: Vec::new(),
        no_tokens: None,
    }
}

/// The prompt's tokens under `tokenizer`, or why they cannot be known.
pub fn tokens(api: Api, body: &Json, tokenizer: &ChatTokenizer) -> Result<Vec<u32>, &'static str> {
    match api {
        Api::Chat => chat_tokens(body, tokenizer),
        Api::Completions => completion_tokens(body, tokenizer),
    }
}

fn completion_tokens(body: &Json, tokenizer: &ChatTokenizer) -> Result<Vec<u32>, &'static str> {
    match &body["prompt"] {
        Json::String(s) => tokenizer.encode_rendered(s).map_err(|_| "encode_failed"),
        Json::Array(items) if items.iter().all(Json::is_u64) => Ok(items
            .iter()
            .filter_map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
            .collect()),
        Json::Array(items) if items.len() == 1 => match &items[0] {
            Json::String(s) => tokenizer.encode_rendered(s).map_err(|_| "encode_failed"),
            Json::Array(ids) if ids.iter().all(Json::is_u64) => Ok(ids
                .iter()
                .filter_map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect()),
            _ => Err("unsupported_prompt"),
        },
        Json::Array(_) => Err("batched_prompt"),
        _ => Err("unsupported_prompt"),
    }
}

/// A message with list content flattened to text (vLLM's "string" format).
fn flatten_message(m: &Json) -> Result<Json, &'static str> {
    let Some(obj) = m.as_object() else {
        return Err("bad_messages");
    };
    let mut out = obj.clone();
    if let Some(Json::Array(parts)) = obj.get("content") {
        let mut texts = Vec::with_capacity(parts.len());
        for p in parts {
            match (p["type"].as_str(), p["text"].as_str()) {
                (Some("text"), Some(t)) => texts.push(t),
                _ => return Err("non_text_content"),
            }
        }
        out.insert("content".into(), Json::String(texts.join("\n")));
    }
    // vLLM hands templates tool-call arguments as objects, not JSON strings.
    if let Some(Json::Array(calls)) = obj.get("tool_calls") {
        let calls: Vec<Json> = calls
            .iter()
            .map(|c| {
                let mut c = c.clone();
                if let Some(args) = c["function"]["arguments"].as_str() {
                    if let Ok(parsed) = serde_json::from_str::<Json>(args) {
                        c["function"]["arguments"] = parsed;
                    }
                }
                c
            })
            .collect();
        out.insert("tool_calls".into(), Json::Array(calls));
    }
    Ok(Json::Object(out))
}

fn chat_tokens(body: &Json, tokenizer: &ChatTokenizer) -> Result<Vec<u32>, &'static str> {
    if body.get("chat_template").is_some_and(|t| !t.is_null()) {
        return Err("custom_chat_template");
    }
    if body["continue_final_message"].as_bool() == Some(true) {
        return Err("continue_final_message");
    }
    let Some(messages) = body["messages"].as_array() else {
        return Err("bad_messages");
    };
    let messages: Vec<Json> = messages
        .iter()
        .map(flatten_message)
        .collect::<Result<_, _>>()?;
    let mut extra = Vec::new();
    if let Some(tools) = body.get("tools").filter(|t| !t.is_null()) {
        extra.push(("tools".to_owned(), Value::from_serialize(tools)));
    }
    if let Some(kw) = body["chat_template_kwargs"].as_object() {
        for (k, v) in kw {
            extra.push((k.clone(), Value::from_serialize(v)));
        }
    }
    let chat = ChatRender {
        messages: Value::from_serialize(&messages),
        add_generation_prompt: body["add_generation_prompt"].as_bool().unwrap_or(true),
        extra,
    };
    tokenizer
        .encode_messages(&chat)
        .map_err(|_| "template_failed")
}

/// A stable seed from the prompt's first `block_size` tokens (the pick's
/// tie-break: the same new prefix lands on the same idle engine).
pub fn first_block_seed(tokens: &[u32], block_size: u32) -> u64 {
    let n = tokens.len().min(block_size.max(1) as usize);
    let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
    for t in &tokens[..n] {
        h = (h ^ u64::from(*t)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn list_content_is_flattened_and_tool_arguments_parsed() {
        let m = json!({"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(flatten_message(&m).unwrap()["content"], "a\nb");
        let m = json!({"role": "user", "content": [{"type": "image_url", "image_url": {}}]});
        assert_eq!(flatten_message(&m).unwrap_err(), "non_text_content");
        let m = json!({"role": "assistant", "tool_calls": [
            {"function": {"name": "f", "arguments": "{\"x\": 1}"}}]});
        assert_eq!(
            flatten_message(&m).unwrap()["tool_calls"][0]["function"]["arguments"]["x"],
            1
        );
    }

    #[test]
    fn header_fields_read_model_stream_and_salt() {
        let p = header_fields(&json!({"model": "m", "stream": true, "cache_salt": "s"}));
        assert_eq!(
            (p.model.as_str(), p.stream, p.cache_salt.as_deref()),
            ("m", true, Some("s"))
        );
    }
}

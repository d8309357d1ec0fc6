//! A bounded cache of encoded `prompt_text` prefixes (issue 16). Gateways
//! re-send a growing conversation every turn; the rendered chat text of turn
//! N+1 starts with most of the rendered text of turn N. The cache keeps the
//! token ids of texts it has encoded and reuses the ids of the longest shared
//! prefix, cut where a fresh encode of the whole text provably produces the
//! same ids, then encodes only the rest.
//!
//! # Where a cut is safe (see also `docs/decisions.md`)
//!
//! The HF pipeline for one text, `encode(text, add_special_tokens=false)`:
//! 1. added (special) tokens are matched on the raw text (leftmost-longest)
//!    and split off; every other segment is
//! 2. normalized (NFC, or nothing),
//! 3. split by the pre-tokenizer regex (`Split`, `Isolated`), each piece
//!    mapped byte-wise (`ByteLevel`, no prefix space, no regex of its own),
//! 4. encoded by BPE piece by piece: merges never cross a piece.
//!
//! So `encode(a + b) == encode(a) ++ encode(b)` when the boundary between `a`
//! and `b` is a boundary of step 1 and of step 3, and steps 1–3 on `a` do not
//! depend on `b`. A byte position `c` of the text is a *cut* when
//! `text[c]` is an ASCII byte that occurs in no added token, and either
//! - (letter rule) `text[c-1]` is an ASCII letter and `text[c]` is not a
//!   letter, or
//! - (newline rule) `text[c-1]` is `\n` and `text[c]` is not whitespace.
//!
//! Step 1: an added-token occurrence that covers `c-1` and `c` would contain
//! `text[c]`, which no added token does; so every occurrence ends at or
//! before `c` or starts after it, and the leftmost-longest choice before `c`
//! sees only `text[..c]`. Step 2: an ASCII character has canonical combining
//! class 0 and `NFC_Quick_Check=Yes`: nothing before it composes with it or
//! reorders across it, so `NFC(a + b) == NFC(a) + NFC(b)`; `text[c-1]` (a
//! letter or `\n`) stays the last character of `NFC(a)`. Step 3, for the
//! allow-listed GPT-4-style regexes below (alternatives: contractions,
//! `[^\r\n\p{L}\p{N}]?\p{L}+`, digits, `' ?[^\s\p{L}\p{N}]+[\r\n]*'`,
//! `\s*[\r\n]+`, `\s+(?!\S)`, `\s+`; no look-behind, anchors or `\b`): the
//! alternatives tile the text, and the match covering `c-1` ends exactly at
//! `c` — a letter is only consumed by the contraction or the letter
//! alternative, which cannot go on into a non-letter; a `\n` only by
//! `[\r\n]*` / `\s*[\r\n]+`, which stop at a non-whitespace byte (and
//! `\s*[\r\n]+` is tried before `\s+(?!\S)`). No alternative tried at a
//! position before `c` consumes `text[c]`, so it reads at most `text[..=c]`:
//! the pieces before `c` are the same for every text that shares
//! `text[..=c]`. Scanning restarts at `c` exactly as it starts on `text[c..]`
//! alone, since nothing in the regex looks behind. Step 4 is per piece.
//!
//! The argument needs that shape, so the cache is only enabled for a
//! `tokenizer.json` that has it ([`CutRule::for_tokenizer`]): NFC or no
//! normalizer, `Split` with one of [`KNOWN_SPLIT_REGEXES`] then a plain
//! `ByteLevel`, BPE without dropout, added tokens neither normalized nor
//! stripping, no truncation or padding. The property test in
//! `tests/tokenize_hf.rs` compares cached and fresh encodes on random growing
//! texts with the real Qwen3 tokenizer.
//!
//! # Lookup
//!
//! Every cached text registers the xxh3 of its first `k * ANCHOR` bytes, for
//! each k. A new text hashes its own anchors (one streaming pass), takes the
//! longest anchor some entry shares, verifies the bytes (no trust in the
//! hash), extends the shared prefix to its exact length `L`, and cuts at the
//! last cut position `c < L` (both `text[c-1]` and `text[c]` lie in the
//! shared part, so the cut is valid for both texts). The entry's token
//! offsets give how many of its ids lie before `c`.

use crate::tokenize::TokenizeError;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tokenizers::{Decoder, Model, Normalizer, PostProcessor, PreTokenizer, TokenizerImpl};
use xxhash_rust::xxh3::Xxh3;

/// Default `--tokenize-prefix-cache-bytes` per model: ~8 bytes per cached
/// token (text + id + offset), so about 8 M tokens, a few hundred long
/// conversations.
pub const DEFAULT_BUDGET_BYTES: usize = 64 << 20;
/// Anchor spacing in bytes: a text shares an anchor with an entry when they
/// share at least this many leading bytes.
pub const ANCHOR: usize = 1024;
/// How far back from the end of the shared prefix a cut is searched for.
const MAX_BACKOFF: usize = 4096;
/// An entry whose text goes on for at most this many bytes after what a
/// newer entry shares with it is replaced by the newer one (a growing
/// conversation keeps one entry, not one per turn).
const SUBSUME_SLACK: usize = 512;
/// Bookkeeping charged per entry and per anchor on top of text and ids.
const ENTRY_OVERHEAD: usize = 128;
const ANCHOR_OVERHEAD: usize = 48;

/// Pre-tokenizer regexes the cut argument was made for: Qwen2/Qwen3 and
/// Llama 3 (which groups up to three digits).
pub const KNOWN_SPLIT_REGEXES: [&str; 2] = [
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// Which bytes may follow a cut, for one tokenizer.
#[derive(Debug, Clone)]
pub struct CutRule {
    /// ASCII bytes that occur in no added token.
    free: [bool; 128],
}

impl CutRule {
    /// The rule for a `tokenizer.json`, or why its shape is outside the
    /// argument (then the model is encoded without the cache).
    pub fn for_tokenizer(json: &serde_json::Value) -> Result<Self, &'static str> {
        use serde_json::Value;
        let ty = |v: &Value| v.get("type").and_then(Value::as_str).map(str::to_owned);
        let is_false = |v: &Value, k: &str| v.get(k).is_none_or(|x| x == &Value::Bool(false));
        match json.get("normalizer") {
            None | Some(Value::Null) => {}
            Some(n) if ty(n).as_deref() == Some("NFC") => {}
            Some(_) => return Err("normalizer is neither NFC nor absent"),
        }
        let pre = json.get("pre_tokenizer").ok_or("no pre_tokenizer")?;
        let parts = match ty(pre).as_deref() {
            Some("Sequence") => pre
                .get("pretokenizers")
                .and_then(Value::as_array)
                .ok_or("pre_tokenizer sequence without parts")?,
            _ => return Err("pre_tokenizer is not a Sequence"),
        };
        let [split, bytes] = parts.as_slice() else {
            return Err("pre_tokenizer is not Split + ByteLevel");
        };
        let regex = split
            .get("pattern")
            .and_then(|p| p.get("Regex"))
            .and_then(Value::as_str);
        if ty(split).as_deref() != Some("Split")
            || !regex.is_some_and(|r| KNOWN_SPLIT_REGEXES.contains(&r))
            || split.get("behavior").and_then(Value::as_str) != Some("Isolated")
            || !is_false(split, "invert")
        {
            return Err("pre_tokenizer split is not a known regex, isolated");
        }
        if ty(bytes).as_deref() != Some("ByteLevel")
            || !is_false(bytes, "add_prefix_space")
            || !is_false(bytes, "use_regex")
        {
            return Err("pre_tokenizer byte level adds a prefix space or splits again");
        }
        let model = json.get("model").ok_or("no model")?;
        if ty(model).as_deref() != Some("BPE") || !model.get("dropout").is_none_or(Value::is_null) {
            return Err("model is not BPE without dropout");
        }
        for key in ["truncation", "padding"] {
            if !json.get(key).is_none_or(Value::is_null) {
                return Err("truncation or padding is configured");
            }
        }
        match json.get("post_processor") {
            None | Some(Value::Null) => {}
            Some(p) if ty(p).as_deref() == Some("ByteLevel") => {}
            Some(_) => return Err("post_processor is neither ByteLevel nor absent"),
        }
        let mut free = [true; 128];
        for t in json
            .get("added_tokens")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice)
        {
            if !["normalized", "lstrip", "rstrip", "single_word"]
                .iter()
                .all(|k| is_false(t, k))
            {
                return Err("an added token is normalized, strips or is single_word");
            }
            let content = t
                .get("content")
                .and_then(Value::as_str)
                .ok_or("added token without content")?;
            for b in content.bytes().filter(u8::is_ascii) {
                free[usize::from(b)] = false;
            }
        }
        Ok(Self { free })
    }

    /// True when `text[..c]` and `text[c..]` encode independently (see the
    /// module docs).
    pub fn is_cut(&self, text: &[u8], c: usize) -> bool {
        if c == 0 || c >= text.len() {
            return false;
        }
        let (before, at) = (text[c - 1], text[c]);
        if !at.is_ascii() || !self.free[usize::from(at)] {
            return false;
        }
        (before.is_ascii_alphabetic() && !at.is_ascii_alphabetic())
            || (before == b'\n' && !at.is_ascii_whitespace())
    }

    /// The last cut `c` with `lo <= c < hi` (searched at most
    /// [`MAX_BACKOFF`] bytes back).
    pub fn last_cut_before(&self, text: &[u8], hi: usize) -> Option<usize> {
        let hi = hi.min(text.len());
        let lo = hi.saturating_sub(MAX_BACKOFF).max(1);
        (lo..hi).rev().find(|&c| self.is_cut(text, c))
    }
}

/// Labels of the cache lookups.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrefixLookupLabels {
    /// The model id.
    pub model: String,
    /// `hit` (some token ids reused) or `miss`.
    pub result: String,
}

/// A model label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PrefixModelLabel {
    /// The model id.
    pub model: String,
}

/// Metrics of the prefix caches, registered by [`crate::metrics::Metrics`].
#[derive(Debug, Clone, Default)]
pub struct PrefixCacheMetrics {
    /// Encodes that looked in the cache, by model and result.
    pub lookups: Family<PrefixLookupLabels, Counter>,
    /// Token ids taken from the cache instead of encoded.
    pub reused_tokens: Family<PrefixModelLabel, Counter>,
    /// Bytes the cache holds (text, ids, offsets, bookkeeping).
    pub bytes: Family<PrefixModelLabel, Gauge>,
    /// Entries dropped to stay within the budget.
    pub evictions: Family<PrefixModelLabel, Counter>,
}

impl PrefixCacheMetrics {
    /// Registers every series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "inferencecache_tokenize_prefix_cache_lookups",
            "prompt_text encodes that looked up the prefix cache, by model and result (hit: some token ids reused|miss)",
            self.lookups.clone(),
        );
        registry.register(
            "inferencecache_tokenize_prefix_cache_reused_tokens",
            "prompt_text token ids taken from the prefix cache instead of encoded, by model",
            self.reused_tokens.clone(),
        );
        registry.register(
            "inferencecache_tokenize_prefix_cache_bytes",
            "Bytes held by the prompt_text prefix cache, by model (bounded by --tokenize-prefix-cache-bytes)",
            self.bytes.clone(),
        );
        registry.register(
            "inferencecache_tokenize_prefix_cache_evictions",
            "prompt_text prefix cache entries evicted to stay within the budget, by model",
            self.evictions.clone(),
        );
    }
}

/// One model's series, resolved once.
#[derive(Debug, Clone)]
struct Series {
    hits: Counter,
    misses: Counter,
    reused: Counter,
    bytes: Gauge,
    evictions: Counter,
}

impl Series {
    fn new(metrics: &PrefixCacheMetrics, model: &str) -> Self {
        let lookups = |result: &str| {
            metrics
                .lookups
                .get_or_create(&PrefixLookupLabels {
                    model: model.to_owned(),
                    result: result.to_owned(),
                })
                .clone()
        };
        let label = PrefixModelLabel {
            model: model.to_owned(),
        };
        Self {
            hits: lookups("hit"),
            misses: lookups("miss"),
            reused: metrics.reused_tokens.get_or_create(&label).clone(),
            bytes: metrics.bytes.get_or_create(&label).clone(),
            evictions: metrics.evictions.get_or_create(&label).clone(),
        }
    }
}

/// A text encoded before: its ids and the byte offset in `text` where each
/// token starts (non-decreasing).
#[derive(Debug)]
struct Entry {
    id: u64,
    text: Box<str>,
    ids: Box<[u32]>,
    starts: Box<[u32]>,
    anchors: Box<[u64]>,
}

impl Entry {
    fn cost(&self) -> usize {
        ENTRY_OVERHEAD
            + self.text.len()
            + 4 * (self.ids.len() + self.starts.len())
            + (8 + ANCHOR_OVERHEAD) * self.anchors.len()
    }
}

#[derive(Debug, Default)]
struct Inner {
    next_id: u64,
    tick: u64,
    /// Anchor hash → the entry that registered it last.
    by_anchor: HashMap<u64, u64>,
    /// Entry id → (entry, last use).
    entries: HashMap<u64, (Arc<Entry>, u64)>,
    /// Last use → entry id (least recently used first).
    lru: BTreeMap<u64, u64>,
    bytes: usize,
}

impl Inner {
    fn touch(&mut self, id: u64) {
        self.tick += 1;
        let tick = self.tick;
        if let Some((_, used)) = self.entries.get_mut(&id) {
            self.lru.remove(used);
            *used = tick;
            self.lru.insert(tick, id);
        }
    }

    fn remove(&mut self, id: u64) -> Option<Arc<Entry>> {
        let (entry, used) = self.entries.remove(&id)?;
        self.lru.remove(&used);
        for a in entry.anchors.iter() {
            if self.by_anchor.get(a) == Some(&id) {
                self.by_anchor.remove(a);
            }
        }
        self.bytes -= entry.cost();
        Some(entry)
    }
}

/// Ids reused from the cache for a prefix of a text.
#[derive(Debug)]
pub struct Reuse {
    /// The text's bytes before `cut` encode to `entry.ids[..tokens]`.
    pub cut: usize,
    entry: Arc<Entry>,
    tokens: usize,
    /// How many bytes the text shares with the entry.
    shared: usize,
}

impl Reuse {
    /// The reused ids.
    pub fn ids(&self) -> &[u32] {
        &self.entry.ids[..self.tokens]
    }

    /// The reused token start offsets.
    pub fn starts(&self) -> &[u32] {
        &self.entry.starts[..self.tokens]
    }
}

/// The anchor hashes of a text: xxh3 of its first `k * ANCHOR` bytes.
pub fn anchors(text: &[u8]) -> Vec<u64> {
    let mut h = Xxh3::new();
    text.chunks_exact(ANCHOR)
        .map(|chunk| {
            h.update(chunk);
            h.digest()
        })
        .collect()
}

fn shared_len(a: &[u8], b: &[u8]) -> usize {
    // Compare in blocks first: memcmp is far faster than a byte loop.
    const BLOCK: usize = 256;
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + BLOCK <= n && a[i..i + BLOCK] == b[i..i + BLOCK] {
        i += BLOCK;
    }
    i + a[i..n]
        .iter()
        .zip(&b[i..n])
        .take_while(|(x, y)| x == y)
        .count()
}

/// One model's prefix cache, bounded to `budget` bytes; cheap to share.
#[derive(Debug)]
pub struct PrefixCache {
    rule: CutRule,
    budget: usize,
    inner: Mutex<Inner>,
    series: Series,
}

impl PrefixCache {
    /// A cache of `budget` bytes for `model`, counted in `metrics`.
    pub fn new(rule: CutRule, budget: usize, model: &str, metrics: &PrefixCacheMetrics) -> Self {
        Self {
            rule,
            budget,
            inner: Mutex::default(),
            series: Series::new(metrics, model),
        }
    }

    /// The cut rule.
    pub fn rule(&self) -> &CutRule {
        &self.rule
    }

    /// The longest reusable prefix of `text` (whose anchors are `anchors`),
    /// counted as a hit or a miss.
    pub fn lookup(&self, text: &str, anchors: &[u64]) -> Option<Reuse> {
        let r = self.find(text, anchors);
        match &r {
            Some(r) => {
                self.series.hits.inc();
                self.series.reused.inc_by(r.tokens as u64);
            }
            None => {
                self.series.misses.inc();
            }
        }
        r
    }

    fn find(&self, text: &str, anchors: &[u64]) -> Option<Reuse> {
        let entry = {
            let mut inner = self.inner.lock().ok()?;
            let id = anchors
                .iter()
                .rev()
                .find_map(|a| inner.by_anchor.get(a).copied())?;
            inner.touch(id);
            Arc::clone(&inner.entries.get(&id)?.0)
        };
        // Verify outside the lock: the hash only nominates a candidate.
        let shared = shared_len(entry.text.as_bytes(), text.as_bytes());
        let cut = self.rule.last_cut_before(text.as_bytes(), shared)?;
        let cut32 = u32::try_from(cut).ok()?;
        let tokens = entry.starts.partition_point(|&s| s < cut32);
        (tokens > 0).then_some(Reuse {
            cut,
            entry,
            tokens,
            shared,
        })
    }

    /// Keeps `text` encoded as `ids` (token `i` starting at byte
    /// `starts[i]`); evicts least recently used entries past the budget. An
    /// entry `reused` here that the new text covers up to its last
    /// [`SUBSUME_SLACK`] bytes is dropped.
    pub fn insert(
        &self,
        text: &str,
        anchors: Vec<u64>,
        ids: Vec<u32>,
        starts: Vec<u32>,
        reused: Option<&Reuse>,
    ) {
        let mut entry = Entry {
            id: 0,
            text: text.into(),
            ids: ids.into_boxed_slice(),
            starts: starts.into_boxed_slice(),
            anchors: anchors.into_boxed_slice(),
        };
        let cost = entry.cost();
        if cost > self.budget || entry.anchors.is_empty() {
            return;
        }
        let mut dropped = Vec::new();
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if let Some(r) = reused
            && r.entry.text.len() <= r.shared + SUBSUME_SLACK
            && let Some(e) = inner.remove(r.entry.id)
        {
            dropped.push(e);
        }
        inner.next_id += 1;
        entry.id = inner.next_id;
        let id = entry.id;
        for a in entry.anchors.iter() {
            inner.by_anchor.insert(*a, id);
        }
        inner.bytes += cost;
        inner.tick += 1;
        let tick = inner.tick;
        inner.entries.insert(id, (Arc::new(entry), tick));
        inner.lru.insert(tick, id);
        while inner.bytes > self.budget {
            let Some((_, &oldest)) = inner.lru.iter().next() else {
                break;
            };
            if let Some(e) = inner.remove(oldest) {
                self.series.evictions.inc();
                dropped.push(e);
            }
        }
        self.series
            .bytes
            .set(i64::try_from(inner.bytes).unwrap_or(i64::MAX));
        drop(inner);
        drop(dropped); // freed outside the lock
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.bytes)
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.entries.len())
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn encode_error(e: tokenizers::Error) -> TokenizeError {
    TokenizeError::Encode(e.to_string())
}

/// Ids of `text` without the cache: `encode_fast` (no offsets) computes the
/// same ids as `encode` with less work.
pub fn encode_fresh<M, N, PT, PP, D>(
    t: &TokenizerImpl<M, N, PT, PP, D>,
    text: &str,
) -> Result<Vec<u32>, TokenizeError>
where
    M: Model,
    N: Normalizer,
    PT: PreTokenizer,
    PP: PostProcessor,
    D: Decoder,
{
    t.encode_fast(text, false)
        .map(|e| e.get_ids().to_vec())
        .map_err(encode_error)
}

/// Ids and token start offsets of `text` by HF `encode`.
pub fn encode_with_starts<M, N, PT, PP, D>(
    t: &TokenizerImpl<M, N, PT, PP, D>,
    text: &str,
) -> Result<(Vec<u32>, Vec<u32>), TokenizeError>
where
    M: Model,
    N: Normalizer,
    PT: PreTokenizer,
    PP: PostProcessor,
    D: Decoder,
{
    let encoding = t.encode(text, false).map_err(encode_error)?;
    let starts = encoding
        .get_offsets()
        .iter()
        .map(|&(s, _)| u32::try_from(s).unwrap_or(u32::MAX))
        .collect();
    Ok((encoding.get_ids().to_vec(), starts))
}

/// Ids of `text` through `cache`: the ids of its longest cached prefix up to
/// a cut, then `encode_rest` (ids and token start offsets) of the rest; the
/// result is cached in turn. Texts shorter than one anchor bypass the cache.
pub fn encode(
    cache: &PrefixCache,
    text: &str,
    encode_rest: impl FnOnce(&str) -> Result<(Vec<u32>, Vec<u32>), TokenizeError>,
) -> Result<Vec<u32>, TokenizeError> {
    if text.len() < ANCHOR {
        return encode_rest(text).map(|(ids, _)| ids);
    }
    let anchors = anchors(text.as_bytes());
    let reuse = cache.lookup(text, &anchors);
    let cut = reuse.as_ref().map_or(0, |r| r.cut);
    // `text[cut]` is ASCII, so `cut` is a char boundary.
    let rest = text.get(cut..).unwrap_or_default();
    let (rest_ids, rest_starts) = encode_rest(rest)?;
    let cut32 = u32::try_from(cut).map_err(|_| TokenizeError::Encode("text too long".into()))?;
    let reused = reuse.as_ref().map_or(0, |r| r.ids().len());
    let mut ids = Vec::with_capacity(reused + rest_ids.len());
    let mut starts = Vec::with_capacity(reused + rest_ids.len());
    if let Some(r) = &reuse {
        ids.extend_from_slice(r.ids());
        starts.extend_from_slice(r.starts());
    }
    ids.extend_from_slice(&rest_ids);
    starts.extend(rest_starts.iter().map(|&s| cut32.saturating_add(s)));
    let out = ids.clone();
    cache.insert(text, anchors, ids, starts, reuse.as_ref());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen_like() -> serde_json::Value {
        serde_json::json!({
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": KNOWN_SPLIT_REGEXES[0]},
                 "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
                 "use_regex": false}]},
            "post_processor": {"type": "ByteLevel"},
            "model": {"type": "BPE", "dropout": null},
            "added_tokens": [{"content": "<|im_start|>", "normalized": false,
                "lstrip": false, "rstrip": false, "single_word": false, "special": true}],
            "truncation": null, "padding": null,
        })
    }

    fn rule() -> CutRule {
        CutRule::for_tokenizer(&qwen_like()).unwrap()
    }

    #[test]
    fn only_the_argued_tokenizer_shape_gets_a_cut_rule() {
        assert!(CutRule::for_tokenizer(&qwen_like()).is_ok());
        let changed = |path: &[&str], v: serde_json::Value| {
            let mut j = qwen_like();
            let mut at = &mut j;
            for p in path {
                at = if let Ok(i) = p.parse::<usize>() {
                    &mut at[i]
                } else {
                    &mut at[*p]
                };
            }
            *at = v;
            CutRule::for_tokenizer(&j)
        };
        use serde_json::json;
        assert!(changed(&["normalizer"], json!({"type": "NFKC"})).is_err());
        assert!(changed(&["normalizer"], json!(null)).is_ok());
        assert!(
            changed(
                &["pre_tokenizer", "pretokenizers", "0", "pattern", "Regex"],
                json!(r"\w+|\s+")
            )
            .is_err()
        );
        assert!(
            changed(
                &["pre_tokenizer", "pretokenizers", "1", "add_prefix_space"],
                json!(true)
            )
            .is_err()
        );
        assert!(changed(&["added_tokens", "0", "lstrip"], json!(true)).is_err());
        assert!(changed(&["added_tokens", "0", "normalized"], json!(true)).is_err());
        assert!(changed(&["model", "dropout"], json!(0.1)).is_err());
        assert!(changed(&["truncation"], json!({"max_length": 8})).is_err());
    }

    #[test]
    fn cuts_follow_a_letter_or_a_newline_never_inside_an_added_token() {
        let r = rule();
        let cuts = |s: &str| -> Vec<usize> {
            (0..=s.len())
                .filter(|&c| r.is_cut(s.as_bytes(), c))
                .collect()
        };
        // "ab cd.\nef" : after "ab" (space), after "cd" (.), after "\n" (e).
        assert_eq!(cuts("ab cd.\nef"), vec![2, 5, 7]);
        // '<', '|', '_' occur in an added token: never a cut before them.
        assert_eq!(cuts("x<|im_start|>y"), Vec::<usize>::new());
        // Not before whitespace after a newline, not before non-ASCII.
        assert_eq!(cuts("a\n\n é"), vec![1]);
        assert_eq!(cuts("日本\n語"), Vec::<usize>::new());
        assert_eq!(r.last_cut_before(b"ab cd ef", 5), Some(2));
    }

    fn text(n: usize, salt: u8) -> String {
        (0..n)
            .map(|i| {
                if i % 7 == 6 {
                    ' '
                } else {
                    char::from(b'a' + (i as u8 ^ salt) % 26)
                }
            })
            .collect()
    }

    /// A stand-in encode: one token per byte, id = byte.
    fn insert(cache: &PrefixCache, t: &str, reused: Option<&Reuse>) {
        let ids = t.bytes().map(u32::from).collect();
        let starts = (0..t.len() as u32).collect();
        cache.insert(t, anchors(t.as_bytes()), ids, starts, reused);
    }

    #[test]
    fn lookups_reuse_up_to_a_cut_inside_the_shared_prefix_and_count() {
        let m = PrefixCacheMetrics::default();
        let cache = PrefixCache::new(rule(), 1 << 20, "m", &m);
        let old = text(3000, 0);
        assert!(cache.lookup(&old, &anchors(old.as_bytes())).is_none());
        insert(&cache, &old, None);
        let new = format!("{}XYZ more", &old[..2500]);
        let r = cache.lookup(&new, &anchors(new.as_bytes())).expect("hit");
        assert!(r.cut < 2500 && r.cut > 2500 - 8, "cut {}", r.cut);
        assert!(rule().is_cut(new.as_bytes(), r.cut));
        assert_eq!(r.ids().len(), r.cut);
        assert_eq!(
            r.ids()[..10],
            old.as_bytes()[..10]
                .iter()
                .map(|&b| u32::from(b))
                .collect::<Vec<_>>()[..]
        );
        let hits = m
            .lookups
            .get_or_create(&PrefixLookupLabels {
                model: "m".into(),
                result: "hit".into(),
            })
            .get();
        let misses = m
            .lookups
            .get_or_create(&PrefixLookupLabels {
                model: "m".into(),
                result: "miss".into(),
            })
            .get();
        assert_eq!((hits, misses), (1, 1));
        let label = PrefixModelLabel { model: "m".into() };
        assert_eq!(m.reused_tokens.get_or_create(&label).get(), r.cut as u64);
        // Shorter than one anchor shared: a miss.
        let other = text(3000, 5);
        assert!(cache.lookup(&other, &anchors(other.as_bytes())).is_none());
        // The grown text replaces the entry it grew from.
        insert(&cache, &new, Some(&r));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn the_budget_bounds_the_bytes_and_evicts_least_recently_used() {
        let m = PrefixCacheMetrics::default();
        let one = {
            let t = text(4096, 0);
            Entry {
                id: 0,
                ids: vec![0; t.len()].into(),
                starts: vec![0; t.len()].into(),
                anchors: anchors(t.as_bytes()).into(),
                text: t.into(),
            }
            .cost()
        };
        let cache = PrefixCache::new(rule(), one * 3, "m", &m);
        let texts: Vec<String> = (0..5).map(|i| text(4096, i)).collect();
        for t in &texts[..3] {
            insert(&cache, t, None);
        }
        assert_eq!(cache.len(), 3);
        // Use the first so that the second is the least recently used.
        assert!(
            cache
                .lookup(&texts[0], &anchors(texts[0].as_bytes()))
                .is_some()
        );
        insert(&cache, &texts[3], None);
        insert(&cache, &texts[4], None);
        assert_eq!(cache.len(), 3);
        assert!(cache.bytes() <= one * 3);
        let label = PrefixModelLabel { model: "m".into() };
        assert_eq!(m.evictions.get_or_create(&label).get(), 2);
        assert_eq!(m.bytes.get_or_create(&label).get(), cache.bytes() as i64);
        let kept = |t: &String| cache.lookup(t, &anchors(t.as_bytes())).is_some();
        assert!(kept(&texts[0]) && !kept(&texts[1]) && !kept(&texts[2]));
        assert!(kept(&texts[3]) && kept(&texts[4]));
        // An entry larger than the whole budget is never kept.
        insert(&cache, &text(4 * 4096, 9), None);
        assert!(cache.bytes() <= one * 3);
    }
}

//! `prompt_text` for models that ship a tiktoken BPE file instead of a
//! `tokenizer.json` (the reference's loader accepts them too).
//!
//! The file is read from the model directory at startup, never fetched:
//! `tiktoken.model` or the first `*.tiktoken` file (by name), each line
//! `<base64 token bytes> <rank>`. Special tokens come from
//! `tokenizer_config.json`'s `added_tokens_decoder` (`{"<id>": {"content":
//! ...}}`), so the chat template's markers (`<|im_start|>`, `[BOS]`, ...)
//! encode to their ids. The pre-tokenization split is the cl100k_base
//! pattern, as in the reference's loader; the BPE core is the `tiktoken-rs`
//! crate's, constructed from the loaded ranks (its bundled OpenAI encodings
//! are not used).

use base64::Engine as _;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use tiktoken_rs::{CoreBPE, Rank};

/// The cl100k_base pre-tokenization pattern (tiktoken's own).
pub(crate) const CL100K_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Most bytes of a tiktoken file (o200k_base is 3.6 MB).
pub(crate) const MAX_TIKTOKEN_FILE_BYTES: u64 = 64 << 20;

/// A loaded tiktoken encoder.
pub(crate) struct TiktokenEncoder {
    bpe: CoreBPE,
    specials: Vec<String>,
}

/// The model directory's tiktoken file, if any: `tiktoken.model`, else the
/// first `*.tiktoken` by name.
pub(crate) fn find_tiktoken_file(dir: &Path) -> Option<PathBuf> {
    let model = dir.join("tiktoken.model");
    if model.is_file() {
        return Some(model);
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "tiktoken") && p.is_file())
        .collect();
    found.sort();
    found.into_iter().next()
}

/// Parses `<base64> <rank>` lines; duplicate tokens or ranks are refused
/// (the BPE core needs a bijection).
pub(crate) fn parse_ranks(text: &str) -> Result<rustc_hash::FxHashMap<Vec<u8>, Rank>, String> {
    let mut ranks = rustc_hash::FxHashMap::default();
    let mut seen = HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |what: &str| format!("line {}: {what}", i + 1);
        let (token, rank) = line
            .split_once(' ')
            .ok_or_else(|| bad("want '<base64> <rank>'"))?;
        let token = base64::engine::general_purpose::STANDARD
            .decode(token)
            .map_err(|e| bad(&format!("token: {e}")))?;
        let rank: Rank = rank
            .trim()
            .parse()
            .map_err(|e| bad(&format!("rank: {e}")))?;
        if !seen.insert(rank) || ranks.insert(token, rank).is_some() {
            return Err(bad("duplicate token or rank"));
        }
    }
    if ranks.is_empty() {
        return Err("no ranks".into());
    }
    Ok(ranks)
}

/// `added_tokens_decoder` of a `tokenizer_config.json`: content → id.
fn added_tokens(config: &serde_json::Value) -> rustc_hash::FxHashMap<String, Rank> {
    config
        .get("added_tokens_decoder")
        .and_then(|v| v.as_object())
        .map(|o| {
            o.iter()
                .filter_map(|(id, t)| {
                    Some((t.get("content")?.as_str()?.to_owned(), id.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

impl TiktokenEncoder {
    /// Loads `file` with the special tokens of `config` (the model's
    /// `tokenizer_config.json`, or `Null`).
    pub(crate) fn load(file: &Path, config: &serde_json::Value) -> Result<Self, String> {
        let len = std::fs::metadata(file).map_err(|e| e.to_string())?.len();
        if len > MAX_TIKTOKEN_FILE_BYTES {
            return Err(format!(
                "{len} bytes; the limit is {MAX_TIKTOKEN_FILE_BYTES}"
            ));
        }
        let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
        let ranks = parse_ranks(&text)?;
        let specials = added_tokens(config);
        if let Some((s, _)) = specials
            .iter()
            .find(|(_, id)| ranks.values().any(|r| r == *id))
        {
            return Err(format!("special token {s:?} reuses a BPE rank"));
        }
        let names = specials.keys().cloned().collect();
        let bpe = CoreBPE::new(ranks, specials, CL100K_PATTERN).map_err(|e| e.to_string())?;
        Ok(Self {
            bpe,
            specials: names,
        })
    }

    /// Token ids of `text`; special-token markers encode to their ids (as HF
    /// `encode(.., add_special_tokens=false)` does for added tokens).
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>, String> {
        let allowed: HashSet<&str> = self.specials.iter().map(String::as_str).collect();
        self.bpe
            .encode(text, &allowed)
            .map(|(ids, _)| ids)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A byte-level vocabulary (every byte is a token) plus a few merges.
    fn small_ranks() -> String {
        let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
        let mut lines: Vec<String> = (0u8..=255).map(|b| format!("{} {b}", b64(&[b]))).collect();
        for (i, m) in [
            "he", "ll", "llo", "hello", " w", "or", " wor", "ld", " world",
        ]
        .iter()
        .enumerate()
        {
            lines.push(format!("{} {}", b64(m.as_bytes()), 256 + i));
        }
        lines.join("\n")
    }

    #[test]
    fn merges_and_specials_encode() {
        let dir = std::env::temp_dir().join(format!("ic-tt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("small.tiktoken");
        std::fs::write(&f, small_ranks()).unwrap();
        assert_eq!(find_tiktoken_file(&dir), Some(f.clone()));
        let cfg =
            serde_json::json!({"added_tokens_decoder": {"1000": {"content": "<|im_start|>"}}});
        let enc = TiktokenEncoder::load(&f, &cfg).unwrap();
        // "hello" → 259, " world" → 264.
        assert_eq!(enc.encode("hello world").unwrap(), [259, 264]);
        assert_eq!(enc.encode("<|im_start|>hello").unwrap(), [1000, 259]);
    }

    #[test]
    fn malformed_files_are_refused() {
        assert!(parse_ranks("").is_err());
        assert!(
            parse_ranks("aGk= 1\naGk= 2")
                .unwrap_err()
                .contains("duplicate")
        );
        assert!(
            parse_ranks("aGk= 1\naA== 1")
                .unwrap_err()
                .contains("duplicate")
        );
        assert!(parse_ranks("!!! 1").unwrap_err().contains("line 1"));
        assert!(parse_ranks("aGk=").unwrap_err().contains("line 1"));
    }
}

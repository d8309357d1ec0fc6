//! The GPT-4-style pre-tokenizer split without `fancy-regex` (issue 16).
//!
//! Profiling `prompt_text` showed the `Split` regex as the largest cost of an
//! HF encode: its `\s+(?!\S)` look-ahead makes `fancy-regex` run the whole
//! pattern on its backtracking VM. Without that one alternative the pattern
//! is regular, and the `regex` crate (the same Unicode tables `fancy-regex`
//! delegates to) matches it with a DFA. The look-ahead is put back by hand:
//! at a position where the original's first five alternatives fail, both
//! patterns are at a whitespace run without a line break, `[p, w)`; the
//! original's `\s+(?!\S)` then takes `[p, w-1 char)` when the run has at least
//! two characters and is followed by a non-space, and otherwise falls through
//! to `\s+` = `[p, w)` like ours. A match of ours that is all whitespace with
//! no `\r`/`\n` came from `\s+` (every other alternative needs a letter, a
//! digit, an apostrophe, a symbol or a line break), so that is the one case
//! to shorten. The regex has no look-behind, so resuming at the shortened end
//! scans exactly as the original does.
//!
//! Used only for a `pre_tokenizer` of exactly the shape the prefix-cache
//! argument allow-lists (`Split` with one of
//! [`crate::tokenize_prefix::KNOWN_SPLIT_REGEXES`], `Isolated`, then a
//! `ByteLevel` without its own regex); every other tokenizer loads as plain
//! HF. `tests/tokenize_hf.rs` compares it with the HF tokenizer on random
//! texts.

use crate::tokenize_prefix::KNOWN_SPLIT_REGEXES;
use serde::{Deserialize, Deserializer};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::tokenizer::pattern::Pattern;
use tokenizers::{
    DecoderWrapper, ModelWrapper, NormalizerWrapper, Offsets, PostProcessorWrapper,
    PreTokenizedString, PreTokenizer, SplitDelimiterBehavior, TokenizerImpl,
};

/// An HF tokenizer whose pre-tokenizer is [`FastSplit`].
pub type FastTokenizer =
    TokenizerImpl<ModelWrapper, NormalizerWrapper, FastSplit, PostProcessorWrapper, DecoderWrapper>;

/// The look-ahead alternative the `regex` crate cannot run.
const LOOKAHEAD: &str = r"\s+(?!\S)|";

/// `Sequence[Split(GPT-4-style regex, Isolated), ByteLevel]` on a DFA.
#[derive(Debug, Clone)]
pub struct FastSplit {
    regex: regex::Regex,
    bytes: ByteLevel,
}

impl FastSplit {
    /// From a `pre_tokenizer` of `tokenizer.json`, or why not.
    pub fn from_json(pre: &serde_json::Value) -> Result<Self, String> {
        use serde_json::Value;
        let str_at = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let parts = match str_at(pre, "type").as_deref() {
            Some("Sequence") => pre
                .get("pretokenizers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
            _ => return Err("pre_tokenizer is not a Sequence".into()),
        };
        let [split, bytes] = parts.as_slice() else {
            return Err("pre_tokenizer is not Split + ByteLevel".into());
        };
        let pattern = split
            .get("pattern")
            .and_then(|p| str_at(p, "Regex"))
            .filter(|r| KNOWN_SPLIT_REGEXES.contains(&r.as_str()))
            .ok_or("pre_tokenizer split is not a known regex")?;
        if str_at(split, "type").as_deref() != Some("Split")
            || str_at(split, "behavior").as_deref() != Some("Isolated")
            || split
                .get("invert")
                .is_some_and(|v| v != &Value::Bool(false))
        {
            return Err("pre_tokenizer split is not isolated".into());
        }
        let bytes: ByteLevel =
            serde_json::from_value(bytes.clone()).map_err(|e| format!("byte level: {e}"))?;
        if bytes.use_regex || bytes.add_prefix_space {
            return Err("byte level splits again or adds a prefix space".into());
        }
        let regular = pattern.replacen(LOOKAHEAD, "", 1);
        if regular == pattern {
            return Err("known regex without the look-ahead alternative".into());
        }
        let regex = regex::Regex::new(&regular).map_err(|e| e.to_string())?;
        Ok(Self { regex, bytes })
    }
}

impl<'de> Deserialize<'de> for FastSplit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        Self::from_json(&v).map_err(serde::de::Error::custom)
    }
}

/// The split positions, in the shape `Pattern` wants (every byte covered,
/// matches flagged).
impl Pattern for &FastSplit {
    fn find_matches(&self, inside: &str) -> tokenizers::Result<Vec<(Offsets, bool)>> {
        if inside.is_empty() {
            return Ok(vec![((0, 0), false)]);
        }
        let mut out = Vec::with_capacity(inside.len() / 3);
        let mut at = 0;
        while at < inside.len() {
            let Some(m) = self.regex.find_at(inside, at) else {
                out.push(((at, inside.len()), false));
                break;
            };
            if m.start() > at {
                out.push(((at, m.start()), false));
            }
            let s = m.as_str();
            let mut end = m.end();
            if end < inside.len()
                && s.chars().all(char::is_whitespace)
                && !s.contains(['\r', '\n'])
                && let Some((last, _)) = s.char_indices().last()
                && last > 0
            {
                end = m.start() + last;
            }
            out.push(((m.start(), end), true));
            at = end;
        }
        Ok(out)
    }
}

impl PreTokenizer for FastSplit {
    fn pre_tokenize(&self, pretokenized: &mut PreTokenizedString) -> tokenizers::Result<()> {
        pretokenized
            .split(|_, normalized| normalized.split(self, SplitDelimiterBehavior::Isolated))?;
        self.bytes.pre_tokenize(pretokenized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<&str> {
        let pre = serde_json::json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": KNOWN_SPLIT_REGEXES[0]},
             "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false,
             "use_regex": false}]});
        let f = FastSplit::from_json(&pre).unwrap();
        (&f).find_matches(text)
            .unwrap()
            .into_iter()
            .map(|((a, b), _)| &text[a..b])
            .collect()
    }

    #[test]
    fn the_lookahead_leaves_one_space_for_the_next_piece() {
        assert_eq!(split("a   b"), vec!["a", "  ", " b"]);
        assert_eq!(split("a b"), vec!["a", " b"]);
        assert_eq!(split("a  "), vec!["a", "  "]);
        assert_eq!(split("x \n  y"), vec!["x", " \n", " ", " y"]);
        assert_eq!(split("1  !!"), vec!["1", " ", " !!"]);
        assert_eq!(split("we'll  3"), vec!["we", "'ll", " ", " ", "3"]);
    }
}

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
//! [`crate::tokenize::prefix::KNOWN_SPLIT_REGEXES`], `Isolated`, then a
//! `ByteLevel` without its own regex); every other tokenizer loads as plain
//! HF. `tests/tokenize_hf.rs` compares it with the HF tokenizer on random
//! texts.

use crate::tokenize::bpe::ByteBpe;
use crate::tokenize::prefix::KNOWN_SPLIT_REGEXES;
use serde::{Deserialize, Deserializer};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::tokenizer::pattern::Pattern;
use tokenizers::{
    DecoderWrapper, Model, ModelWrapper, Normalizer, NormalizerWrapper, Offsets,
    PostProcessorWrapper, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior, TokenizerImpl,
};

/// An HF tokenizer whose pre-tokenizer is [`FastSplit`].
pub(crate) type FastTokenizer =
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

impl FastSplit {
    /// Calls `f` with each piece `[start, end)` of `text`, in order, until it
    /// returns `None`. The pieces tile `text` (the regex matches every
    /// character), except that a stretch it did not match is passed too.
    fn pieces(&self, text: &str, mut f: impl FnMut(usize, usize) -> Option<()>) -> Option<()> {
        let mut at = 0;
        while at < text.len() {
            let Some(m) = self.regex.find_at(text, at) else {
                return f(at, text.len());
            };
            if m.start() > at {
                f(at, m.start())?;
            }
            let s = m.as_str();
            let mut end = m.end();
            // `\s+(?!\S)`: a space run before a non-space leaves its last
            // character to the next piece (see the module docs).
            if end < text.len()
                && s.chars().all(char::is_whitespace)
                && !s.contains(['\r', '\n'])
                && let Some((last, _)) = s.char_indices().last()
                && last > 0
            {
                end = m.start() + last;
            }
            f(m.start(), end)?;
            at = end;
        }
        Some(())
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
        self.pieces(inside, |a, b| {
            out.push(((a, b), true));
            Some(())
        });
        Ok(out)
    }
}

/// GPT-2's byte-to-character table of the `ByteLevel` pre-tokenizer: the
/// printable Latin-1 bytes stand for themselves, the others (in byte order)
/// for U+0100 onwards.
pub(crate) fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        table[usize::from(b)] = if printable(b) {
            char::from(b)
        } else {
            next += 1;
            char::from_u32(next - 1).unwrap_or('\0')
        };
    }
    table
}

/// The encode of a [`FastTokenizer`] without HF's offset-tracking strings:
/// added tokens split off (leftmost-longest, as HF), each other segment
/// checked to be NFC already (else the caller falls back to HF), split,
/// byte-mapped and handed to the BPE model piece by piece, exactly the calls
/// HF makes, minus the alignment bookkeeping.
#[derive(Debug)]
pub(crate) struct FastEncoder {
    added: aho_corasick::AhoCorasick,
    added_ids: Vec<u32>,
    byte_chars: [char; 256],
    /// The merges without HF's allocations, for a plain BPE model
    /// ([`crate::tokenize::bpe`]); `None`: HF's model for every piece.
    bpe: Option<ByteBpe>,
}

impl FastEncoder {
    /// For `t`, whose added tokens are all unnormalized and non-stripping
    /// (the prefix-cache shape check).
    pub(crate) fn new(t: &FastTokenizer, bpe: Option<ByteBpe>) -> Result<Self, String> {
        let mut added: Vec<(u32, String)> = t
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, tok)| (id, tok.content))
            .collect();
        added.sort_unstable();
        let trie = aho_corasick::AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(added.iter().map(|(_, c)| c))
            .map_err(|e| e.to_string())?;
        Ok(Self {
            added: trie,
            added_ids: added.iter().map(|(id, _)| *id).collect(),
            byte_chars: byte_chars(),
            bpe,
        })
    }

    /// Ids of `text` and the byte offset where each token's piece starts;
    /// `None` when a segment is not NFC (the caller uses HF's encode).
    pub(crate) fn encode(&self, t: &FastTokenizer, text: &str) -> Option<(Vec<u32>, Vec<u32>)> {
        let mut ids = Vec::with_capacity(text.len() / 3);
        let mut starts = Vec::with_capacity(text.len() / 3);
        let mut at = 0;
        for m in self.added.find_iter(text) {
            self.segment(t, text, at, m.start(), &mut ids, &mut starts)?;
            ids.push(*self.added_ids.get(m.pattern().as_usize())?);
            starts.push(u32::try_from(m.start()).ok()?);
            at = m.end();
        }
        self.segment(t, text, at, text.len(), &mut ids, &mut starts)?;
        Some((ids, starts))
    }

    fn segment(
        &self,
        t: &FastTokenizer,
        text: &str,
        from: usize,
        to: usize,
        ids: &mut Vec<u32>,
        starts: &mut Vec<u32>,
    ) -> Option<()> {
        let seg = text.get(from..to)?;
        if seg.is_empty() {
            return Some(());
        }
        // The text the split and the model see: the segment normalized as
        // HF would (NFC, per segment), and the way back to `seg`'s offsets.
        let normalized;
        let (norm, map): (&str, Option<NfcMap>) = match t.get_normalizer() {
            None => (seg, None),
            Some(_) if seg.is_ascii() => (seg, None),
            Some(NormalizerWrapper::NFC(_)) => match nfc(seg) {
                None => (seg, None),
                Some((n, m)) => {
                    normalized = n;
                    (normalized.as_str(), Some(m))
                }
            },
            Some(n) => {
                // Not reached for the allow-listed shapes (NFC or none):
                // another normalizer goes the HF way unless it is a no-op.
                let mut ns = tokenizers::NormalizedString::from(seg);
                n.normalize(&mut ns).ok()?;
                if ns.get() != seg {
                    return None;
                }
                (seg, None)
            }
        };
        let split = t.get_pre_tokenizer()?;
        let model = t.get_model();
        let mut mapped = String::new();
        let mut back = map.as_ref().map(NfcMap::cursor);
        split.pieces(norm, |a, b| {
            let at = back.as_mut().map_or(a, |c| c.original(a));
            let start = u32::try_from(from + at).ok()?;
            if let Some(bpe) = &self.bpe
                && bpe.encode(&norm.as_bytes()[a..b], ids)
            {
                starts.resize(ids.len(), start);
                return Some(());
            }
            mapped.clear();
            mapped.extend(
                norm.as_bytes()[a..b]
                    .iter()
                    .map(|&x| self.byte_chars[usize::from(x)]),
            );
            for token in model.tokenize(&mapped).ok()? {
                ids.push(token.id);
                starts.push(start);
            }
            Some(())
        })
    }
}

/// A rewritten stretch of a segment: `seg[orig..orig + orig_len]` became
/// `norm[norm..norm + norm_len]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Rewrite {
    orig: usize,
    orig_len: usize,
    norm: usize,
    norm_len: usize,
}

/// From offsets in the NFC text back to offsets in the original segment.
#[derive(Debug, Default, PartialEq, Eq)]
struct NfcMap(Vec<Rewrite>);

impl NfcMap {
    fn cursor(&self) -> NfcCursor<'_> {
        NfcCursor {
            rewrites: &self.0,
            next: 0,
        }
    }
}

/// Maps increasing normalized offsets back (a pass over the rewrites).
struct NfcCursor<'a> {
    rewrites: &'a [Rewrite],
    next: usize,
}

impl NfcCursor<'_> {
    /// The original offset of normalized offset `at` (non-decreasing calls).
    /// Exact outside rewritten stretches and at their starts; inside one, a
    /// position within it (a piece cannot start at a cut there: see [`nfc`]).
    fn original(&mut self, at: usize) -> usize {
        while let Some(r) = self.rewrites.get(self.next) {
            if at < r.norm + r.norm_len {
                break;
            }
            self.next += 1;
        }
        // Offsets before the next rewrite are shifted by every rewrite
        // passed; inside it, clamped to its original stretch.
        let shift = |r: &Rewrite| (r.orig + r.orig_len) as isize - (r.norm + r.norm_len) as isize;
        match self.rewrites.get(self.next) {
            Some(r) if at >= r.norm => r.orig + (at - r.norm).min(r.orig_len.saturating_sub(1)),
            _ => {
                let before = self.next.checked_sub(1).and_then(|i| self.rewrites.get(i));
                (at as isize + before.map_or(0, shift)).max(0) as usize
            }
        }
    }
}

/// `seg` in NFC with the map back, or `None` when it is NFC already.
///
/// Normalized stretch by stretch, without HF's per-byte alignment tables:
/// each maximal run of non-ASCII characters together with the ASCII
/// character before it (which may compose with a combining mark opening the
/// run). The stretches are independent: an ASCII character is a starter
/// (combining class 0), so no composition or reordering crosses it, and it
/// is never the second character of a composition, so a run cannot compose
/// with the ASCII character after it. NFC of the segment is therefore the
/// concatenation, as HF's NFC of the whole segment gives. A prefix-cache cut
/// lies between two ASCII characters, hence never strictly inside a
/// stretch, and there the map is exact.
fn nfc(seg: &str) -> Option<(String, NfcMap)> {
    use unicode_normalization_alignments::{UnicodeNormalization, is_nfc};
    if is_nfc(seg) {
        return None;
    }
    let bytes = seg.as_bytes();
    let mut out = String::with_capacity(seg.len());
    let mut map = NfcMap::default();
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii() {
            i += 1;
            continue;
        }
        let start = if i > 0 { i - 1 } else { 0 };
        let mut end = i;
        while end < bytes.len() && !bytes[end].is_ascii() {
            end += 1;
        }
        let stretch = &seg[start..end];
        if !is_nfc(stretch) {
            out.push_str(&seg[copied..start]);
            let norm = out.len();
            out.extend(stretch.nfc().map(|(c, _)| c));
            map.0.push(Rewrite {
                orig: start,
                orig_len: end - start,
                norm,
                norm_len: out.len() - norm,
            });
            copied = end;
        }
        i = end;
    }
    out.push_str(&seg[copied..]);
    Some((out, map))
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
    fn the_byte_table_is_gpt2s() {
        let t = byte_chars();
        assert_eq!(
            (t[usize::from(b'a')], t[usize::from(b' ')], t[0]),
            ('a', 'Ġ', 'Ā')
        );
        assert_eq!((t[usize::from(b'\n')], t[0xAD], t[0xFF]), ('Ċ', 'Ń', 'ÿ'));
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

    #[test]
    fn nfc_rewrites_only_the_stretches_that_change_and_maps_back() {
        assert_eq!(nfc("plain ascii"), None);
        assert_eq!(nfc("caf\u{e9} d\u{e9}j\u{e0}"), None, "NFC already");
        let text = "cafe\u{301} and nai\u{308}ve, \u{301}x";
        let (norm, map) = nfc(text).expect("not NFC");
        assert_eq!(norm, "caf\u{e9} and na\u{ef}ve, \u{301}x");
        use unicode_normalization_alignments::UnicodeNormalization;
        assert_eq!(
            norm,
            text.nfc().map(|(c, _)| c).collect::<String>(),
            "HF's NFC"
        );
        // Every ASCII position between two ASCII characters maps exactly.
        let mut cursor = map.cursor();
        let mut pairs = Vec::new();
        for (at, ch) in norm.char_indices() {
            let orig = cursor.original(at);
            pairs.push((ch, orig));
        }
        let exact = |ch: char, orig: usize| text[orig..].starts_with(ch);
        for (ch, orig) in &pairs {
            if ch.is_ascii() && *ch != 'e' && *ch != 'i' {
                assert!(exact(*ch, *orig), "{ch:?} at {orig}");
            }
        }
        let origs: Vec<usize> = pairs.iter().map(|p| p.1).collect();
        assert!(
            origs.windows(2).all(|w| w[0] <= w[1]),
            "monotone: {origs:?}"
        );
        assert!(origs.iter().all(|&o| o < text.len()));
    }
}

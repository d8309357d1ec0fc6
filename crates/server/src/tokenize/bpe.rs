//! The byte-level BPE merges of the fast encode, without HF's per-word
//! allocations.
//!
//! A prompt the tokenizer has not seen costs most in HF's BPE model: for a
//! word missing from its word cache, `BPE::tokenize` allocates a string per
//! character to look it up in the vocabulary, runs the merges on a heap, and
//! allocates a `String` per resulting token (`Token::value`), which the
//! encode drops. On the real-vLLM benchmark's prompts (random vocabulary: a
//! cache miss per word) that was 2.5-10 µs per token, 4-17 ms per new
//! 1.6 K-token prompt, on the gateway's request path (session 43).
//!
//! Here a piece's bytes map straight to the ids of their byte characters
//! (every byte is a token of a byte-level vocabulary), and the merges run on
//! two small arrays: repeatedly the lowest-ranked adjacent pair, leftmost
//! first, which is the order HF's heap pops them in (rank, then position),
//! so the ids are HF's. It is quadratic in the piece's length, so pieces
//! longer than [`MAX_PIECE`] bytes (long whitespace or symbol runs) still go
//! to HF's model. Only for a plain BPE model (no dropout, byte fallback,
//! `ignore_merges`, subword prefix or suffix); any other loads without it.

use rustc_hash::FxHashMap;
use serde_json::Value;

/// Longest piece merged here; longer ones go to HF's heap-based merge.
pub(crate) const MAX_PIECE: usize = 96;

/// A byte-level BPE model's merge table, keyed by the pair's ids.
#[derive(Debug)]
pub(crate) struct ByteBpe {
    byte_ids: [u32; 256],
    /// `(left << 32 | right)` → (rank, merged id).
    merges: FxHashMap<u64, (u32, u32)>,
}

const NONE: (u32, u32) = (u32::MAX, 0);

impl ByteBpe {
    /// From `tokenizer.json` (its `model`), with the pre-tokenizer's
    /// byte-to-character table; or why this model is not one.
    pub(crate) fn from_tokenizer_json(
        json: &Value,
        byte_chars: &[char; 256],
    ) -> Result<Self, String> {
        let model = json.get("model").ok_or("no model")?;
        if model.get("type").and_then(Value::as_str) != Some("BPE") {
            return Err("not a BPE model".into());
        }
        let empty_or_null = |k: &str| match model.get(k) {
            None | Some(Value::Null) => true,
            Some(Value::String(s)) => s.is_empty(),
            Some(Value::Bool(b)) => !b,
            _ => false,
        };
        for k in [
            "dropout",
            "continuing_subword_prefix",
            "end_of_word_suffix",
            "byte_fallback",
            "ignore_merges",
        ] {
            if !empty_or_null(k) {
                return Err(format!("BPE model sets {k}"));
            }
        }
        let vocab: FxHashMap<&str, u32> = model
            .get("vocab")
            .and_then(Value::as_object)
            .ok_or("no vocab")?
            .iter()
            .filter_map(|(k, v)| Some((k.as_str(), u32::try_from(v.as_u64()?).ok()?)))
            .collect();
        let mut byte_ids = [0u32; 256];
        let mut buf = [0u8; 4];
        for (id, ch) in byte_ids.iter_mut().zip(byte_chars) {
            *id = *vocab
                .get(&*ch.encode_utf8(&mut buf))
                .ok_or("a byte is not in the vocabulary")?;
        }
        let list = model
            .get("merges")
            .and_then(Value::as_array)
            .ok_or("no merges")?;
        let mut merges = FxHashMap::default();
        merges.reserve(list.len());
        let mut joined = String::new();
        for (rank, m) in list.iter().enumerate() {
            // Two formats: "a b" (older files) or ["a", "b"].
            let (a, b) = match m {
                Value::String(s) => {
                    let mut it = s.split(' ');
                    match (it.next(), it.next(), it.next()) {
                        (Some(a), Some(b), None) => (a, b),
                        _ => return Err(format!("merge {s:?} is not two tokens")),
                    }
                }
                Value::Array(p) => match (
                    p.first().and_then(Value::as_str),
                    p.get(1).and_then(Value::as_str),
                ) {
                    (Some(a), Some(b)) if p.len() == 2 => (a, b),
                    _ => return Err("a merge is not two tokens".into()),
                },
                _ => return Err("a merge is not two tokens".into()),
            };
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let (Some(&l), Some(&r), Some(&new)) =
                (vocab.get(a), vocab.get(b), vocab.get(joined.as_str()))
            else {
                return Err(format!("merge {a:?} {b:?} is not in the vocabulary"));
            };
            let rank = u32::try_from(rank).map_err(|_| "too many merges")?;
            // A repeated pair keeps its last rank, as HF's map does.
            merges.insert(key(l, r), (rank, new));
        }
        Ok(Self { byte_ids, merges })
    }

    fn pair(&self, l: u32, r: u32) -> (u32, u32) {
        self.merges.get(&key(l, r)).copied().unwrap_or(NONE)
    }

    /// Appends the ids of one pre-tokenized piece (its bytes, before the
    /// byte-to-character map) to `out`; false (nothing appended) when it is
    /// longer than [`MAX_PIECE`].
    pub(crate) fn encode(&self, piece: &[u8], out: &mut Vec<u32>) -> bool {
        let n = piece.len();
        match n {
            0 => return true,
            1 => {
                out.push(self.byte_ids[usize::from(piece[0])]);
                return true;
            }
            _ if n > MAX_PIECE => return false,
            _ => {}
        }
        let mut syms = [0u32; MAX_PIECE];
        let mut ranks = [NONE; MAX_PIECE];
        for (s, b) in syms.iter_mut().zip(piece) {
            *s = self.byte_ids[usize::from(*b)];
        }
        for i in 0..n - 1 {
            ranks[i] = self.pair(syms[i], syms[i + 1]);
        }
        let mut len = n;
        while len > 1 {
            // The lowest rank, leftmost among equals (HF's heap order).
            let mut at = 0;
            for i in 1..len - 1 {
                if ranks[i].0 < ranks[at].0 {
                    at = i;
                }
            }
            let (rank, new) = ranks[at];
            if rank == u32::MAX {
                break;
            }
            syms[at] = new;
            syms.copy_within(at + 2..len, at + 1);
            ranks.copy_within(at + 1..len - 1, at);
            len -= 1;
            if at > 0 {
                ranks[at - 1] = self.pair(syms[at - 1], syms[at]);
            }
            if at + 1 < len {
                ranks[at] = self.pair(syms[at], syms[at + 1]);
            }
        }
        out.extend_from_slice(&syms[..len]);
        true
    }
}

fn key(l: u32, r: u32) -> u64 {
    (u64::from(l) << 32) | u64::from(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy byte-level model: bytes are their own characters here.
    fn toy(merges: &[(&str, &str)]) -> ByteBpe {
        let mut chars = ['\0'; 256];
        for (b, c) in chars.iter_mut().enumerate() {
            *c = char::from(u8::try_from(b).unwrap());
        }
        let mut vocab = serde_json::Map::new();
        for c in chars {
            let n = vocab.len();
            vocab.insert(c.to_string(), n.into());
        }
        for (a, b) in merges {
            let n = vocab.len();
            vocab.entry(format!("{a}{b}")).or_insert(n.into());
        }
        let json = serde_json::json!({"model": {"type": "BPE", "dropout": null,
            "continuing_subword_prefix": "", "end_of_word_suffix": "", "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab,
            "merges": merges.iter().map(|(a, b)| [a, b]).collect::<Vec<_>>()}});
        ByteBpe::from_tokenizer_json(&json, &chars).unwrap()
    }

    fn ids(bpe: &ByteBpe, s: &str) -> Vec<u32> {
        let mut out = Vec::new();
        assert!(bpe.encode(s.as_bytes(), &mut out));
        out
    }

    #[test]
    fn lowest_rank_first_and_leftmost_among_equals() {
        // "aaa" with (a, a): the left pair merges first, as HF's heap pops
        // the lower position.
        let bpe = toy(&[("a", "a")]);
        assert_eq!(ids(&bpe, "aaa"), vec![256, u32::from(b'a')]);
        // Rank beats position: (b, c) before (a, b).
        let bpe = toy(&[("b", "c"), ("a", "b")]);
        assert_eq!(ids(&bpe, "abc"), vec![u32::from(b'a'), 256]);
        // Merges build on merges.
        let bpe = toy(&[("a", "b"), ("ab", "c"), ("abc", "d")]);
        assert_eq!(ids(&bpe, "abcd"), vec![258]);
        assert_eq!(
            ids(&bpe, "xabcdy"),
            vec![u32::from(b'x'), 258, u32::from(b'y')]
        );
    }

    #[test]
    fn long_pieces_are_left_to_the_caller() {
        let bpe = toy(&[(" ", " ")]);
        let mut out = vec![7];
        assert!(!bpe.encode(" ".repeat(MAX_PIECE + 1).as_bytes(), &mut out));
        assert_eq!(out, vec![7]);
        assert_eq!(ids(&bpe, &" ".repeat(MAX_PIECE)).len(), MAX_PIECE / 2);
    }

    #[test]
    fn other_bpe_models_are_refused() {
        let chars = ['a'; 256];
        let json = serde_json::json!({"model": {"type": "BPE", "dropout": 0.1,
            "vocab": {}, "merges": []}});
        assert!(ByteBpe::from_tokenizer_json(&json, &chars).is_err());
        let json = serde_json::json!({"model": {"type": "WordPiece"}});
        assert!(ByteBpe::from_tokenizer_json(&json, &chars).is_err());
    }
}

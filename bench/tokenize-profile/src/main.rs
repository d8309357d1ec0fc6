//! Where an HF encode of a rendered prompt spends its time, stage by stage
//! (see README.md). usage: bench-tokenize-profile TOKENIZER_JSON TEXT_FILE [ITERATIONS]
//! Prints the median of each measurement; ratios are what to compare.
#![allow(clippy::unwrap_used)]

use std::time::Instant;
use tokenizers::{NormalizedString, Normalizer, PreTokenizedString, PreTokenizer, Model, OffsetReferential, OffsetType, Tokenizer};

fn best<F: FnMut()>(n: usize, mut f: F) -> f64 {
    let mut v = Vec::new();
    for _ in 0..n { let t = Instant::now(); f(); v.push(t.elapsed().as_secs_f64() * 1e6); }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let tok = Tokenizer::from_file(&args[1]).unwrap();
    let text = std::fs::read_to_string(&args[2]).unwrap();
    let n_iter: usize = args.get(3).map(|s| s.parse().unwrap()).unwrap_or(20);
    let ids = tok.encode(text.as_str(), false).unwrap().get_ids().to_vec();
    let nt = ids.len() as f64;
    println!("text {} bytes, {} tokens", text.len(), ids.len());
    let r = |name: &str, us: f64| println!("{name:<32} {us:>10.0} us  {:>6.3} us/token", us / nt);
    r("encode (offsets)", best(n_iter, || { std::hint::black_box(tok.encode(text.as_str(), false).unwrap()); }));
    r("encode_fast", best(n_iter, || { std::hint::black_box(tok.encode_fast(text.as_str(), false).unwrap()); }));
    let norm = tok.get_normalizer().unwrap();
    r("normalizer (NFC) only", best(n_iter, || { let mut n = NormalizedString::from(text.as_str()); norm.normalize(&mut n).unwrap(); std::hint::black_box(n); }));
    let pre = tok.get_pre_tokenizer().unwrap();
    const R: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    let sys = tokenizers::utils::SysRegex::new(R).unwrap();
    r("split regex: raw find_iter", best(n_iter, || { std::hint::black_box(sys.find_iter(&text).count()); }));
    let dfa = regex::Regex::new(&R.replacen(r"\s+(?!\S)|", "", 1)).unwrap();
    r("regex crate DFA: raw find_iter", best(n_iter, || { std::hint::black_box(dfa.find_iter(&text).count()); }));
    let split = tokenizers::pre_tokenizers::split::Split::new(tokenizers::pre_tokenizers::split::SplitPattern::Regex(R.into()), tokenizers::SplitDelimiterBehavior::Isolated, false).unwrap();
    r("Split pre-tokenizer only", best(n_iter, || { let mut p = PreTokenizedString::from(text.as_str()); split.pre_tokenize(&mut p).unwrap(); std::hint::black_box(p); }));
    let bl = tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, false, false);
    let mut split_done = PreTokenizedString::from(text.as_str()); split.pre_tokenize(&mut split_done).unwrap();
    r("ByteLevel on split text only", best(n_iter, || { let mut p = split_done.clone(); bl.pre_tokenize(&mut p).unwrap(); std::hint::black_box(p); }));
    r("  (clone of split text)", best(n_iter, || { let p = split_done.clone(); std::hint::black_box(p); }));
    r("pre-tokenizer only", best(n_iter, || { let mut p = PreTokenizedString::from(text.as_str()); pre.pre_tokenize(&mut p).unwrap(); std::hint::black_box(p); }));
    let mut p = PreTokenizedString::from(text.as_str()); pre.pre_tokenize(&mut p).unwrap();
    let words: Vec<String> = p.get_splits(OffsetReferential::Original, OffsetType::None).into_iter().map(|(s, _, _)| s.to_owned()).collect();
    println!("pre-tokens: {}", words.len());
    let model = tok.get_model();
    r("BPE only (warm word cache)", best(n_iter, || { for w in &words { std::hint::black_box(model.tokenize(w).unwrap()); } }));
    r("BPE only (cache cleared)", best(n_iter, || { if let tokenizers::ModelWrapper::BPE(b) = model { b.clear_cache(); } for w in &words { std::hint::black_box(model.tokenize(w).unwrap()); } }));
    r("encode_fast (BPE cache cleared)", best(n_iter, || { if let tokenizers::ModelWrapper::BPE(b) = model { b.clear_cache(); } std::hint::black_box(tok.encode_fast(text.as_str(), false).unwrap()); }));
}

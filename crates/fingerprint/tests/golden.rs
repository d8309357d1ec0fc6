//! Asserts the shared golden vectors byte for byte, plus the frozen anchors of
//! the reference implementation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use inferencecache_fingerprint::{
    chain, content_hash, content_hashes, from_wire, prefix_hashes, prefix_hashes_from, to_wire,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    scheme: Scheme,
    vectors: Vec<Vector>,
}

#[derive(Deserialize)]
struct Scheme {
    algorithm: String,
    seed: u64,
}

#[derive(Deserialize)]
struct Vector {
    name: String,
    tokens: Vec<u32>,
    block_size: usize,
    parent_prefix: Option<Hash>,
    content_hashes: Vec<Hash>,
    prefix_hashes: Vec<Hash>,
}

#[derive(Deserialize)]
struct Hash {
    dec: String,
    b64be: String,
}

impl Hash {
    /// Decodes both forms and checks that they agree.
    fn value(&self) -> u64 {
        let dec: u64 = self.dec.parse().expect("decimal u64");
        let bytes = STANDARD.decode(&self.b64be).expect("base64");
        assert_eq!(from_wire(&bytes), Some(dec), "dec and b64be disagree");
        dec
    }
}

fn fixture() -> Fixture {
    let text = include_str!("data/golden_vectors.json");
    serde_json::from_str(text).expect("golden_vectors.json parses")
}

#[test]
fn scheme_header_is_pinned() {
    let f = fixture();
    assert_eq!(f.scheme.algorithm, "XXH3-64");
    assert_eq!(f.scheme.seed, inferencecache_fingerprint::SEED);
}

#[test]
fn every_golden_vector_matches() {
    let f = fixture();
    assert_eq!(f.vectors.len(), 6, "the fixture has six vectors");
    for v in &f.vectors {
        let want_content: Vec<u64> = v.content_hashes.iter().map(Hash::value).collect();
        let want_prefix: Vec<u64> = v.prefix_hashes.iter().map(Hash::value).collect();
        let parent = v.parent_prefix.as_ref().map(Hash::value);

        assert_eq!(
            content_hashes(&v.tokens, v.block_size),
            want_content,
            "{}: content hashes",
            v.name
        );
        assert_eq!(
            prefix_hashes_from(&v.tokens, v.block_size, parent),
            want_prefix,
            "{}: prefix hashes",
            v.name
        );
        // The base64 form is the wire form: check it through to_wire too.
        for (h, want) in want_prefix.iter().zip(&v.prefix_hashes) {
            assert_eq!(STANDARD.encode(to_wire(*h)), want.b64be, "{}: wire", v.name);
        }
        if parent.is_none() {
            let c = chain(&v.tokens, v.block_size);
            let wire: Vec<String> = c.block_hashes.iter().map(|h| STANDARD.encode(h)).collect();
            let want: Vec<&str> = v.prefix_hashes.iter().map(|h| h.b64be.as_str()).collect();
            assert_eq!(wire, want, "{}: chain()", v.name);
            assert!(
                c.block_token_counts
                    .iter()
                    .all(|&n| n as usize == v.block_size),
                "{}: counts are the block size",
                v.name
            );
            assert_eq!(c.block_token_counts.len(), c.block_hashes.len());
        }
    }
}

#[test]
fn empty_vector_yields_empty_arrays() {
    let f = fixture();
    let v = f
        .vectors
        .iter()
        .find(|v| v.name == "partial_only_no_blocks")
        .expect("vector present");
    assert!(chain(&v.tokens, v.block_size).is_empty());
    assert!(v.prefix_hashes.is_empty() && v.content_hashes.is_empty());
}

#[test]
fn frozen_anchors() {
    let one_to_16: Vec<u32> = (1..=16).collect();
    assert_eq!(content_hash(&one_to_16), 16_863_443_419_780_771_464);

    let zero_to_63: Vec<u32> = (0..64).collect();
    assert_eq!(prefix_hashes(&zero_to_63, 16)[3], 3_888_788_807_566_526_800);

    let fifty_to_81: Vec<u32> = (50..82).collect();
    assert_eq!(
        prefix_hashes_from(&fifty_to_81, 16, Some(0xDEAD_BEEF)).len(),
        2
    );
}

#[test]
fn chain_prefixes_match_independent_prefix_hashes() {
    // prefix[i] of a long prompt equals the last prefix hash of its first i+1 blocks.
    let tokens: Vec<u32> = (0..160).map(|t| t * 7 + 3).collect();
    let all = prefix_hashes(&tokens, 16);
    for i in 0..all.len() {
        let head = prefix_hashes(&tokens[..(i + 1) * 16], 16);
        assert_eq!(head.last(), Some(&all[i]));
    }
}

#[test]
fn chain_is_empty_without_a_full_block() {
    assert!(chain(&[1, 2, 3], 16).is_empty());
    assert!(chain(&[1, 2, 3], 0).is_empty());
    assert!(chain(&[], 16).is_empty());
}

//! What a block is keyed by besides its tokens (vLLM `extra_keys`, SGLang
//! `cache_salt`), and blocks the engine holds twice under one hash: the
//! mapping's fingerprint must match only lookups that carry the same keys,
//! and a duplicated block must stay reported until its last copy goes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use inferencecache_fingerprint::{ExtraKeys, chain, chain_salted, from_wire, prefix_hashes};
use inferencecache_subscriber::{
    BlockRemoved, BlockStored, EngineEvent, EngineHash, Mapping, MappingConfig, Medium, Update,
};
use proptest::prelude::*;
use rmpv::Value;

fn stored(hashes: &[u64], parent: Option<u64>, tokens: Vec<u32>) -> BlockStored {
    BlockStored {
        block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
        parent_block_hash: parent.map(EngineHash::Uint),
        token_ids: tokens,
        block_size: 16,
        medium: Some(Medium::Gpu),
        ..BlockStored::default()
    }
}

fn removed(hashes: &[u64]) -> EngineEvent {
    EngineEvent::BlockRemoved(BlockRemoved {
        block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
        medium: Some(Medium::Gpu),
        group_idx: None,
    })
}

fn prefixes(m: &mut Mapping, ev: BlockStored) -> Vec<u64> {
    let mut out = Vec::new();
    m.apply(&EngineEvent::BlockStored(ev), &mut out);
    out.iter()
        .map(|u| match u {
            Update::Report(r) => r.prefix_hash,
            other => panic!("{other:?}"),
        })
        .collect()
}

fn wire(c: &inferencecache_fingerprint::Chain) -> Vec<u64> {
    c.block_hashes
        .iter()
        .map(|h| from_wire(h).unwrap())
        .collect()
}

/// vLLM's per-block extra keys: the salt on the first block only.
fn vllm_salted(salt: &str, blocks: usize) -> Option<Vec<Option<Value>>> {
    Some(
        (0..blocks)
            .map(|i| (i == 0).then(|| Value::Array(vec![Value::from(salt)])))
            .collect(),
    )
}

#[test]
fn a_vllm_salt_keys_the_chain_like_a_salted_lookup() {
    let tokens: Vec<u32> = (0..48).collect();
    let mut m = Mapping::new(MappingConfig::default());
    let mut ev = stored(&[1, 2, 3], None, tokens.clone());
    ev.extra_keys = vllm_salted("tenant-a", 3);
    let got = prefixes(&mut m, ev);
    assert_eq!(got, wire(&chain_salted(&tokens, 16, "tenant-a")));
    assert_ne!(
        got[0],
        prefix_hashes(&tokens, 16)[0],
        "never the unsalted key"
    );
}

#[test]
fn an_sglang_salt_keys_the_root_and_continuations_inherit_it() {
    let tokens: Vec<u32> = (0..48).collect();
    let mut m = Mapping::new(MappingConfig::default());
    let mut root = stored(&[1], None, tokens[..16].to_vec());
    root.cache_salt = Some("tenant-a".into());
    let mut rest = stored(&[2, 3], Some(1), tokens[16..].to_vec());
    rest.cache_salt = Some("tenant-a".into());
    let mut got = prefixes(&mut m, root);
    got.extend(prefixes(&mut m, rest));
    assert_eq!(got, wire(&chain_salted(&tokens, 16, "tenant-a")));
}

#[test]
fn the_lora_name_is_the_partition_not_a_key_and_images_key_their_blocks() {
    let tokens: Vec<u32> = (0..32).collect();
    let mut m = Mapping::new(MappingConfig::default());
    let mut lora = stored(&[1, 2], None, tokens.clone());
    lora.lora_name = Some("sql".into());
    lora.extra_keys = Some(vec![
        Some(Value::Array(vec![Value::from("sql")])),
        Some(Value::Array(vec![Value::from("sql")])),
    ]);
    assert_eq!(prefixes(&mut m, lora), prefix_hashes(&tokens, 16));

    // An image's (identifier, offset) on the second block: identical
    // placeholder tokens, another image, another key.
    let image = |id: &str| {
        let mut ev = stored(&[10, 11], None, tokens.clone());
        ev.extra_keys = Some(vec![
            None,
            Some(Value::Array(vec![Value::Array(vec![
                Value::from(id),
                Value::from(0),
            ])])),
        ]);
        ev
    };
    let cat = prefixes(&mut Mapping::new(MappingConfig::default()), image("cat"));
    let dog = prefixes(&mut Mapping::new(MappingConfig::default()), image("dog"));
    assert_eq!(
        cat[0],
        prefix_hashes(&tokens, 16)[0],
        "the text block is plain"
    );
    assert_ne!(cat[1], prefix_hashes(&tokens, 16)[1]);
    assert_ne!(cat[1], dog[1]);
}

#[test]
fn a_block_stored_twice_leaves_with_its_last_copy() {
    let tokens: Vec<u32> = (0..16).collect();
    let mut m = Mapping::new(MappingConfig::default());
    prefixes(&mut m, stored(&[1], None, tokens.clone()));
    prefixes(&mut m, stored(&[1], None, tokens));
    let mut out = Vec::new();
    m.apply(&removed(&[1]), &mut out);
    assert!(out.is_empty(), "one copy is still cached: {out:?}");
    assert_eq!(m.tracked_blocks(), 1);
    m.apply(&removed(&[1]), &mut out);
    assert!(matches!(out.as_slice(), [Update::Evict(_)]), "{out:?}");
    assert_eq!(m.stats().duplicate_blocks, 1);
    assert_eq!(m.stats().removed_duplicates, 1);
    assert_eq!(m.stats().removed_unknown, 0);
}

proptest! {
    /// Unsalted blocks fingerprint exactly as before (the golden scheme),
    /// and any salt changes every block of the chain.
    #[test]
    fn salted_and_unsalted_chains_never_meet(
        tokens in prop::collection::vec(any::<u32>(), 16..96),
        salt in "[a-z]{1,8}",
    ) {
        let n = tokens.len() / 16;
        let hashes: Vec<u64> = (1..=n as u64).collect();
        let tokens = tokens[..n * 16].to_vec();
        let plain = prefixes(&mut Mapping::new(MappingConfig::default()), stored(&hashes, None, tokens.clone()));
        prop_assert_eq!(&plain, &wire(&chain(&tokens, 16)));
        let mut ev = stored(&hashes, None, tokens.clone());
        ev.extra_keys = vllm_salted(&salt, n);
        let salted = prefixes(&mut Mapping::new(MappingConfig::default()), ev);
        prop_assert_eq!(&salted, &wire(&chain_salted(&tokens, 16, &salt)));
        for (a, b) in salted.iter().zip(&plain) {
            prop_assert_ne!(a, b);
        }
        prop_assert!(!ExtraKeys::salt(&salt).is_empty());
    }
}

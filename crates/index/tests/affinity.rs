//! Index behaviour tests: affinity.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn affinity_cross_check_vectors() {
    // §9.2: two_block_chain seed.
    let chain_hashes = vec![hex("ea06fc71a5ee6e88"), hex("ad01835a37dd294c")];
    let seed = chain_seed(&chain_hashes);
    assert_eq!(
        seed,
        hex("00000008ea06fc71a5ee6e8800000008ad01835a37dd294c")
    );
    assert_eq!(affinity_seed_value(&seed), 13_380_606_229_280_301_753);
    assert_eq!(affinity_index(&seed, 2), 1);
    assert_eq!(affinity_index(&seed, 3), 0);
    assert_eq!(affinity_index(&seed, 4), 1);
    assert_eq!(affinity_index(&seed, 8), 1);
    assert_eq!(affinity_seed_value(b"p"), 1_481_096_887_605_153_049);
    assert_eq!(affinity_index(b"p", 2), 1);
    assert_eq!(affinity_index(b"p", 3), 1);
    assert_eq!(affinity_index(b"p", 4), 1);
}

#[test]
fn affinity_hint_picks_from_byte_sorted_scope() {
    let e = Env::new();
    for r in ["r2", "r0", "r1"] {
        e.put("t", "m", "vllm", r, &[(1, 16)]);
    }
    let seed = hex("00000008ea06fc71a5ee6e8800000008ad01835a37dd294c");
    // mod 3 = 0 → "r0".
    assert_eq!(
        e.idx.affinity_hint("t", "m", "vllm", &seed).as_deref(),
        Some("r0")
    );
}

#[test]
fn affinity_hint_empty_replica_set() {
    let e = Env::new();
    assert_eq!(e.idx.affinity_hint("t", "m", "vllm", b"p"), None);
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.event(EventKind::AllCleared, "t", "m", "r1", None, "");
    assert_eq!(e.idx.affinity_hint("t", "m", "vllm", b"p"), None);
}

#[test]
fn affinity_hint_empty_hash_scheme_returns_false() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert_eq!(e.idx.affinity_hint("t", "m", "", b"p"), None);
}

#[test]
fn affinity_hint_empty_seed_returns_false() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert_eq!(e.idx.affinity_hint("t", "m", "vllm", b""), None);
}

#[test]
fn affinity_hint_scheme_disjoint() {
    let e = Env::new();
    e.put("t", "m", "vllm", "a", &[(1, 16)]);
    e.put("t", "m", "sglang", "b", &[(1, 16)]);
    for i in 0..50u32 {
        let seed = i.to_be_bytes();
        assert_eq!(
            e.idx.affinity_hint("t", "m", "vllm", &seed).as_deref(),
            Some("a")
        );
        assert_eq!(
            e.idx.affinity_hint("t", "m", "sglang", &seed).as_deref(),
            Some("b")
        );
    }
}

#[test]
fn affinity_hint_stable() {
    let e = Env::new();
    for i in 0..5 {
        e.put("t", "m", "vllm", &format!("r{i}"), &[(1, 16)]);
    }
    let first = e.idx.affinity_hint("t", "m", "vllm", b"seed").unwrap();
    for _ in 0..100 {
        assert_eq!(
            e.idx.affinity_hint("t", "m", "vllm", b"seed").unwrap(),
            first
        );
    }
}

#[test]
fn affinity_hint_single_replica() {
    let e = Env::new();
    e.put("t", "m", "vllm", "only", &[(1, 16)]);
    for i in 0..20u8 {
        assert_eq!(
            e.idx.affinity_hint("t", "m", "vllm", &[i + 1]).as_deref(),
            Some("only")
        );
    }
}

#[test]
fn affinity_hint_balanced() {
    let e = Env::new();
    for i in 0..8 {
        e.put("t", "m", "vllm", &format!("r{i}"), &[(1, 16)]);
    }
    let mut counts = std::collections::HashMap::<String, u32>::new();
    let mut x: u64 = 0x1234_5678_9abc_def1;
    for _ in 0..1000 {
        let mut seed = [0u8; 32];
        for chunk in seed.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        let r = e.idx.affinity_hint("t", "m", "vllm", &seed).unwrap();
        *counts.entry(r.to_string()).or_default() += 1;
    }
    assert_eq!(counts.len(), 8);
    for (r, n) in counts {
        assert!((80..=220).contains(&n), "{r} got {n}");
    }
}

#[test]
fn affinity_hint_sort_order_independent() {
    let a = Env::new();
    let b = Env::new();
    for r in ["x", "a", "m", "c"] {
        a.put("t", "m", "vllm", r, &[(1, 16)]);
    }
    for r in ["c", "m", "a", "x"] {
        b.put("t", "m", "vllm", r, &[(1, 16)]);
    }
    for i in 0..50u32 {
        let seed = i.to_le_bytes();
        assert_eq!(
            a.idx.affinity_hint("t", "m", "vllm", &seed),
            b.idx.affinity_hint("t", "m", "vllm", &seed)
        );
    }
}

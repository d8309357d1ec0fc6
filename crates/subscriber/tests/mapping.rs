//! Engine events → fingerprint reports: golden vectors end to end (msgpack in,
//! prefix hashes out), chaining, held-back parents, tiers, LoRA, the bound,
//! and a model-based property test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{HashMap, HashSet};

use common::*;
use inferencecache_fingerprint::{prefix_hashes, to_wire};
use inferencecache_subscriber::{
    BlockRemoved, BlockStored, DecodeOptions, EngineEvent, EngineHash, Mapping, MappingConfig,
    Medium, PrefixReport, Tier, TupleLayout, Update, decode_batch, decode_batch_with,
};
use proptest::prelude::*;
use rmpv::Value;

#[derive(serde::Deserialize)]
struct Fixture {
    vectors: Vec<Vector>,
}

#[derive(serde::Deserialize)]
struct Vector {
    name: String,
    tokens: Vec<u32>,
    block_size: u64,
    parent_prefix: Option<serde_json::Value>,
    prefix_hashes: Vec<GoldenHash>,
}

#[derive(serde::Deserialize)]
struct GoldenHash {
    dec: String,
    b64be: String,
}

fn golden() -> Fixture {
    serde_json::from_str(include_str!(
        "../../fingerprint/tests/data/golden_vectors.json"
    ))
    .unwrap()
}

fn mapping() -> Mapping {
    Mapping::new(MappingConfig::default())
}

fn run(m: &mut Mapping, payload: &[u8]) -> Vec<Update> {
    let b = decode_batch(payload);
    assert!(b.errors.is_empty(), "{:?}", b.errors);
    let mut out = Vec::new();
    m.apply_all(&b.events, &mut out);
    out
}

fn reports(out: &[Update]) -> Vec<&PrefixReport> {
    out.iter()
        .map(|u| match u {
            Update::Report(r) => r,
            other => panic!("expected a report, got {other:?}"),
        })
        .collect()
}

fn stored_ev(
    hashes: &[u64],
    parent: Option<u64>,
    tokens: Vec<u32>,
    bs: u32,
    medium: Option<Medium>,
) -> EngineEvent {
    EngineEvent::BlockStored(BlockStored {
        block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
        parent_block_hash: parent.map(EngineHash::Uint),
        token_ids: tokens,
        block_size: bs,
        medium,
        ..BlockStored::default()
    })
}

fn removed_ev(hashes: &[u64], medium: Option<Medium>) -> EngineEvent {
    EngineEvent::BlockRemoved(BlockRemoved {
        block_hashes: hashes.iter().map(|&h| EngineHash::Uint(h)).collect(),
        medium,
        group_idx: None,
    })
}

fn apply(m: &mut Mapping, ev: EngineEvent) -> Vec<Update> {
    let mut out = Vec::new();
    m.apply(&ev, &mut out);
    out
}

/// Every root golden vector, sent as a vLLM 0.33 msgpack batch, yields exactly
/// the golden prefix hashes (dec and big-endian wire bytes) and cumulative counts.
#[test]
fn golden_vectors_through_decode_and_mapping() {
    use base64::Engine as _;
    let f = golden();
    let mut seen = 0;
    for v in f.vectors.iter().filter(|v| v.parent_prefix.is_none()) {
        let n_blocks = v.tokens.len() / v.block_size as usize;
        let hashes: Vec<u64> = (0..n_blocks as u64).map(|i| u64::MAX - i).collect();
        let ev = map(vec![
            ("type", s("BlockStored")),
            ("block_hashes", hashes_u64(&hashes)),
            ("parent_block_hash", nil()),
            (
                "token_ids",
                arr(v.tokens.iter().map(|&t| u(u64::from(t))).collect()),
            ),
            ("block_size", u(v.block_size)),
            ("lora_id", nil()),
            ("medium", s("GPU")),
            ("lora_name", nil()),
        ]);
        let mut m = mapping();
        let out = run(&mut m, &vllm_batch(1.0, vec![ev]));
        let got = reports(&out);
        assert_eq!(got.len(), v.prefix_hashes.len(), "{}", v.name);
        for (i, (r, want)) in got.iter().zip(&v.prefix_hashes).enumerate() {
            assert_eq!(r.prefix_hash.to_string(), want.dec, "{} block {i}", v.name);
            let wire = base64::engine::general_purpose::STANDARD
                .decode(&want.b64be)
                .unwrap();
            assert_eq!(r.prefix_hash_wire().to_vec(), wire, "{} block {i}", v.name);
            assert_eq!(r.token_count, (i as i32 + 1) * v.block_size as i32);
            assert_eq!(r.tier, Tier::T1);
            assert_eq!(&*r.adapter, "");
        }
        seen += 1;
    }
    assert_eq!(
        seen, 5,
        "five root vectors (parent_chain is covered by a unit test)"
    );
}

/// multi_block_chain (0..63, bs 16) split over two events chains onto the parent.
#[test]
fn parent_chaining_across_two_events() {
    let tokens: Vec<u32> = (0..64).collect();
    let want = prefix_hashes(&tokens, 16);
    let mut m = mapping();
    let first = run(
        &mut m,
        &vllm_batch(1.0, vec![vllm_stored(&[10, 11], None, 0..32, 16)]),
    );
    let second = run(
        &mut m,
        &vllm_batch(2.0, vec![vllm_stored(&[12, 13], Some(11), 32..64, 16)]),
    );
    let got: Vec<u64> = reports(&first)
        .iter()
        .chain(reports(&second).iter())
        .map(|r| r.prefix_hash)
        .collect();
    assert_eq!(got, want);
    assert_eq!(reports(&second)[1].token_count, 64);
    assert_eq!(
        want[3], 3_888_788_807_566_526_800,
        "frozen reference anchor"
    );
    // one block at a time gives the same chain
    let mut m = mapping();
    let mut got = Vec::new();
    for k in 0..4u32 {
        let parent = (k > 0).then(|| u64::from(k) - 1);
        let out = apply(
            &mut m,
            stored_ev(
                &[u64::from(k)],
                parent,
                (k * 16..k * 16 + 16).collect(),
                16,
                None,
            ),
        );
        got.extend(reports(&out).iter().map(|r| r.prefix_hash));
    }
    assert_eq!(got, want);
}

/// A child whose parent is unknown is never keyed as a root; it is applied
/// when the parent shows up (e.g. from a replay) with the right chain.
#[test]
fn unknown_parent_is_held_then_resolved() {
    let tokens: Vec<u32> = (0..48).collect();
    let want = prefix_hashes(&tokens, 16);
    let mut m = mapping();
    let held = apply(
        &mut m,
        stored_ev(&[2], Some(1), (32..48).collect(), 16, None),
    );
    assert!(
        held.is_empty(),
        "nothing reported while the parent is unknown"
    );
    assert_eq!(m.pending_blocks(), 1);
    assert_eq!(m.tracked_blocks(), 0);
    let out = apply(
        &mut m,
        stored_ev(&[0, 1], None, (0..32).collect(), 16, None),
    );
    let got: Vec<u64> = reports(&out).iter().map(|r| r.prefix_hash).collect();
    assert_eq!(got, want, "parent blocks first, then the released child");
    assert_eq!(m.pending_blocks(), 0);
    assert_eq!(m.stats().held_back_events, 1);
    assert_eq!(m.stats().resolved_events, 1);
    // a grandchild held on the held child is released transitively
    let mut m = mapping();
    apply(
        &mut m,
        stored_ev(&[2], Some(1), (32..48).collect(), 16, None),
    );
    apply(
        &mut m,
        stored_ev(&[1], Some(0), (16..32).collect(), 16, None),
    );
    let out = apply(&mut m, stored_ev(&[0], None, (0..16).collect(), 16, None));
    let got: Vec<u64> = reports(&out).iter().map(|r| r.prefix_hash).collect();
    assert_eq!(got, want);
}

#[test]
fn unknown_parent_is_dropped_and_counted() {
    let mut m = mapping();
    apply(
        &mut m,
        stored_ev(&[2, 3], Some(1), (32..64).collect(), 16, None),
    );
    assert_eq!(m.drop_pending(), 2);
    assert_eq!(m.stats().dropped_unknown_parent, 2);
    assert_eq!(m.pending_blocks(), 0);
    let out = apply(
        &mut m,
        stored_ev(&[0, 1], None, (0..32).collect(), 16, None),
    );
    assert_eq!(
        reports(&out).len(),
        2,
        "the dropped child does not come back"
    );
    assert_eq!(m.tracked_blocks(), 2);
}

#[test]
fn pending_set_is_bounded() {
    let mut m = Mapping::new(MappingConfig {
        max_pending_blocks: 3,
        ..MappingConfig::default()
    });
    for k in 0..5u64 {
        apply(
            &mut m,
            stored_ev(&[100 + k], Some(k), (0..16).collect(), 16, None),
        );
    }
    assert_eq!(m.pending_blocks(), 3);
    assert_eq!(
        m.stats().dropped_unknown_parent,
        2,
        "oldest held events go first"
    );
    // the oldest (parent 0) was dropped; parent 4's child is still held
    let out = apply(&mut m, stored_ev(&[0], None, (0..16).collect(), 16, None));
    assert_eq!(reports(&out).len(), 1);
    let out = apply(&mut m, stored_ev(&[4], None, (0..16).collect(), 16, None));
    assert_eq!(reports(&out).len(), 2);
    // an event larger than the bound is dropped at once
    apply(
        &mut m,
        stored_ev(&[7, 8, 9, 10], Some(99), (0..64).collect(), 16, None),
    );
    assert_eq!(m.stats().dropped_unknown_parent, 6);
}

/// GPU eviction of a block also held on CPU re-reports it at T2; the CPU
/// removal then evicts it. The whole flow in vLLM 0.33 msgpack.
#[test]
fn gpu_to_cpu_downgrade_reports_t2_instead_of_evicting() {
    let mut m = mapping();
    let stored = run(
        &mut m,
        &vllm_batch(1.0, vec![vllm_stored(&[1, 2], None, 0..32, 16)]),
    );
    let fp: Vec<u64> = reports(&stored).iter().map(|r| r.prefix_hash).collect();
    // offload to CPU: vLLM's offloading connector names the medium
    let mut cpu = vllm_stored(&[1, 2], None, 0..32, 16);
    if let Value::Map(pairs) = &mut cpu {
        for (k, v) in pairs.iter_mut() {
            if k.as_str() == Some("medium") {
                *v = s("CPU");
            }
        }
    }
    let out = run(&mut m, &vllm_batch(2.0, vec![cpu]));
    assert!(
        reports(&out).iter().all(|r| r.tier == Tier::T1),
        "still on the GPU"
    );
    let out = run(&mut m, &vllm_batch(3.0, vec![vllm_removed(&[1, 2], "GPU")]));
    let r = reports(&out);
    assert_eq!(
        r.iter()
            .map(|r| (r.prefix_hash, r.tier))
            .collect::<Vec<_>>(),
        vec![(fp[0], Tier::T2), (fp[1], Tier::T2)]
    );
    assert_eq!(r[1].token_count, 32);
    assert_eq!(m.stats().blocks_downgraded, 2);
    // removing from a medium that never held it changes nothing
    assert!(run(&mut m, &vllm_batch(4.0, vec![vllm_removed(&[1], "GPU")])).is_empty());
    let out = run(&mut m, &vllm_batch(5.0, vec![vllm_removed(&[1, 2], "CPU")]));
    assert_eq!(
        out,
        fp.iter()
            .map(
                |&h| Update::Evict(inferencecache_subscriber::PrefixEviction {
                    prefix_hash: h,
                    token_count: if h == fp[0] { 16 } else { 32 },
                    adapter: "".into(),
                })
            )
            .collect::<Vec<_>>()
    );
    assert_eq!(m.tracked_blocks(), 0);
}

#[test]
fn residency_only_store_without_tokens() {
    let mut m = mapping();
    apply(
        &mut m,
        stored_ev(&[1], None, (0..16).collect(), 16, Some(Medium::Gpu)),
    );
    // SGLang hierarchical cache backs the block up to host memory, no tokens sent
    let out = apply(
        &mut m,
        stored_ev(&[1], None, vec![], 64, Some(Medium::CpuTier1)),
    );
    assert_eq!(reports(&out).len(), 1);
    let out = apply(&mut m, removed_ev(&[1], Some(Medium::Gpu)));
    assert_eq!(reports(&out)[0].tier, Tier::T2);
    assert_eq!(
        reports(&out)[0].prefix_hash,
        prefix_hashes(&(0..16).collect::<Vec<_>>(), 16)[0]
    );
    // an unknown block without tokens cannot be fingerprinted
    let out = apply(&mut m, stored_ev(&[9], None, vec![], 16, Some(Medium::Cpu)));
    assert!(out.is_empty());
    assert_eq!(m.stats().dropped_token_mismatch, 1);
}

/// SGLang's `EXTERNAL` medium (a shared or remote pool) is T3; a block held
/// on the host and in the pool goes T2 → T3 when the host copy goes.
#[test]
fn external_pool_is_t3() {
    assert_eq!(Medium::parse("external"), Medium::External);
    let mut m = mapping();
    let out = apply(
        &mut m,
        stored_ev(&[1], None, (0..16).collect(), 16, Some(Medium::External)),
    );
    assert_eq!(reports(&out)[0].tier, Tier::T3);
    assert_eq!(Tier::T3.as_proto(), 3);
    let mut m = mapping();
    apply(
        &mut m,
        stored_ev(&[1], None, (0..16).collect(), 16, Some(Medium::CpuTier1)),
    );
    apply(
        &mut m,
        stored_ev(&[1], None, vec![], 16, Some(Medium::External)),
    );
    let out = apply(&mut m, removed_ev(&[1], Some(Medium::CpuTier1)));
    assert_eq!(reports(&out)[0].tier, Tier::T3);
    assert_eq!(m.tracked_blocks(), 1);
}

#[test]
fn cold_only_store_is_t2() {
    for medium in [
        Medium::Cpu,
        Medium::CpuTier2,
        Medium::Disk,
        Medium::Other("LMCACHE".into()),
    ] {
        let mut m = mapping();
        let out = apply(
            &mut m,
            stored_ev(&[1], None, (0..16).collect(), 16, Some(medium)),
        );
        assert_eq!(reports(&out)[0].tier, Tier::T2);
    }
}

#[test]
fn removal_without_medium() {
    let fp = prefix_hashes(&(0..16).collect::<Vec<_>>(), 16)[0];
    // default: evict
    let mut m = mapping();
    apply(&mut m, stored_ev(&[1], None, (0..16).collect(), 16, None));
    let out = apply(&mut m, removed_ev(&[1], None));
    assert!(matches!(&out[..], [Update::Evict(e)] if e.prefix_hash == fp));
    // --ignore-block-removed: T2 re-report, then forgotten (reference behaviour)
    let mut m = Mapping::new(MappingConfig {
        ignore_block_removed: true,
        ..MappingConfig::default()
    });
    apply(&mut m, stored_ev(&[1], None, (0..16).collect(), 16, None));
    let out = apply(&mut m, removed_ev(&[1], None));
    assert_eq!(
        out,
        vec![Update::Report(PrefixReport {
            prefix_hash: fp,
            token_count: 16,
            tier: Tier::T2,
            adapter: "".into(),
            block_size: 16,
            no_match_end: false,
        })]
    );
    assert_eq!(m.tracked_blocks(), 0);
    assert!(apply(&mut m, removed_ev(&[1], None)).is_empty());
    assert_eq!(m.stats().removed_unknown, 1);
    // with a medium the flag does not apply
    apply(
        &mut m,
        stored_ev(&[1], None, (0..16).collect(), 16, Some(Medium::Gpu)),
    );
    assert!(matches!(
        &apply(&mut m, removed_ev(&[1], Some(Medium::Gpu)))[..],
        [Update::Evict(_)]
    ));
}

#[test]
fn lora_name_id_and_unmapped() {
    let cfg = MappingConfig {
        lora_adapter_names: inferencecache_subscriber::parse_lora_adapter_names("1=sql-lora")
            .unwrap(),
        ..MappingConfig::default()
    };
    let mut m = Mapping::new(cfg);
    let ev = |hash: u64, id: Option<i64>, name: Option<&str>| {
        EngineEvent::BlockStored(BlockStored {
            block_hashes: vec![EngineHash::Uint(hash)],
            token_ids: (0..16).collect(),
            block_size: 16,
            lora_id: id,
            lora_name: name.map(str::to_owned),
            ..BlockStored::default()
        })
    };
    assert_eq!(
        &*reports(&apply(&mut m, ev(1, Some(5), Some("named"))))[0].adapter,
        "named"
    );
    assert_eq!(
        &*reports(&apply(&mut m, ev(2, Some(1), None)))[0].adapter,
        "sql-lora"
    );
    assert_eq!(&*reports(&apply(&mut m, ev(3, None, None)))[0].adapter, "");
    assert!(
        apply(&mut m, ev(4, Some(2), None)).is_empty(),
        "unmapped id fails closed"
    );
    assert!(apply(&mut m, ev(5, Some(2), None)).is_empty());
    assert_eq!(m.stats().dropped_unmapped_lora, 2);
    assert!(apply(&mut m, removed_ev(&[4], None)).is_empty());
    // the adapter partitions the keyspace but is not hashed in
    let r = reports(&apply(&mut m, ev(6, Some(1), None)))[0].clone();
    assert_eq!(
        r.prefix_hash,
        prefix_hashes(&(0..16).collect::<Vec<_>>(), 16)[0]
    );
    // evictions carry the adapter
    assert!(
        matches!(&apply(&mut m, removed_ev(&[2], None))[..], [Update::Evict(e)] if &*e.adapter == "sql-lora")
    );
}

#[test]
fn bound_forgets_least_recently_stored_and_evicts_it() {
    let mut m = Mapping::new(MappingConfig {
        max_tracked_blocks: 3,
        ..MappingConfig::default()
    });
    let block = |k: u32| (k * 16..k * 16 + 16).collect::<Vec<u32>>();
    for k in 0..3u32 {
        apply(&mut m, stored_ev(&[u64::from(k)], None, block(k), 16, None));
    }
    // re-storing block 0 makes block 1 the least recently stored
    apply(&mut m, stored_ev(&[0], None, block(0), 16, None));
    let out = apply(&mut m, stored_ev(&[3], None, block(3), 16, None));
    assert_eq!(out.len(), 2);
    assert!(
        matches!(&out[1], Update::Evict(e) if e.prefix_hash == prefix_hashes(&block(1), 16)[0])
    );
    assert_eq!(m.tracked_blocks(), 3);
    assert_eq!(m.stats().overflow_evicted, 1);
    // many more: the map never grows past the bound
    for k in 4..1000u32 {
        apply(&mut m, stored_ev(&[u64::from(k)], None, block(k), 16, None));
        assert!(m.tracked_blocks() <= 3);
    }
    assert_eq!(m.stats().overflow_evicted, 997);
}

#[test]
fn all_blocks_cleared() {
    let mut m = mapping();
    apply(&mut m, stored_ev(&[1], None, (0..16).collect(), 16, None));
    apply(
        &mut m,
        stored_ev(&[3], Some(2), (0..16).collect(), 16, None),
    );
    assert_eq!(
        apply(&mut m, EngineEvent::AllBlocksCleared),
        vec![Update::AllCleared]
    );
    assert_eq!((m.tracked_blocks(), m.pending_blocks()), (0, 0));
    assert!(apply(&mut m, removed_ev(&[1], None)).is_empty());
    assert!(
        apply(&mut m, stored_ev(&[2], None, (0..16).collect(), 16, None)).len() == 1,
        "held child was cleared too"
    );
}

/// HMA: the sliding-window group is not reported (it decides whether a
/// match may end at a full-attention block: `tests/hybrid.rs`), and equal
/// hashes in different groups are separate entries.
#[test]
fn kv_cache_groups() {
    let mut m = mapping();
    let ev = |group: i64, kind: &str, window: Option<i64>| {
        EngineEvent::BlockStored(BlockStored {
            block_hashes: vec![EngineHash::Uint(1)],
            token_ids: (0..16).collect(),
            block_size: 16,
            group_idx: Some(group),
            kv_cache_spec_kind: Some(kind.to_owned()),
            kv_cache_spec_sliding_window: window,
            ..BlockStored::default()
        })
    };
    let first = apply(&mut m, ev(0, "full_attention", None));
    assert_eq!(reports(&first).len(), 1);
    // A 16-token window over 16-token blocks needs the end block only:
    // block 1 stays what it was reported as, nothing to re-report.
    assert!(apply(&mut m, ev(1, "sliding_window", Some(16))).is_empty());
    assert_eq!(m.stats().window_blocks, 1);
    let rm = |group| {
        EngineEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![EngineHash::Uint(1)],
            medium: Some(Medium::Gpu),
            group_idx: Some(group),
        })
    };
    // The window block goes: group 0's block stays held, but a match may
    // no longer end there.
    let out = apply(&mut m, rm(1));
    let r = reports(&out);
    assert_eq!(r.len(), 1);
    assert!(r[0].no_match_end, "{r:?}");
    assert_eq!(m.stats().removed_unknown, 0);
    assert_eq!(m.tracked_blocks(), 1);
    assert_eq!(apply(&mut m, rm(0)).len(), 1);
}

/// SGLang end to end: tuple batch, signed hashes, block size 64: the reference's
/// SGLang test (prefix hashes equal `PrefixHashes(tokens, 64)`).
#[test]
fn sglang_end_to_end() {
    let tokens: Vec<u32> = (1000..1256).collect();
    let toks =
        |r: std::ops::Range<usize>| arr(tokens[r].iter().map(|&t| u(u64::from(t))).collect());
    let payload = encode(&arr(vec![
        Value::F64(1.0),
        arr(vec![
            arr(vec![
                s("BlockStored"),
                arr(vec![i(-11), i(22)]),
                nil(),
                toks(0..128),
                u(64),
                nil(),
            ]),
            arr(vec![
                s("BlockStored"),
                arr(vec![i(-33), i(44)]),
                i(22),
                toks(128..256),
                u(64),
                nil(),
                s("GPU"),
            ]),
        ]),
        u(0),
    ]));
    let b = decode_batch_with(
        &payload,
        DecodeOptions {
            tuple_layout: TupleLayout::Sglang,
        },
    );
    let mut m = mapping();
    let mut out = Vec::new();
    m.apply_all(&b.events, &mut out);
    let got: Vec<[u8; 8]> = reports(&out).iter().map(|r| r.prefix_hash_wire()).collect();
    let want: Vec<[u8; 8]> = prefix_hashes(&tokens, 64)
        .into_iter()
        .map(to_wire)
        .collect();
    assert_eq!(got, want);
}

#[test]
fn current_reports_reflect_the_map() {
    let mut m = mapping();
    apply(
        &mut m,
        stored_ev(&[1, 2], None, (0..32).collect(), 16, None),
    );
    apply(
        &mut m,
        stored_ev(&[3], None, (100..116).collect(), 16, Some(Medium::Cpu)),
    );
    let mut got: Vec<(u64, Tier)> = m
        .current_reports()
        .map(|r| (r.prefix_hash, r.tier))
        .collect();
    got.sort_by_key(|g| g.0);
    let mut want: Vec<(u64, Tier)> = prefix_hashes(&(0..32).collect::<Vec<_>>(), 16)
        .into_iter()
        .map(|h| (h, Tier::T1))
        .chain([(
            prefix_hashes(&(100..116).collect::<Vec<_>>(), 16)[0],
            Tier::T2,
        )])
        .collect();
    want.sort_by_key(|g| g.0);
    assert_eq!(got, want);
}

// ---- model-based property test ------------------------------------------------

const CHAINS: u64 = 3;
const BLOCKS: u64 = 6;
const BS: u32 = 4;

fn chain_tokens(c: u64) -> Vec<u32> {
    (0..(BLOCKS as u32 * BS))
        .map(|t| t + 1000 * c as u32)
        .collect()
}

fn engine_hash(c: u64, k: u64) -> u64 {
    // beyond i64 on purpose
    u64::MAX - (c * 100 + k)
}

#[derive(Debug, Clone)]
enum Op {
    Store { c: u64, from: u64, len: u64 },
    Remove { c: u64, k: u64 },
    Clear,
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..CHAINS, 0..BLOCKS, 1..3u64).prop_map(|(c, from, len)| Op::Store { c, from, len: len.min(BLOCKS - from) }),
        3 => (0..CHAINS, 0..BLOCKS).prop_map(|(c, k)| Op::Remove { c, k }),
        1 => Just(Op::Clear),
    ]
}

proptest! {
    /// Against a naive model: reports always carry the true positional
    /// fingerprint of their block (never a fresh-root hash for a suffix), the
    /// tracked and held sets match the model, and evictions name only blocks
    /// that were reported.
    #[test]
    fn mapping_matches_a_naive_model(ops in proptest::collection::vec(arb_op(), 1..60)) {
        let mut truth: HashMap<u64, i32> = HashMap::new();
        for c in 0..CHAINS {
            for (k, h) in prefix_hashes(&chain_tokens(c), BS as usize).into_iter().enumerate() {
                truth.insert(h, (k as i32 + 1) * BS as i32);
            }
        }
        let mut m = mapping();
        // Tracked blocks and their GPU copies: a re-store of a held hash is
        // a second copy, and each removal drops one.
        let mut known: HashMap<(u64, u64), u32> = HashMap::new();
        let store = |known: &mut HashMap<(u64, u64), u32>, c: u64, ks: std::ops::Range<u64>| {
            for k in ks {
                *known.entry((c, k)).or_default() += 1;
            }
        };
        let mut held: Vec<(u64, u64, u64)> = Vec::new();
        let mut reported: HashSet<u64> = HashSet::new();
        for op in ops {
            let mut out = Vec::new();
            match op {
                Op::Store { c, from, len } => {
                    let tokens = chain_tokens(c)[(from * u64::from(BS)) as usize..((from + len) * u64::from(BS)) as usize].to_vec();
                    let hashes: Vec<u64> = (from..from + len).map(|k| engine_hash(c, k)).collect();
                    let parent = (from > 0).then(|| engine_hash(c, from - 1));
                    m.apply(&stored_ev(&hashes, parent, tokens, BS, None), &mut out);
                    if from == 0 || known.contains_key(&(c, from - 1)) {
                        store(&mut known, c, from..from + len);
                        // release held events transitively
                        loop {
                            let before = held.len();
                            let (ready, rest): (Vec<_>, Vec<_>) =
                                held.drain(..).partition(|&(c, f, _)| known.contains_key(&(c, f - 1)));
                            held = rest;
                            for (c, f, l) in ready {
                                store(&mut known, c, f..f + l);
                            }
                            if held.len() == before { break; }
                        }
                    } else {
                        held.push((c, from, len));
                    }
                }
                Op::Remove { c, k } => {
                    m.apply(&removed_ev(&[engine_hash(c, k)], Some(Medium::Gpu)), &mut out);
                    if let Some(n) = known.get_mut(&(c, k)) {
                        *n -= 1;
                        if *n == 0 {
                            known.remove(&(c, k));
                        }
                    }
                }
                Op::Clear => {
                    m.apply(&EngineEvent::AllBlocksCleared, &mut out);
                    known.clear();
                    held.clear();
                }
            }
            for u in &out {
                match u {
                    Update::Report(r) => {
                        prop_assert_eq!(truth.get(&r.prefix_hash), Some(&r.token_count), "report is a true fingerprint");
                        reported.insert(r.prefix_hash);
                    }
                    Update::Evict(e) => prop_assert!(reported.contains(&e.prefix_hash)),
                    Update::AllCleared => {}
                }
            }
            prop_assert_eq!(m.tracked_blocks(), known.len());
            prop_assert_eq!(m.pending_blocks() as u64, held.iter().map(|h| h.2).sum::<u64>());
        }
    }
}

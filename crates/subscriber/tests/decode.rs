//! One test per wire form of `engine-wire-formats.md`, error isolation inside
//! a batch, forward compatibility, and never-panic properties.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use inferencecache_subscriber::{
    BlockRemoved, BlockStored, DecodeError, DecodeOptions, EngineEvent, EngineHash, Medium,
    TupleLayout, decode_batch, decode_batch_with,
};
use proptest::prelude::*;
use rmpv::Value;

const BIG: u64 = 0xF123_4567_89AB_CDEF; // > i64::MAX, as vLLM's default int hashes often are

fn stored(ev: &EngineEvent) -> &BlockStored {
    match ev {
        EngineEvent::BlockStored(s) => s,
        other => panic!("expected BlockStored, got {other:?}"),
    }
}

fn removed(ev: &EngineEvent) -> &BlockRemoved {
    match ev {
        EngineEvent::BlockRemoved(r) => r,
        other => panic!("expected BlockRemoved, got {other:?}"),
    }
}

fn clean(payload: &[u8]) -> inferencecache_subscriber::DecodedBatch {
    let b = decode_batch(payload);
    assert!(b.errors.is_empty(), "unexpected errors: {:?}", b.errors);
    b
}

/// vLLM 0.33 (§5.3): positional batch with rank 0, tagged-map events, u64 hashes beyond i64.
#[test]
fn vllm_033_map_events_in_positional_batch() {
    let payload = vllm_batch(
        1_700_000_000.25,
        vec![
            vllm_stored(&[BIG, 7], Some(u64::MAX), 0..32, 16),
            vllm_removed(&[BIG], "GPU"),
            map(vec![("type", s("AllBlocksCleared"))]),
        ],
    );
    let b = clean(&payload);
    assert_eq!(b.ts, 1_700_000_000.25);
    assert_eq!(b.data_parallel_rank, Some(0));
    assert_eq!(b.events.len(), 3);
    let st = stored(&b.events[0]);
    assert_eq!(
        st.block_hashes,
        vec![EngineHash::Uint(BIG), EngineHash::Uint(7)]
    );
    assert_eq!(st.parent_block_hash, Some(EngineHash::Uint(u64::MAX)));
    assert_eq!(st.token_ids, (0..32).collect::<Vec<u32>>());
    assert_eq!(st.block_size, 16);
    assert_eq!(st.medium, Some(Medium::Gpu));
    assert_eq!((st.lora_id, st.lora_name.as_deref()), (None, None));
    let rm = removed(&b.events[1]);
    assert_eq!(rm.block_hashes, vec![EngineHash::Uint(BIG)]);
    assert_eq!(rm.medium, Some(Medium::Gpu));
    assert_eq!(b.events[2], EngineEvent::AllBlocksCleared);
}

/// vLLM 0.26 (kthena #1535): every newer field set, including HMA and spec fields.
#[test]
fn vllm_026_map_event_with_every_field() {
    let ev = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", hashes_u64(&[1])),
        ("parent_block_hash", nil()),
        ("token_ids", tokens(0..16)),
        ("block_size", u(16)),
        ("lora_id", u(3)),
        ("medium", s("GPU")),
        ("lora_name", s("sql-adapter")),
        ("extra_keys", arr(vec![arr(vec![s("mm-hash"), u(4)])])),
        ("group_idx", u(1)),
        ("kv_cache_spec_kind", s("full_attention")),
        ("kv_cache_spec_sliding_window", nil()),
        ("locality", s("LOCAL")),
        ("ownership", s("OWNED")),
        ("session_id", s("sess-1")),
        ("lookahead_token_ids", tokens(5..7)),
    ]);
    let b = clean(&vllm_batch(2.0, vec![ev]));
    let st = stored(&b.events[0]);
    assert_eq!(st.lora_id, Some(3));
    assert_eq!(st.lora_name.as_deref(), Some("sql-adapter"));
    assert_eq!(
        st.extra_keys,
        Some(vec![Some(Value::Array(vec![s("mm-hash"), u(4)]))])
    );
    assert_eq!(st.group_idx, Some(1));
    assert_eq!(st.kv_cache_spec_kind.as_deref(), Some("full_attention"));
    assert_eq!(st.kv_cache_spec_sliding_window, None);
    assert_eq!(st.locality.as_deref(), Some("LOCAL"));
    assert_eq!(st.ownership.as_deref(), Some("OWNED"));
    assert_eq!(st.session_id.as_deref(), Some("sess-1"));
    assert_eq!(st.lookahead_token_ids, vec![5, 6]);
}

/// `omit_defaults`: a map event with only the required keys.
#[test]
fn map_event_with_omitted_defaults() {
    let ev = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", hashes_u64(&[9])),
        ("token_ids", tokens(0..4)),
        ("block_size", u(4)),
    ]);
    let rm = map(vec![
        ("type", s("BlockRemoved")),
        ("block_hashes", hashes_u64(&[9])),
    ]);
    let b = clean(&vllm_batch(0.0, vec![ev, rm]));
    let st = stored(&b.events[0]);
    assert_eq!(st.parent_block_hash, None);
    assert_eq!(st.medium, None);
    assert_eq!(st.extra_keys, None);
    assert_eq!(removed(&b.events[1]).medium, None);
}

/// Newest vLLM source: `EventBatch` without `array_like` → the batch itself is a map.
#[test]
fn vllm_map_batch() {
    let payload = encode(&map(vec![
        ("ts", Value::F64(3.5)),
        ("events", arr(vec![vllm_stored(&[1], None, 0..16, 16)])),
        ("data_parallel_rank", u(2)),
        ("some_future_batch_field", s("x")),
    ]));
    let b = clean(&payload);
    assert_eq!(b.ts, 3.5);
    assert_eq!(b.data_parallel_rank, Some(2));
    assert_eq!(b.events.len(), 1);
}

/// Older vLLM (`array_like=True`): tagged tuples, positional batch.
#[test]
fn vllm_legacy_tuples() {
    let payload = encode(&arr(vec![
        Value::F64(1.0),
        arr(vec![
            arr(vec![
                s("BlockStored"),
                hashes_u64(&[BIG]),
                nil(),
                tokens(0..16),
                u(16),
                nil(),
                s("GPU"),
            ]),
            arr(vec![s("BlockRemoved"), hashes_u64(&[BIG]), s("CPU")]),
            arr(vec![s("AllBlocksCleared")]),
        ]),
        nil(),
    ]));
    let b = clean(&payload);
    assert_eq!(b.data_parallel_rank, None);
    let st = stored(&b.events[0]);
    assert_eq!(st.block_hashes, vec![EngineHash::Uint(BIG)]);
    assert_eq!(st.medium, Some(Medium::Gpu));
    assert_eq!(removed(&b.events[1]).medium, Some(Medium::Cpu));
    assert_eq!(b.events[2], EngineEvent::AllBlocksCleared);
}

/// The full vLLM positional layout, all twelve positions.
#[test]
fn vllm_full_tuple_positions() {
    let ev = arr(vec![
        s("BlockStored"),
        hashes_u64(&[1, 2]),
        u(77),
        tokens(0..8),
        u(4),
        u(1),
        s("CPU"),
        s("adapter-a"),
        arr(vec![nil(), arr(vec![s("salt")])]),
        u(0),
        s("sliding_window"),
        u(128),
        s("future positional field"),
    ]);
    let rm = arr(vec![s("BlockRemoved"), hashes_u64(&[1]), s("GPU"), u(2)]);
    let b = clean(&encode(&arr(vec![Value::F64(0.0), arr(vec![ev, rm])])));
    let st = stored(&b.events[0]);
    assert_eq!(st.parent_block_hash, Some(EngineHash::Uint(77)));
    assert_eq!(st.lora_id, Some(1));
    assert_eq!(st.medium, Some(Medium::Cpu));
    assert_eq!(st.lora_name.as_deref(), Some("adapter-a"));
    assert_eq!(st.extra_keys.as_ref().map(Vec::len), Some(2));
    assert_eq!(st.extra_keys.as_ref().unwrap()[0], None);
    assert_eq!(st.group_idx, Some(0));
    assert_eq!(st.kv_cache_spec_kind.as_deref(), Some("sliding_window"));
    assert_eq!(st.kv_cache_spec_sliding_window, Some(128));
    assert_eq!(removed(&b.events[1]).group_idx, Some(2));
}

/// The reference's minimum: a 5-element BlockStored tuple (no lora_id) is fine, 4 is not.
#[test]
fn short_tuples() {
    let ok = arr(vec![
        s("BlockStored"),
        hashes_u64(&[1]),
        nil(),
        tokens(0..2),
        u(2),
    ]);
    let short = arr(vec![
        s("BlockStored"),
        hashes_u64(&[1]),
        nil(),
        tokens(0..2),
    ]);
    let rm_short = arr(vec![s("BlockRemoved")]);
    let b = decode_batch(&encode(&arr(vec![u(0), arr(vec![ok, short, rm_short])])));
    assert_eq!(b.events.len(), 1);
    assert_eq!(b.errors.len(), 2);
    assert!(
        matches!(&b.errors[0], DecodeError::Event { index: 1, tag, .. } if tag == "BlockStored")
    );
    assert!(
        matches!(&b.errors[1], DecodeError::Event { index: 2, tag, .. } if tag == "BlockRemoved")
    );
}

/// SGLang (stored version): 3-tuple batch with attn_dp_rank, 6-tuple BlockStored,
/// signed Python `hash()` values, BlockRemoved with only hashes.
#[test]
fn sglang_legacy_tuples_with_signed_hashes() {
    let payload = encode(&arr(vec![
        Value::F64(10.0),
        arr(vec![
            arr(vec![
                s("BlockStored"),
                arr(vec![i(-5), i(42)]),
                i(-9),
                tokens(0..128),
                u(64),
                nil(),
            ]),
            arr(vec![s("BlockRemoved"), arr(vec![i(-5)])]),
            arr(vec![s("AllBlocksCleared")]),
        ]),
        u(3),
    ]));
    let b = clean(&payload);
    assert_eq!(b.data_parallel_rank, Some(3));
    let st = stored(&b.events[0]);
    assert_eq!(
        st.block_hashes,
        vec![EngineHash::Int(-5), EngineHash::Uint(42)]
    );
    assert_eq!(st.parent_block_hash, Some(EngineHash::Int(-9)));
    assert_eq!(st.block_size, 64);
    assert_eq!(
        removed(&b.events[1]).block_hashes,
        vec![EngineHash::Int(-5)]
    );
}

/// SGLang with `medium` (#18205) in tuple form; with the SGLang layout the
/// positions after `medium` are not read as vLLM's `lora_name`.
#[test]
fn sglang_tuple_medium_and_layout() {
    let ev = arr(vec![
        s("BlockStored"),
        arr(vec![i(1)]),
        nil(),
        tokens(0..64),
        u(64),
        nil(),
        s("CPU_TIER1"),
        s("an-sglang-only-field"),
    ]);
    let rm = arr(vec![
        s("BlockRemoved"),
        arr(vec![i(1)]),
        s("CPU_TIER2"),
        s("x"),
    ]);
    let payload = encode(&arr(vec![Value::F64(1.0), arr(vec![ev, rm]), u(0)]));
    let opts = DecodeOptions {
        tuple_layout: TupleLayout::Sglang,
    };
    let b = decode_batch_with(&payload, opts);
    assert!(b.errors.is_empty(), "{:?}", b.errors);
    let st = stored(&b.events[0]);
    assert_eq!(st.medium, Some(Medium::CpuTier1));
    assert_eq!(st.lora_name, None);
    assert_eq!(removed(&b.events[1]).medium, Some(Medium::CpuTier2));
    // Under the vLLM layout position 7 is lora_name (and position 3 of a removal is group_idx,
    // so the string there is an error).
    let v = decode_batch(&payload);
    assert_eq!(
        stored(&v.events[0]).lora_name.as_deref(),
        Some("an-sglang-only-field")
    );
    assert_eq!(v.errors.len(), 1);
}

/// SGLang after #37482: tagged maps with cache_salt / session_id metadata.
#[test]
fn sglang_map_events() {
    let ev = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", arr(vec![i(-1), i(i64::MIN)])),
        ("parent_block_hash", nil()),
        ("token_ids", tokens(0..128)),
        ("block_size", u(64)),
        ("lora_id", nil()),
        ("medium", s("GPU")),
        ("cache_salt", s("tenant-a")),
        ("session_id", s("s-9")),
    ]);
    let payload = encode(&map(vec![
        ("ts", Value::F64(5.0)),
        ("events", arr(vec![ev])),
        ("attn_dp_rank", u(1)),
    ]));
    let b = clean(&payload);
    assert_eq!(b.data_parallel_rank, Some(1));
    let st = stored(&b.events[0]);
    assert_eq!(
        st.block_hashes,
        vec![EngineHash::Int(-1), EngineHash::Int(i64::MIN)]
    );
    assert_eq!(st.cache_salt.as_deref(), Some("tenant-a"));
    assert_eq!(st.session_id.as_deref(), Some("s-9"));
}

/// `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`: 32-byte bin hashes; str hashes as raw bytes.
#[test]
fn bin_and_str_hashes() {
    let h1 = [0xAAu8; 32];
    let h2 = [0x01u8; 32];
    let ev = map(vec![
        ("type", s("BlockStored")),
        ("block_hashes", arr(vec![bin(&h1), s("abc")])),
        ("parent_block_hash", bin(&h2)),
        ("token_ids", tokens(0..32)),
        ("block_size", u(16)),
    ]);
    let b = clean(&vllm_batch(0.0, vec![ev]));
    let st = stored(&b.events[0]);
    assert_eq!(
        st.block_hashes,
        vec![EngineHash::from(&h1[..]), EngineHash::from(&b"abc"[..])]
    );
    assert_eq!(st.parent_block_hash, Some(EngineHash::from(&h2[..])));
}

/// Mediums are parsed case-insensitively; unknown ones kept verbatim.
#[test]
fn medium_names() {
    for (wire, want) in [
        ("GPU", Medium::Gpu),
        ("gpu", Medium::Gpu),
        ("CPU", Medium::Cpu),
        ("CPU_TIER1", Medium::CpuTier1),
        ("CPU_TIER2", Medium::CpuTier2),
        ("disk", Medium::Disk),
        ("LMCACHE", Medium::Other("LMCACHE".into())),
    ] {
        let b = clean(&vllm_batch(0.0, vec![vllm_removed(&[1], wire)]));
        assert_eq!(removed(&b.events[0]).medium, Some(want), "{wire}");
    }
}

/// A bad event is reported with its index; every good event around it survives.
#[test]
fn bad_events_do_not_sink_the_batch() {
    let events = vec![
        vllm_stored(&[1], None, 0..16, 16),
        // nil inside block_hashes
        map(vec![
            ("type", s("BlockStored")),
            ("block_hashes", arr(vec![nil()])),
            ("block_size", u(16)),
        ]),
        vllm_removed(&[1], "GPU"),
        // token id beyond u32
        map(vec![
            ("type", s("BlockStored")),
            ("block_hashes", hashes_u64(&[2])),
            ("token_ids", arr(vec![u(1 << 40)])),
            ("block_size", u(16)),
        ]),
        // lora_id as a string is an error, not "no adapter"
        map(vec![
            ("type", s("BlockStored")),
            ("block_hashes", hashes_u64(&[3])),
            ("token_ids", tokens(0..16)),
            ("block_size", u(16)),
            ("lora_id", s("7")),
        ]),
        // block_size 0
        arr(vec![
            s("BlockStored"),
            hashes_u64(&[4]),
            nil(),
            tokens(0..16),
            u(0),
        ]),
        // missing type
        map(vec![("block_hashes", hashes_u64(&[5]))]),
        u(12),
        // medium of the wrong type
        map(vec![
            ("type", s("BlockRemoved")),
            ("block_hashes", hashes_u64(&[1])),
            ("medium", u(1)),
        ]),
        map(vec![("type", s("AllBlocksCleared"))]),
    ];
    let b = decode_batch(&vllm_batch(1.0, events));
    assert_eq!(b.events.len(), 3);
    assert!(matches!(b.events[0], EngineEvent::BlockStored(_)));
    assert!(matches!(b.events[1], EngineEvent::BlockRemoved(_)));
    assert_eq!(b.events[2], EngineEvent::AllBlocksCleared);
    let idx: Vec<usize> = b
        .errors
        .iter()
        .map(|e| match e {
            DecodeError::Event { index, .. } => *index,
            other => panic!("unexpected {other}"),
        })
        .collect();
    assert_eq!(idx, vec![1, 3, 4, 5, 6, 7, 8]);
    // Messages are readable.
    assert!(
        b.errors[0].to_string().contains("block_hashes"),
        "{}",
        b.errors[0]
    );
}

/// Unknown keys, unknown event tags (tuple or map) and odd informational values are ignored.
#[test]
fn forward_compatibility() {
    let mut st = vllm_stored(&[1], None, 0..16, 16);
    if let Value::Map(pairs) = &mut st {
        pairs.push((s("brand_new_field"), arr(vec![u(1), map(vec![])])));
        pairs.push((u(5), s("non-string key")));
        // an informational field with an unexpected type is dropped, not fatal
        pairs.push((s("locality"), u(1)));
    }
    let events = vec![
        st,
        map(vec![("type", s("KVCacheResized")), ("blocks", u(9))]),
        arr(vec![s("SomethingNew"), u(1)]),
    ];
    let b = clean(&vllm_batch(0.0, events));
    assert_eq!(b.events.len(), 1);
    assert_eq!(b.unknown_events, 2);
    assert_eq!(stored(&b.events[0]).locality, None);
}

#[test]
fn batch_level_errors() {
    for payload in [
        vec![],
        vec![0xc1],                                // never-used marker
        encode(&u(5)),                             // scalar
        encode(&arr(vec![Value::F64(1.0)])),       // no events
        encode(&arr(vec![Value::F64(1.0), u(1)])), // events not an array
        encode(&map(vec![("ts", Value::F64(1.0))])),
    ] {
        let b = decode_batch(&payload);
        assert!(b.events.is_empty());
        assert_eq!(b.errors.len(), 1, "{payload:?}");
        assert!(!matches!(b.errors[0], DecodeError::Event { .. }));
    }
    // nil events: an empty batch, not an error
    let b = decode_batch(&encode(&arr(vec![Value::F64(1.0), nil()])));
    assert!(b.events.is_empty() && b.errors.is_empty());
}

#[test]
fn timestamps() {
    let int_ts = decode_batch(&encode(&arr(vec![u(12), arr(vec![])])));
    assert_eq!(int_ts.ts, 12.0);
    let nil_ts = decode_batch(&encode(&arr(vec![nil(), arr(vec![])])));
    assert_eq!(nil_ts.ts, 0.0);
    let nan_ts = decode_batch(&encode(&arr(vec![Value::F64(f64::NAN), arr(vec![])])));
    assert_eq!(nan_ts.ts, 0.0);
}

/// Deep nesting is refused without blowing the stack.
#[test]
fn deep_nesting_is_an_error() {
    let mut payload = vec![0x91u8; 100_000]; // fixarray(1) × 100k
    payload.push(0xc0);
    let b = decode_batch(&payload);
    assert!(b.events.is_empty());
    assert_eq!(b.errors.len(), 1);
}

/// A huge declared length with no data behind it does not allocate it.
#[test]
fn huge_declared_lengths() {
    let payload = [0xdd, 0xff, 0xff, 0xff, 0xff]; // array32 of 4G elements, no body
    assert_eq!(decode_batch(&payload).errors.len(), 1);
    let payload = [0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdc, 0xff, 0xff]; // events: array16 of 65535, no body
    assert_eq!(decode_batch(&payload).errors.len(), 1);
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::Boolean),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::F64),
        prop_oneof![
            Just("BlockStored"),
            Just("BlockRemoved"),
            Just("AllBlocksCleared"),
            Just("type"),
            Just("block_hashes"),
            Just("parent_block_hash"),
            Just("token_ids"),
            Just("block_size"),
            Just("lora_id"),
            Just("lora_name"),
            Just("medium"),
            Just("group_idx"),
            Just("extra_keys"),
            Just("ts"),
            Just("events"),
            Just("GPU"),
        ]
        .prop_map(Value::from),
        ".{0,8}".prop_map(Value::from),
        proptest::collection::vec(any::<u8>(), 0..40).prop_map(Value::Binary),
        (any::<i8>(), proptest::collection::vec(any::<u8>(), 0..4))
            .prop_map(|(t, d)| Value::Ext(t, d)),
    ];
    leaf.prop_recursive(6, 96, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            proptest::collection::vec((inner.clone(), inner), 0..8).prop_map(Value::Map),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let b = decode_batch(&bytes);
        let _ = decode_batch_with(&bytes, DecodeOptions { tuple_layout: TupleLayout::Sglang });
        prop_assert!(b.events.len() + b.errors.len() <= bytes.len() + 1);
    }

    #[test]
    fn arbitrary_values_never_panic(v in arb_value()) {
        let payload = encode(&v);
        let _ = decode_batch(&payload);
        // also wrapped as a batch and as a single event, to reach the event decoder
        let _ = decode_batch(&encode(&arr(vec![Value::F64(0.0), arr(vec![v.clone()])])));
        let _ = decode_batch(&encode(&arr(vec![Value::F64(0.0), v])));
    }

    #[test]
    fn mutated_valid_payloads_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut payload = vllm_batch(
            1.0,
            vec![vllm_stored(&[BIG, 2], Some(1), 0..32, 16), vllm_removed(&[BIG], "GPU")],
        );
        for (at, byte) in flips {
            let i = at.index(payload.len());
            payload[i] = byte;
        }
        let len = cut.index(payload.len() + 1);
        let _ = decode_batch(&payload[..len]);
    }
}

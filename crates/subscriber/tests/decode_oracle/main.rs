//! The streaming decoder against the tree decoder it replaced (the oracle in
//! `tree.rs`): same events, same errors, same batch fields, for structured
//! event-shaped payloads, mutated real payloads, arbitrary bytes and the
//! nesting limit. Only the text of a "not msgpack" error may differ.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;
mod tree;

use common::*;
use inferencecache_subscriber::{
    DecodeError, DecodeOptions, DecodedBatch, TupleLayout, decode_batch_with,
};
use proptest::prelude::*;
use rmpv::Value;

const LAYOUTS: [DecodeOptions; 2] = [
    DecodeOptions {
        tuple_layout: TupleLayout::Vllm,
    },
    DecodeOptions {
        tuple_layout: TupleLayout::Sglang,
    },
];

/// Debug text with msgpack error messages blanked: NaN-safe equality that
/// still sees every field.
fn canonical(mut b: DecodedBatch) -> String {
    for e in &mut b.errors {
        if let DecodeError::Msgpack(m) = e {
            m.clear();
        }
    }
    format!("{b:?}")
}

fn assert_agree(payload: &[u8]) -> Result<(), TestCaseError> {
    for options in LAYOUTS {
        let streaming = canonical(decode_batch_with(payload, options));
        let oracle = canonical(tree::decode_batch_with(payload, options));
        prop_assert_eq!(streaming, oracle, "payload {:02x?}", payload);
    }
    Ok(())
}

const NAMES: &[&str] = &[
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "cache_salt",
    "lookahead_token_ids",
    "ts",
    "events",
    "data_parallel_rank",
    "attn_dp_rank",
    "unknown_field",
];

const TAGS: &[&str] = &[
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "FutureEvent",
    "GPU",
];

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Nil),
        any::<bool>().prop_map(Value::Boolean),
        (0u64..40).prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-40i64..0).prop_map(Value::from),
        prop_oneof![Just(f64::NAN), Just(1.5), any::<f64>()].prop_map(Value::F64),
        any::<f32>().prop_map(Value::F32),
        prop::sample::select(TAGS).prop_map(Value::from),
        prop::sample::select(&["GPU", "cpu", "CPU_TIER1", "cpu_tier2", "Disk", "nvme", ""][..])
            .prop_map(Value::from),
        prop::collection::vec(any::<u8>(), 0..34).prop_map(Value::Binary),
        (any::<i8>(), prop::collection::vec(any::<u8>(), 0..4)).prop_map(|(t, d)| Value::Ext(t, d)),
    ]
}

/// Field values: mostly what engines send (token and hash arrays, names),
/// sometimes the wrong shape.
fn field_value() -> impl Strategy<Value = Value> {
    let leaf = scalar();
    leaf.prop_recursive(3, 48, 20, |inner| {
        prop_oneof![
            prop::collection::vec((0u64..70_000).prop_map(Value::from), 0..40)
                .prop_map(Value::Array),
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((inner.clone(), inner), 0..4).prop_map(Value::Map),
        ]
    })
}

fn hash_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        (i64::MIN..0).prop_map(Value::from),
        prop::collection::vec(any::<u8>(), 32).prop_map(Value::Binary),
    ]
}

/// A well-formed value for each known field, in declaration order; the
/// edges (block_size 0, negative ids, wide ints) are in range of the
/// strategies on purpose.
fn good_fields() -> impl Strategy<Value = Vec<(&'static str, Value)>> {
    (
        prop::collection::vec(hash_value(), 0..4).prop_map(Value::Array),
        prop_oneof![Just(Value::Nil), hash_value()],
        prop::collection::vec(
            prop_oneof![40 => 0u64..200_000, 1 => 0u64..5_000_000_000].prop_map(Value::from),
            0..40,
        )
        .prop_map(Value::Array),
        prop_oneof![
            (0i64..20).prop_map(Value::from),
            any::<i64>().prop_map(Value::from)
        ],
        prop_oneof![Just(Value::Nil), (-3i64..3).prop_map(Value::from)],
        prop::sample::select(&["GPU", "cpu", "CPU_TIER2", "disk", "x"][..]).prop_map(Value::from),
        prop_oneof![Just(Value::Nil), Just(Value::from("sql-lora"))],
        prop_oneof![
            Just(Value::Nil),
            prop::collection::vec(prop_oneof![Just(Value::Nil), field_value()], 0..3)
                .prop_map(Value::Array)
        ],
        prop_oneof![Just(Value::Nil), (-2i64..3).prop_map(Value::from)],
        prop::sample::select(&["full_attention", "sliding_window", "mamba"][..])
            .prop_map(Value::from),
        prop_oneof![Just(Value::Nil), (0i64..4096).prop_map(Value::from)],
    )
        .prop_map(|(h, p, t, bs, lid, m, ln, ek, g, kind, sw)| {
            vec![
                ("block_hashes", h),
                ("parent_block_hash", p),
                ("token_ids", t),
                ("block_size", bs),
                ("lora_id", lid),
                ("medium", m),
                ("lora_name", ln),
                ("extra_keys", ek),
                ("group_idx", g),
                ("kv_cache_spec_kind", kind),
                ("kv_cache_spec_sliding_window", sw),
            ]
        })
}

/// Events that are valid except for a few fields: where the conversions
/// and their error order are exercised.
fn near_valid_event() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(&["BlockStored", "BlockRemoved", "AllBlocksCleared"][..]),
        good_fields(),
        prop::collection::vec((any::<prop::sample::Index>(), field_value()), 0..3),
        any::<prop::sample::Index>(),
        any::<bool>(),
        0usize..13,
    )
        .prop_map(|(tag, mut fields, spoil, omit, as_map, tuple_len)| {
            for (at, v) in spoil {
                let i = at.index(fields.len());
                fields[i].1 = v;
            }
            if tag == "BlockRemoved" {
                // its tuple positions: block_hashes, medium, group_idx
                fields = vec![fields[0].clone(), fields[5].clone(), fields[8].clone()];
            }
            if as_map {
                let mut pairs = vec![(Value::from("type"), Value::from(tag))];
                let skip = omit.index(fields.len() + 3); // sometimes omit one field
                pairs.extend(
                    fields
                        .into_iter()
                        .enumerate()
                        .filter(|(i, _)| *i != skip)
                        .map(|(_, (k, v))| (Value::from(k), v)),
                );
                Value::Map(pairs)
            } else {
                let mut items = vec![Value::from(tag)];
                items.extend(fields.into_iter().map(|(_, v)| v));
                items.truncate(tuple_len.max(1));
                Value::Array(items)
            }
        })
}

fn key() -> impl Strategy<Value = Value> {
    prop_oneof![
        8 => prop::sample::select(NAMES).prop_map(Value::from),
        1 => scalar(),
    ]
}

fn event() -> impl Strategy<Value = Value> {
    let tag = prop_oneof![4 => prop::sample::select(TAGS).prop_map(Value::from), 1 => scalar()];
    prop_oneof![
        // map form, "type" anywhere (or missing, or twice)
        (
            prop::collection::vec((key(), field_value()), 0..14),
            prop::option::of(tag.clone()),
            any::<prop::sample::Index>(),
        )
            .prop_map(|(mut pairs, tag, at)| {
                if let Some(tag) = tag {
                    let i = at.index(pairs.len() + 1);
                    pairs.insert(i, (Value::from("type"), tag));
                }
                Value::Map(pairs)
            }),
        // tuple form
        (tag, prop::collection::vec(field_value(), 0..13)).prop_map(|(tag, mut fields)| {
            fields.insert(0, tag);
            Value::Array(fields)
        }),
        scalar(),
    ]
}

fn any_event() -> impl Strategy<Value = Value> {
    prop_oneof![event(), near_valid_event()]
}

fn batch() -> impl Strategy<Value = Value> {
    let events = prop_oneof![
        6 => prop::collection::vec(any_event(), 0..6).prop_map(Value::Array),
        1 => scalar(),
    ];
    prop_oneof![
        (
            scalar(),
            events.clone(),
            prop::collection::vec(scalar(), 0..3),
            prop_oneof![1 => 0usize..2, 4 => 2usize..6],
        )
            .prop_map(|(ts, events, rest, keep)| {
                let mut items = vec![ts, events];
                items.extend(rest);
                items.truncate(keep);
                Value::Array(items)
            }),
        prop::collection::vec(
            prop_oneof![
                (
                    prop::sample::select(
                        &["ts", "events", "data_parallel_rank", "attn_dp_rank", "x"][..]
                    ),
                    scalar()
                )
                    .prop_map(|(k, v)| (Value::from(k), v)),
                events.prop_map(|e| (Value::from("events"), e)),
            ],
            0..6
        )
        .prop_map(Value::Map),
        scalar(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn agrees_on_structured_batches(b in batch()) {
        assert_agree(&encode(&b))?;
    }

    #[test]
    fn agrees_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        assert_agree(&bytes)?;
    }

    #[test]
    fn agrees_on_mutated_real_payloads(
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut payload = vllm_batch(
            1.0,
            vec![
                vllm_stored(&[u64::MAX - 3, 2], Some(1), 0..32, 16),
                vllm_removed(&[u64::MAX - 3], "GPU"),
                arr(vec![s("BlockStored"), hashes_u64(&[9]), nil(), tokens(0..16), u(16), nil(), s("GPU")]),
            ],
        );
        for (at, byte) in flips {
            let i = at.index(payload.len());
            payload[i] = byte;
        }
        let len = cut.index(payload.len() + 1);
        assert_agree(&payload[..len])?;
    }
}

/// Around the nesting limit, each kind of leaf is refused at the same depth.
#[test]
fn agrees_at_the_nesting_limit() {
    let leaves: [&[u8]; 6] = [
        &[0xc0],             // nil
        &[0xa1, b'x'],       // str
        &[0xc4, 1, 7],       // bin
        &[0xd4, 1, 7],       // fixext1
        &[0x90],             // empty array
        &[0x81, 0x01, 0x02], // map
    ];
    for depth in 10..20 {
        for leaf in leaves {
            let mut payload = vec![0x91u8; depth];
            payload.extend_from_slice(leaf);
            assert_agree(&payload).unwrap();
            // the same inside a real batch's event
            let mut payload = vec![0x92, 0x01, 0x91, 0x92, 0xab];
            payload.extend_from_slice(b"BlockStored");
            payload.extend(vec![0x91u8; depth]);
            payload.extend_from_slice(leaf);
            assert_agree(&payload).unwrap();
        }
    }
}

/// Wide integers in every width the wire allows decode the same way.
#[test]
fn agrees_on_every_integer_width() {
    for (marker, bytes) in [
        (0xcc, vec![0xff]),
        (0xcd, vec![0xff, 0xff]),
        (0xce, vec![0xff, 0xff, 0xff, 0xff]),
        (0xcf, vec![0xff; 8]),
        (0xd0, vec![0x80]),
        (0xd1, vec![0x00, 0x10]),
        (0xd2, vec![0x80, 0, 0, 0]),
        (0xd3, vec![0, 0, 0, 0, 0, 0, 0, 5]),
    ] {
        let mut int = vec![marker];
        int.extend(&bytes);
        // [1.0, [["BlockStored", [h], h, [h x 16]... ]]] built by hand so the width survives
        let mut p = vec![0x92, 0x01, 0x91, 0x95, 0xab];
        p.extend_from_slice(b"BlockStored");
        p.push(0x91);
        p.extend(&int);
        p.extend(&int);
        p.push(0xdc);
        p.extend([0x00, 0x10]);
        for _ in 0..16 {
            p.extend(&int);
        }
        p.extend(&int);
        assert_agree(&p).unwrap();
    }
}

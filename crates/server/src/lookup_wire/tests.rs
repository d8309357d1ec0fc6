//! The in-place codec against the generated one: same fields from the same
//! bytes (or both refuse them), same bytes for the same answer.

use super::{WireAnswer, WireLookup};
use crate::route::RouteOutcome;
use bytes::Bytes;
use inferencecache_index::{ReplicaId, ReplicaNames, ScoreById, Tier};
use inferencecache_proto::Reason;
use inferencecache_proto::v1alpha1 as pb;
use proptest::prelude::*;
use prost::Message;
use std::sync::Arc;
use std::time::Duration;

fn request() -> impl Strategy<Value = pb::LookupRouteRequest> {
    let text = || prop::string::string_regex("[a-zé/._-]{0,12}").unwrap();
    let hash = prop::collection::vec(any::<u8>(), 0..40).prop_map(Bytes::from);
    (
        (text(), text(), text(), text(), text(), text()),
        prop::collection::vec(any::<u8>(), 0..12),
        any::<i32>(),
        prop::option::of((any::<i32>(), any::<i32>())),
        prop::collection::vec(hash, 0..40),
        prop::collection::vec(any::<i32>(), 0..40),
        prop::collection::vec(any::<u32>(), 0..40),
    )
        .prop_map(
            |(
                (model, tenant, scheme, text, adapter, salt),
                prefix,
                count,
                slo,
                hashes,
                counts,
                ids,
            )| {
                pb::LookupRouteRequest {
                    model_id: model,
                    tenant_id: tenant,
                    prefix_hash: prefix,
                    prefix_token_count: count,
                    hash_scheme: scheme,
                    slo: slo.map(|(ttft_ms, tbt_ms)| pb::Slo { ttft_ms, tbt_ms }),
                    block_hashes: hashes,
                    block_token_counts: counts,
                    token_ids: ids,
                    prompt_text: text,
                    adapter_id: adapter,
                    cache_salt: salt,
                }
            },
        )
}

/// Both decoders on `bytes`: equal messages, or both refuse.
fn agree(bytes: &[u8]) -> Result<(), TestCaseError> {
    let generated = pb::LookupRouteRequest::decode(bytes);
    let ours = WireLookup::decode(Bytes::copy_from_slice(bytes));
    match (generated, ours) {
        (Ok(g), Ok(o)) => prop_assert_eq!(g, o.to_proto()),
        (Err(_), Err(_)) => {}
        (g, o) => prop_assert!(false, "generated {g:?}, ours {o:?} on {bytes:02x?}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn decodes_what_prost_encodes(req in request()) {
        let bytes = req.encode_to_vec();
        let ours = WireLookup::decode(Bytes::from(bytes)).unwrap();
        prop_assert_eq!(ours.to_proto(), req);
    }

    #[test]
    fn agrees_with_prost_on_damaged_messages(
        req in request(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
        extra in prop::collection::vec(any::<u8>(), 0..24),
    ) {
        let mut bytes = req.encode_to_vec();
        agree(&bytes)?;
        // Unknown fields (or garbage) appended.
        let mut longer = bytes.clone();
        longer.extend_from_slice(&extra);
        agree(&longer)?;
        if !bytes.is_empty() {
            agree(&bytes[..cut.index(bytes.len())])?;
            for (at, b) in edits {
                let i = at.index(bytes.len());
                bytes[i] = b;
            }
            agree(&bytes)?;
        }
    }

    #[test]
    fn agrees_with_prost_on_noise(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        agree(&bytes)?;
    }

    #[test]
    fn encodes_what_prost_encodes(
        scores in prop::collection::vec(
            // Names past ~100 bytes take a two-byte score length.
            (
                prop_oneof!["[a-z0-9-]{0,12}", "[a-z0-9-]{100,300}"],
                any::<f32>(),
                any::<i32>(),
                any::<f32>(),
                0..5i32,
            ),
            0..6,
        ),
        reason in prop::sample::select(Reason::ALL.to_vec()),
        latency_us in prop_oneof![Just(0u64), any::<u64>()],
        echo_tokens in prop::collection::vec(any::<u32>(), 0..12),
        echo_adapter in any::<bool>(),
        adapter in "[a-z]{0,6}",
    ) {
        let names = ReplicaNames::listed(scores.iter().map(|s| Arc::from(s.0.as_str())));
        let outcome = RouteOutcome {
            reason,
            scores: scores
                .into_iter()
                .enumerate()
                .map(|(i, (_, score, matched_tokens, prob, tier))| ScoreById {
                    replica: ReplicaId::listed(i as u32),
                    score,
                    matched_tokens,
                    estimated_cache_hit_prob: prob,
                    tier: Tier::from_wire(tier),
                })
                .collect(),
            names,
            echo_tokens,
            echo_adapter,
            latency: Duration::from_micros(latency_us),
        };
        let req = pb::LookupRouteRequest {
            adapter_id: adapter.clone(),
            ..Default::default()
        };
        let want = crate::convert::route_response(outcome.clone(), &req).encode_to_vec();
        let answer = WireAnswer::new(outcome, &adapter);
        let mut got = Vec::new();
        answer.encode(&mut got);
        prop_assert_eq!(answer.encoded_len(), got.len());
        // On the lean route: the same message behind gRPC's prefix.
        let framed = answer.into_framed();
        prop_assert_eq!(&framed[..5], &[&[0u8][..], &(want.len() as u32).to_be_bytes()].concat()[..]);
        prop_assert_eq!(&framed[5..], &want[..]);
        prop_assert_eq!(got, want);
    }
}

#[test]
fn packed_and_unpacked_repeated_fields_read_alike() {
    // block_token_counts = [16, -1] unpacked (tag 8 varint twice), token_ids
    // = [7] packed, then one more unpacked token id.
    let mut bytes = vec![0x40, 16, 0x40];
    bytes.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
    bytes.extend_from_slice(&[0x4a, 1, 7, 0x48, 9]);
    agree(&bytes).unwrap();
    let ours = WireLookup::decode(Bytes::from(bytes)).unwrap().to_proto();
    assert_eq!(ours.block_token_counts, vec![16, -1]);
    assert_eq!(ours.token_ids, vec![7, 9]);
}

#[test]
fn refuses_a_string_that_is_not_utf8() {
    let bytes = [0x0a, 2, 0xc3, 0x28];
    assert!(WireLookup::decode(Bytes::copy_from_slice(&bytes)).is_err());
    agree(&bytes).unwrap();
}

/// A lookup answered by the pipeline over a real index (its names are the
/// index's published table).
fn indexed_outcome(core: &crate::core::Core, req: &pb::LookupRouteRequest) -> RouteOutcome {
    let bytes = req.encode_to_vec();
    let wire = WireLookup::decode(Bytes::from(bytes)).unwrap();
    let hashes = wire.hash_slices();
    core.pipeline
        .route_now(&wire.route_request(&hashes), None)
        .unwrap()
}

fn hold(core: &crate::core::Core, replica: &str, blocks: usize, chain: &[Bytes]) {
    let update = pb::CacheStateUpdate {
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![pb::PrefixEntry {
            block_hashes: chain[..blocks].iter().map(|b| b.to_vec()).collect(),
            block_token_counts: vec![16; blocks],
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(core.ingest(&crate::convert::update_from_proto(update)));
}

/// A real index's answers framed as prost encodes them: names of many
/// lengths (one past a one-byte score length), each answer twice (the
/// second over recycled buffers), and again after a replica joins (a new
/// names table).
#[test]
fn names_kept_encoded_per_table_encode_as_prost() {
    let core = crate::core::Core::with_defaults();
    let chain: Vec<Bytes> = (0..8u64)
        .map(|i| Bytes::copy_from_slice(&(0xB10C_0000 + i).to_be_bytes()))
        .collect();
    let names = [
        "r".to_string(),
        "replica-1".into(),
        "x".repeat(29),
        "y".repeat(30),
        "z".repeat(31),
        "w".repeat(200),
    ];
    for (i, n) in names.iter().enumerate() {
        hold(&core, n, i + 1, &chain);
    }
    let req = pb::LookupRouteRequest {
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        block_hashes: chain.clone(),
        block_token_counts: vec![16; 8],
        ..Default::default()
    };
    let check = |expect_replicas: usize| {
        for _ in 0..2 {
            let outcome = indexed_outcome(&core, &req);
            assert!(
                outcome.scores.len() >= expect_replicas.min(2),
                "{outcome:?}"
            );
            let want = crate::convert::route_response(outcome.clone(), &req).encode_to_vec();
            let framed = WireAnswer::new(outcome, "").into_framed();
            assert_eq!(&framed[5..], &want[..]);
        }
    };
    check(names.len());
    hold(&core, "a-new-replica", 8, &chain);
    check(names.len() + 1);
}

//! The snapshot format: pure round trip, index round trip against a flat
//! model of the state, and refusal of corrupt input.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Env, MIN, PROBE_TENANT, T0};
use inferencecache_index::persist::{
    FORMAT_VERSION, KeyRecord, PersistError, SnapshotData, SnapshotMeta, decode, decode_into,
    decode_meta, encode, encode_index,
};
use inferencecache_index::{
    CacheEvent, CacheUpdate, Clock, EntryState, EventKind, ExportTables, Index, LookupRequest,
    PartitionName, PrefixEntry, ReplicaStatsReport, ReplicaStatsView, StatsState, Tier,
};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::sync::Arc;

fn name() -> impl Strategy<Value = Arc<str>> {
    prop_oneof![
        Just(""),
        Just("a"),
        Just("team.b"),
        Just("ünï"),
        Just("m-7b")
    ]
    .prop_map(Arc::from)
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(0), Just(1), Just(2), Just(3), Just(7), Just(-1)].prop_map(Tier::from_wire)
}

fn data() -> impl Strategy<Value = SnapshotData> {
    let parts = prop::collection::vec(
        (name(), name(), name(), name()).prop_map(|(t, m, s, a)| PartitionName {
            tenant: t,
            model: m,
            hash_scheme: s,
            adapter: a,
        }),
        1..4,
    );
    let replicas = prop::collection::vec(name(), 1..4);
    (
        parts,
        replicas,
        any::<i64>(),
        any::<u64>(),
        ".{0,8}",
        prop::collection::vec(any::<u8>(), 0..16),
    )
        .prop_flat_map(|(partitions, replicas, created, seq, stream, policy)| {
            let (np, nr) = (partitions.len() as u32, replicas.len() as u32);
            let entry = (
                0..nr,
                any::<i32>(),
                tier(),
                any::<i64>(),
                any::<u64>(),
                any::<bool>(),
            )
                .prop_map(
                    |(replica, token_count, tier, last_seen_ns, access_count, no_match_end)| {
                        EntryState {
                            replica,
                            token_count,
                            tier,
                            last_seen_ns,
                            access_count,
                            no_match_end,
                        }
                    },
                );
            let key = (
                0..np,
                prop::collection::vec(any::<u8>(), 0..12),
                prop::collection::vec(entry, 0..4),
            )
                .prop_map(|(partition, hash, entries)| KeyRecord {
                    partition,
                    hash,
                    entries,
                });
            let stats = (
                name(),
                name(),
                name(),
                any::<i64>(),
                any::<f32>(),
                any::<i64>(),
            )
                .prop_map(|(t, m, r, n, f, ts)| StatsState {
                    tenant: t,
                    model: m,
                    stats: ReplicaStatsView {
                        replica_id: r,
                        cache_memory_bytes: n,
                        hit_rate: f,
                        pressure: 0.5,
                        client_version: Arc::from("v1"),
                        t2_hit_tokens: n / 3,
                        t2_query_tokens: -n / 5,
                        // Not persisted: a load report is stale after a restart.
                        load: None,
                        last_seen_ns: ts,
                        stats_reported_ns: ts / 2,
                    },
                });
            (
                prop::collection::vec(key, 0..20),
                prop::collection::vec(stats, 0..4),
            )
                .prop_map(move |(keys, stats)| SnapshotData {
                    meta: SnapshotMeta {
                        created_ns: created,
                        last_sequence: seq,
                        stream: stream.clone(),
                        policy_json: policy.clone(),
                    },
                    tables: ExportTables {
                        partitions: partitions.clone(),
                        replicas: replicas.clone(),
                    },
                    keys,
                    stats,
                })
        })
}

/// Bit-level equality (NaN hit rates compare equal to themselves).
fn same(a: &SnapshotData, b: &SnapshotData) -> bool {
    let stats_eq = a.stats.len() == b.stats.len()
        && a.stats.iter().zip(&b.stats).all(|(x, y)| {
            x.tenant == y.tenant
                && x.model == y.model
                && x.stats.hit_rate.to_bits() == y.stats.hit_rate.to_bits()
                && ReplicaStatsView {
                    hit_rate: 0.0,
                    ..x.stats.clone()
                } == ReplicaStatsView {
                    hit_rate: 0.0,
                    ..y.stats.clone()
                }
        });
    a.meta == b.meta && a.tables == b.tables && a.keys == b.keys && stats_eq
}

proptest! {
    #[test]
    fn pure_round_trip(d in data()) {
        let bytes = encode(&d);
        let back = decode(&bytes).unwrap();
        prop_assert!(same(&d, &back), "{d:?}\n{back:?}");
        prop_assert_eq!(decode_meta(&bytes).unwrap(), d.meta);
    }

    #[test]
    fn any_flipped_byte_is_refused(d in data(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = encode(&d);
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        prop_assert!(decode(&bytes).is_err());
    }

    #[test]
    fn truncation_is_refused(d in data(), at in any::<prop::sample::Index>()) {
        let bytes = encode(&d);
        let n = at.index(bytes.len());
        prop_assert!(decode(&bytes[..n]).is_err());
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode(&bytes);
    }
}

#[test]
fn envelope_errors_are_named() {
    let d = SnapshotData::default();
    let bytes = encode(&d);
    assert_eq!(decode(b"nope"), Err(PersistError::NotASnapshot));
    let mut v = bytes.clone();
    v[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert_eq!(
        decode(&v),
        Err(PersistError::UnsupportedVersion(FORMAT_VERSION + 1))
    );
    let mut v = bytes.clone();
    let last = v.len() - 1;
    v[last] ^= 0xff;
    assert!(matches!(decode(&v), Err(PersistError::Checksum { .. })));
    let mut v = bytes;
    v.push(0);
    assert!(matches!(decode(&v), Err(PersistError::Length { .. })));
}

/// One flat (prefix, replica) row: the model of the index state.
type Row = (
    String,
    String,
    String,
    String,
    Vec<u8>,
    String,
    i32,
    Tier,
    i64,
    u64,
    bool,
);

fn rows(idx: &Index) -> BTreeSet<Row> {
    let mut keys: Vec<(u32, Vec<u8>, Vec<EntryState>)> = Vec::new();
    let t = idx.export_keys(|p, h, e| keys.push((p, h.to_vec(), e.to_vec())));
    let mut out = BTreeSet::new();
    for (p, h, es) in keys {
        let part = &t.partitions[p as usize];
        for e in es {
            out.insert((
                part.tenant.to_string(),
                part.model.to_string(),
                part.hash_scheme.to_string(),
                part.adapter.to_string(),
                h.clone(),
                t.replicas[e.replica as usize].to_string(),
                e.token_count,
                e.tier,
                e.last_seen_ns,
                e.access_count,
                e.no_match_end,
            ));
        }
    }
    out
}

fn update(replica: &str, tenant: &str, hashes: &[u8], tier: i32) -> CacheUpdate {
    update_marked(replica, tenant, hashes, tier, false)
}

/// [`update`] whose chain's last block is (or is not) a valid match end.
fn update_marked(
    replica: &str,
    tenant: &str,
    hashes: &[u8],
    tier: i32,
    no_match_end: bool,
) -> CacheUpdate {
    CacheUpdate {
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: tenant.into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            block_hashes: hashes.iter().map(|b| vec![*b; 8]).collect(),
            block_token_counts: vec![16; hashes.len()],
            tier: Tier::from_wire(tier),
            no_match_end,
            ..PrefixEntry::default()
        }],
        stats: Some(ReplicaStatsReport {
            cache_memory_bytes: 1 << 30,
            hit_rate: 0.5,
            pressure: 0.25,
            client_version: "sidecar/1".into(),
            ..ReplicaStatsReport::default()
        }),
        ..CacheUpdate::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn index_round_trip_keeps_entries_ages_tiers_and_lfu(
        ops in prop::collection::vec((0usize..3, 0usize..2, prop::collection::vec(0u8..20, 1..6), 0i32..4, any::<bool>(), any::<bool>()), 1..30)
    ) {
        let a = Env::new();
        a.pol.set_lfu("t1");
        let replicas = ["r1", "r2", "r3"];
        let tenants = ["t0", "t1"];
        for (r, t, hs, tier, evict, no_end) in &ops {
            a.clock.advance(MIN);
            a.idx.ingest(&update_marked(replicas[*r], tenants[*t], hs, *tier, *no_end));
            if *evict {
                a.idx.apply_event(&CacheEvent {
                    kind: EventKind::PrefixEvicted,
                    replica_id: replicas[*r].into(),
                    model_id: "m".into(),
                    tenant_id: tenants[*t].into(),
                    prefix_hash: vec![hs[0]; 8],
                    timestamp_us: 0,
                    adapter_id: String::new(),
                });
            }
            // Deliver a hint on the LFU tenant so access counts are non-zero.
            let hashes: Vec<Vec<u8>> = hs.iter().map(|b| vec![*b; 8]).collect();
            let counts = vec![16; hs.len()];
            let res = a.idx.lookup_route(&LookupRequest::new("t1", "m", "vllm").chain(&hashes, &counts));
            a.idx.credit(&res.hits);
        }
        // The probe tenant is never persisted.
        a.idx.ingest(&update("r1", PROBE_TENANT, &[1], 1));
        let meta = SnapshotMeta { created_ns: a.clock.now_ns(), last_sequence: 42, stream: "s".into(), policy_json: b"{}".to_vec() };
        let bytes = encode_index(&a.idx, &meta);

        let b = Env::new();
        b.pol.set_lfu("t1");
        b.clock.set_ns(a.clock.now_ns());
        let (m, out) = decode_into(&bytes, &b.idx).unwrap();
        prop_assert_eq!(m, meta);
        let want: BTreeSet<Row> = rows(&a.idx).into_iter().filter(|r| r.0 != PROBE_TENANT).collect();
        prop_assert_eq!(out.entries as usize, want.len());
        prop_assert_eq!(rows(&b.idx), want);
        prop_assert_eq!(a.idx.export_stats(), b.idx.export_stats());
        for t in tenants {
            prop_assert_eq!(b.idx.cache_state(t, "m").total_prefixes, a.idx.cache_state(t, "m").total_prefixes);
            for h in 0u8..20 {
                let hashes = vec![vec![h; 8]];
                let req = LookupRequest::new(t, "m", "vllm").chain(&hashes, &[16]);
                prop_assert_eq!(a.idx.lookup(&req).scores, b.idx.lookup(&req).scores);
            }
        }
    }
}

#[test]
fn import_enforces_the_cap_of_the_importing_index() {
    let a = Env::new();
    for i in 0..10u8 {
        a.clock.advance(MIN);
        a.idx.ingest(&update("r1", "t", &[i], 1));
    }
    let bytes = encode_index(
        &a.idx,
        &SnapshotMeta {
            created_ns: T0,
            ..SnapshotMeta::default()
        },
    );
    let b = Env::with(|c| c.max_entries(4));
    let (_, out) = decode_into(&bytes, &b.idx).unwrap();
    assert_eq!(out.entries, 10);
    assert_eq!(out.evictions.cap_total(), 6);
    assert_eq!(b.idx.total_entries(), 4);
}

/// A hybrid model's index (blocks held where a match may not end) restored
/// from a snapshot answers as before the restart: version 1 lost the marks,
/// and the restored index claimed matches ending where the engine cannot
/// reuse.
#[test]
fn a_restored_hybrid_index_keeps_its_match_ends() {
    let a = Env::new();
    // r1 holds blocks 1..=8; only 2 and 6 are valid ends (the sliding-window
    // blocks before the others are gone).
    let prefixes = (1..=8u64)
        .map(|i| PrefixEntry {
            no_match_end: i != 2 && i != 6,
            ..common::legacy(i, i as i32 * 32)
        })
        .collect();
    a.idx.ingest(&common::upd("t", "m", "vllm", "r1", prefixes));
    let lookup = |idx: &Index, n: u64| {
        let hs: Vec<Vec<u8>> = (1..=n).map(common::h).collect();
        let counts = vec![32; n as usize];
        idx.lookup(&LookupRequest::new("t", "m", "vllm").chain(&hs, &counts))
            .scores
            .iter()
            .map(|s| (s.replica_id.to_string(), s.matched_tokens))
            .collect::<Vec<_>>()
    };
    assert_eq!(lookup(&a.idx, 8), [("r1".to_string(), 192)]);
    let bytes = encode_index(
        &a.idx,
        &SnapshotMeta {
            created_ns: a.clock.now_ns(),
            ..SnapshotMeta::default()
        },
    );
    let marked: usize = decode(&bytes)
        .unwrap()
        .keys
        .iter()
        .flat_map(|k| &k.entries)
        .filter(|e| e.no_match_end)
        .count();
    assert_eq!(marked, 6);
    let b = Env::new();
    b.clock.set_ns(a.clock.now_ns());
    decode_into(&bytes, &b.idx).unwrap();
    for n in 1..=8 {
        assert_eq!(
            lookup(&b.idx, n),
            lookup(&a.idx, n),
            "request of {n} blocks"
        );
    }
    assert_eq!(rows(&b.idx), rows(&a.idx));
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, b: &[u8]) {
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A version 1 file as the format's first writer laid it out (one
/// partition, one replica, one key with one entry: no entry flags), built
/// by hand from the documented layout so the test does not depend on
/// today's encoder.
fn version_1_file(created_ns: i64) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&(created_ns as u64).to_le_bytes());
    body.extend_from_slice(&7u64.to_le_bytes()); // last_sequence
    bytes_field(&mut body, b"stream");
    bytes_field(&mut body, b"");
    varint(&mut body, 1); // partitions
    for s in ["t", "m", "vllm", ""] {
        bytes_field(&mut body, s.as_bytes());
    }
    varint(&mut body, 1); // replicas
    bytes_field(&mut body, b"r1");
    varint(&mut body, 1); // keys
    varint(&mut body, 0); // partition
    bytes_field(&mut body, &common::h(5));
    varint(&mut body, 1); // entries
    varint(&mut body, 0); // replica
    varint(&mut body, 160 << 1); // tokens, zigzag
    varint(&mut body, 1); // tier
    varint(&mut body, 60 << 1); // age, zigzag
    varint(&mut body, 3); // access
    varint(&mut body, 0); // stats
    let mut out = b"ICSNAP\0\x01".to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&body).to_le_bytes());
    out
}

#[test]
fn a_version_1_file_is_still_read_without_marks() {
    assert_eq!(FORMAT_VERSION, 2);
    let bytes = version_1_file(T0);
    let d = decode(&bytes).unwrap();
    assert_eq!(d.meta.last_sequence, 7);
    assert_eq!(
        d.keys,
        [KeyRecord {
            partition: 0,
            hash: common::h(5),
            entries: vec![EntryState {
                replica: 0,
                token_count: 160,
                tier: Tier::from_wire(1),
                last_seen_ns: T0 - 60,
                access_count: 3,
                no_match_end: false,
            }],
        }]
    );
    let b = Env::new();
    let (_, out) = decode_into(&bytes, &b.idx).unwrap();
    assert_eq!(out.entries, 1);
    let r = b
        .idx
        .lookup(&LookupRequest::new("t", "m", "vllm").chain(&[common::h(5)], &[160]));
    assert_eq!(r.scores[0].matched_tokens, 160);
    // Re-encoded, it is a version 2 file with the same content.
    let again = encode(&d);
    assert_eq!(u32::from_le_bytes(again[8..12].try_into().unwrap()), 2);
    assert_eq!(decode(&again).unwrap().keys, d.keys);
}

#[test]
fn unknown_entry_flags_are_refused() {
    let d = SnapshotData {
        tables: ExportTables {
            partitions: vec![PartitionName::default()],
            replicas: vec![Arc::from("r")],
        },
        keys: vec![KeyRecord {
            partition: 0,
            hash: vec![1; 8],
            entries: vec![EntryState {
                replica: 0,
                token_count: 32,
                tier: Tier::from_wire(1),
                last_seen_ns: 0,
                access_count: 0,
                no_match_end: true,
            }],
        }],
        ..SnapshotData::default()
    };
    let mut bytes = encode(&d);
    // The flags varint is the body's last byte before the stats count (0)
    // and the checksum: set an unknown bit and fix the checksum.
    let n = bytes.len();
    let flags_at = n - 8 - 2;
    assert_eq!(bytes[flags_at], 1);
    bytes[flags_at] = 3;
    let body = bytes[24..n - 8].to_vec();
    bytes[n - 8..].copy_from_slice(&xxhash_rust::xxh3::xxh3_64(&body).to_le_bytes());
    assert_eq!(decode(&bytes), Err(PersistError::Malformed("entry flags")));
}

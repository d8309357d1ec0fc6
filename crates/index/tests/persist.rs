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
            let entry = (0..nr, any::<i32>(), tier(), any::<i64>(), any::<u64>()).prop_map(
                |(replica, token_count, tier, last_seen_ns, access_count)| EntryState {
                    replica,
                    token_count,
                    tier,
                    last_seen_ns,
                    access_count,
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
            ));
        }
    }
    out
}

fn update(replica: &str, tenant: &str, hashes: &[u8], tier: i32) -> CacheUpdate {
    CacheUpdate {
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: tenant.into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            block_hashes: hashes.iter().map(|b| vec![*b; 8]).collect(),
            block_token_counts: vec![16; hashes.len()],
            tier: Tier::from_wire(tier),
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
        ops in prop::collection::vec((0usize..3, 0usize..2, prop::collection::vec(0u8..20, 1..6), 0i32..4, any::<bool>()), 1..30)
    ) {
        let a = Env::new();
        a.pol.set_lfu("t1");
        let replicas = ["r1", "r2", "r3"];
        let tenants = ["t0", "t1"];
        for (r, t, hs, tier, evict) in &ops {
            a.clock.advance(MIN);
            a.idx.ingest(&update(replicas[*r], tenants[*t], hs, *tier));
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

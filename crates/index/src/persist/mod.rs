//! The index snapshot: a versioned, checksummed binary image of the index's
//! state, for warm restarts and for replicas joining a bus.
//!
//! Pure encode/decode, no I/O: the server owns files and object stores. Built
//! on the index's export/import boundary ([`Index::export_keys`],
//! [`Index::importer`]), never on its storage.
//!
//! # Layout (version 2, all integers little-endian)
//!
//! ```text
//! magic    8 bytes  "ICSNAP\0\x01"
//! version  u32      2 (1 is still read)
//! flags    u32      0 (reserved; a reader refuses unknown flags)
//! length   u64      body length
//! body     length bytes
//! checksum u64      XXH3-64 of the body
//! ```
//!
//! Body, in order (varint = LEB128, ivarint = zigzag LEB128, str / bytes =
//! varint length + bytes):
//!
//! ```text
//! created_ns      u64 (i64 bits)   wall time of the snapshot
//! last_sequence   u64              last bus stream sequence applied (0 = none)
//! stream          str              bus stream name ("" without a bus)
//! policy_json     bytes            the policy set as /policy JSON ("" = none)
//! partitions      varint n, n × (tenant, model, scheme, adapter) str
//! replicas        varint n, n × str
//! keys            varint n, n × key
//!   key           varint partition, bytes hash, varint m, m × entry
//!   entry         varint replica, ivarint tokens, varint tier,
//!                 ivarint (created_ns − last_seen_ns), varint access,
//!                 varint flags (version 2 only; bit 0 = no_match_end,
//!                 other bits refused)
//! stats           varint n, n × (tenant, model, replica str, ivarint memory,
//!                 f32 hit rate, f32 pressure, client_version str,
//!                 ivarint t2 hit, ivarint t2 query,
//!                 ivarint (created − last_seen), ivarint (created − reported))
//! ```
//!
//! Version 2 added the entry flags: hybrid models' match-end marks
//! (`PrefixEntry::no_match_end`), which version 1 lost, so a restored hybrid
//! index claimed matches ending where the engine cannot reuse until its
//! sidecars resynced. A version 1 file reads as entries without marks.
//!
//! Ages are stored relative to `created_ns` (small varints); the absolute
//! times are restored exactly. A reader checks magic, version, flags, length
//! and checksum before decoding anything, and every count against the bytes
//! left, so a corrupt or hostile file is an error, never a panic or a huge
//! allocation.

mod wire;

use crate::export::{EntryState, ExportTables, ImportOutcome, PartitionName, StatsState};
use crate::index::Index;
use crate::types::{ReplicaStatsView, Tier};
use std::sync::Arc;
use wire::{Reader, put_bytes, put_ivarint, put_varint};

/// File magic.
pub const MAGIC: [u8; 8] = *b"ICSNAP\0\x01";
/// The format version this build writes (it also reads
/// [`OLDEST_READ_VERSION`] onwards).
pub const FORMAT_VERSION: u32 = 2;
/// The oldest format version this build reads.
pub const OLDEST_READ_VERSION: u32 = 1;
/// Entry flag: the holding is not a valid match end (version 2).
const FLAG_NO_MATCH_END: u64 = 1;
const HEADER: usize = 24;

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PersistError {
    /// Not a snapshot (wrong magic or too short for a header).
    #[error("not an index snapshot (bad magic or shorter than the header)")]
    NotASnapshot,
    /// Written by a newer (or unknown) format version.
    #[error(
        "unsupported snapshot format version {0} (this build reads {OLDEST_READ_VERSION} to {FORMAT_VERSION})"
    )]
    UnsupportedVersion(u32),
    /// Unknown flags.
    #[error("unsupported snapshot flags {0:#x}")]
    UnsupportedFlags(u32),
    /// The body length disagrees with the file.
    #[error("snapshot length mismatch: header says {declared} body bytes, file has {actual}")]
    Length {
        /// Declared body length.
        declared: u64,
        /// Bytes available for body + checksum.
        actual: u64,
    },
    /// The checksum does not match (corruption, torn write).
    #[error("snapshot checksum mismatch (stored {stored:#018x}, computed {computed:#018x})")]
    Checksum {
        /// Stored checksum.
        stored: u64,
        /// Computed checksum.
        computed: u64,
    },
    /// The body ended inside a field.
    #[error("snapshot truncated in {0}")]
    Truncated(&'static str),
    /// A field holds an impossible value.
    #[error("snapshot field {0} is malformed")]
    Malformed(&'static str),
}

/// The non-index part of a snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotMeta {
    /// Wall time of the snapshot, Unix ns.
    pub created_ns: i64,
    /// Last bus stream sequence applied (0 = none).
    pub last_sequence: u64,
    /// Bus stream name (`""` without a bus).
    pub stream: String,
    /// The policy set as `/policy` JSON (empty = none).
    pub policy_json: Vec<u8>,
}

/// One key as decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    /// Position in [`SnapshotData::tables`]' partitions.
    pub partition: u32,
    /// Hash bytes.
    pub hash: Vec<u8>,
    /// Entries (replica positions index the tables' replicas).
    pub entries: Vec<EntryState>,
}

/// A whole snapshot, materialized (tests, tools; the server streams into the
/// index with [`decode_into`] instead).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SnapshotData {
    /// Meta.
    pub meta: SnapshotMeta,
    /// Name tables.
    pub tables: ExportTables,
    /// Keys.
    pub keys: Vec<KeyRecord>,
    /// Stats.
    pub stats: Vec<StatsState>,
}

/// Builds a snapshot: tables, keys and stats may be given in any order; the
/// body is assembled by [`Encoder::finish`].
struct Encoder {
    created_ns: i64,
    keys: Vec<u8>,
    key_count: u64,
}

impl Encoder {
    fn new(created_ns: i64) -> Self {
        Self {
            created_ns,
            keys: Vec::new(),
            key_count: 0,
        }
    }

    fn key(&mut self, partition: u32, hash: &[u8], entries: &[EntryState]) {
        let out = &mut self.keys;
        put_varint(out, u64::from(partition));
        put_bytes(out, hash);
        put_varint(out, entries.len() as u64);
        for e in entries {
            put_varint(out, u64::from(e.replica));
            put_ivarint(out, i64::from(e.token_count));
            put_varint(out, u64::from(e.tier.raw().unsigned_abs()));
            put_ivarint(out, self.created_ns.wrapping_sub(e.last_seen_ns));
            put_varint(out, e.access_count);
            put_varint(out, if e.no_match_end { FLAG_NO_MATCH_END } else { 0 });
        }
        self.key_count += 1;
    }

    fn finish(self, meta: &SnapshotMeta, tables: &ExportTables, stats: &[StatsState]) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.keys.len() + 4096);
        body.extend_from_slice(&(self.created_ns as u64).to_le_bytes());
        body.extend_from_slice(&meta.last_sequence.to_le_bytes());
        put_bytes(&mut body, meta.stream.as_bytes());
        put_bytes(&mut body, &meta.policy_json);
        put_varint(&mut body, tables.partitions.len() as u64);
        for p in &tables.partitions {
            for s in [&p.tenant, &p.model, &p.hash_scheme, &p.adapter] {
                put_bytes(&mut body, s.as_bytes());
            }
        }
        put_varint(&mut body, tables.replicas.len() as u64);
        for r in &tables.replicas {
            put_bytes(&mut body, r.as_bytes());
        }
        put_varint(&mut body, self.key_count);
        body.extend_from_slice(&self.keys);
        put_varint(&mut body, stats.len() as u64);
        for s in stats {
            let v = &s.stats;
            put_bytes(&mut body, s.tenant.as_bytes());
            put_bytes(&mut body, s.model.as_bytes());
            put_bytes(&mut body, v.replica_id.as_bytes());
            put_ivarint(&mut body, v.cache_memory_bytes);
            body.extend_from_slice(&v.hit_rate.to_le_bytes());
            body.extend_from_slice(&v.pressure.to_le_bytes());
            put_bytes(&mut body, v.client_version.as_bytes());
            put_ivarint(&mut body, v.t2_hit_tokens);
            put_ivarint(&mut body, v.t2_query_tokens);
            put_ivarint(&mut body, self.created_ns.wrapping_sub(v.last_seen_ns));
            put_ivarint(&mut body, self.created_ns.wrapping_sub(v.stats_reported_ns));
        }
        let mut out = Vec::with_capacity(HEADER + body.len() + 8);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&body).to_le_bytes());
        out
    }
}

/// Encodes a materialized snapshot (in [`FORMAT_VERSION`]).
pub fn encode(data: &SnapshotData) -> Vec<u8> {
    let mut enc = Encoder::new(data.meta.created_ns);
    for k in &data.keys {
        enc.key(k.partition, &k.hash, &k.entries);
    }
    enc.finish(&data.meta, &data.tables, &data.stats)
}

/// Encodes the index's current state (`meta.created_ns` is the reference for
/// stored ages; pass the index clock's now).
pub fn encode_index(index: &Index, meta: &SnapshotMeta) -> Vec<u8> {
    let mut enc = Encoder::new(meta.created_ns);
    let tables = index.export_keys(|p, hash, entries| enc.key(p, hash, entries));
    let stats = index.export_stats();
    enc.finish(meta, &tables, &stats)
}

/// Where decoded items go.
trait Sink {
    fn tables(&mut self, tables: ExportTables);
    fn key(&mut self, partition: u32, hash: &[u8], entries: &[EntryState]);
    fn stats(&mut self, s: StatsState);
}

/// Checks the envelope and returns the format version and the body.
fn body(bytes: &[u8]) -> Result<(u32, &[u8]), PersistError> {
    if bytes.len() < HEADER || bytes[..8] != MAGIC {
        return Err(PersistError::NotASnapshot);
    }
    let mut r = Reader::new(&bytes[8..HEADER]);
    let version = u32::from_le_bytes(r.fixed("version")?);
    if !(OLDEST_READ_VERSION..=FORMAT_VERSION).contains(&version) {
        return Err(PersistError::UnsupportedVersion(version));
    }
    let flags = u32::from_le_bytes(r.fixed("flags")?);
    if flags != 0 {
        return Err(PersistError::UnsupportedFlags(flags));
    }
    let declared = r.u64_le("length")?;
    let actual = (bytes.len() - HEADER) as u64;
    if declared.checked_add(8) != Some(actual) {
        return Err(PersistError::Length { declared, actual });
    }
    let (body, sum) = bytes[HEADER..].split_at(bytes.len() - HEADER - 8);
    let mut sr = Reader::new(sum);
    let stored = sr.u64_le("checksum")?;
    let computed = xxhash_rust::xxh3::xxh3_64(body);
    if stored != computed {
        return Err(PersistError::Checksum { stored, computed });
    }
    Ok((version, body))
}

fn read_meta(r: &mut Reader<'_>) -> Result<SnapshotMeta, PersistError> {
    Ok(SnapshotMeta {
        created_ns: r.u64_le("created_ns")? as i64,
        last_sequence: r.u64_le("last_sequence")?,
        stream: r.str("stream")?.to_owned(),
        policy_json: r.bytes("policy_json")?.to_vec(),
    })
}

fn decode_with(bytes: &[u8], sink: &mut impl Sink) -> Result<SnapshotMeta, PersistError> {
    let (version, body) = body(bytes)?;
    let mut r = Reader::new(body);
    let meta = read_meta(&mut r)?;
    let created = meta.created_ns;
    let flagged = version >= 2;
    let n = r.count(4, "partitions")?;
    let mut partitions = Vec::with_capacity(n);
    for _ in 0..n {
        partitions.push(PartitionName {
            tenant: Arc::from(r.str("partition tenant")?),
            model: Arc::from(r.str("partition model")?),
            hash_scheme: Arc::from(r.str("partition scheme")?),
            adapter: Arc::from(r.str("partition adapter")?),
        });
    }
    let n = r.count(1, "replicas")?;
    let mut replicas = Vec::with_capacity(n);
    for _ in 0..n {
        replicas.push(Arc::from(r.str("replica")?));
    }
    let (np, nr) = (partitions.len(), replicas.len());
    sink.tables(ExportTables {
        partitions,
        replicas,
    });
    let n = r.count(3, "keys")?;
    let mut entries: Vec<EntryState> = Vec::new();
    for _ in 0..n {
        let partition = r.u32v("key partition")?;
        if partition as usize >= np {
            return Err(PersistError::Malformed("key partition"));
        }
        let hash = r.bytes("key hash")?;
        let m = r.count(5, "key entries")?;
        entries.clear();
        for _ in 0..m {
            let replica = r.u32v("entry replica")?;
            if replica as usize >= nr {
                return Err(PersistError::Malformed("entry replica"));
            }
            let token_count = r.i32v("entry tokens")?;
            let tier = i32::try_from(r.varint("entry tier")?)
                .map_err(|_| PersistError::Malformed("entry tier"))?;
            let age = r.ivarint("entry age")?;
            let access_count = r.varint("entry access")?;
            let flags = if flagged { r.varint("entry flags")? } else { 0 };
            if flags & !FLAG_NO_MATCH_END != 0 {
                return Err(PersistError::Malformed("entry flags"));
            }
            entries.push(EntryState {
                replica,
                token_count,
                tier: Tier::from_wire(tier),
                last_seen_ns: created.wrapping_sub(age),
                access_count,
                no_match_end: flags & FLAG_NO_MATCH_END != 0,
            });
        }
        sink.key(partition, hash, &entries);
    }
    let n = r.count(14, "stats")?;
    for _ in 0..n {
        let tenant = Arc::from(r.str("stats tenant")?);
        let model = Arc::from(r.str("stats model")?);
        let replica_id = Arc::from(r.str("stats replica")?);
        let cache_memory_bytes = r.ivarint("stats memory")?;
        let hit_rate = r.f32_le("stats hit rate")?;
        let pressure = r.f32_le("stats pressure")?;
        let client_version = Arc::from(r.str("stats client version")?);
        let t2_hit_tokens = r.ivarint("stats t2 hit")?;
        let t2_query_tokens = r.ivarint("stats t2 query")?;
        let last_seen_ns = created.wrapping_sub(r.ivarint("stats last seen")?);
        let stats_reported_ns = created.wrapping_sub(r.ivarint("stats reported")?);
        sink.stats(StatsState {
            tenant,
            model,
            stats: ReplicaStatsView {
                replica_id,
                cache_memory_bytes,
                hit_rate,
                pressure,
                client_version,
                t2_hit_tokens,
                t2_query_tokens,
                load: None,
                last_seen_ns,
                stats_reported_ns,
            },
        });
    }
    if r.remaining() != 0 {
        return Err(PersistError::Malformed("trailing bytes"));
    }
    Ok(meta)
}

/// Reads only the meta (after checking the envelope and checksum).
pub fn decode_meta(bytes: &[u8]) -> Result<SnapshotMeta, PersistError> {
    read_meta(&mut Reader::new(body(bytes)?.1))
}

/// Decodes a snapshot into memory.
pub fn decode(bytes: &[u8]) -> Result<SnapshotData, PersistError> {
    #[derive(Default)]
    struct Collect(SnapshotData);
    impl Sink for Collect {
        fn tables(&mut self, tables: ExportTables) {
            self.0.tables = tables;
        }
        fn key(&mut self, partition: u32, hash: &[u8], entries: &[EntryState]) {
            self.0.keys.push(KeyRecord {
                partition,
                hash: hash.to_vec(),
                entries: entries.to_vec(),
            });
        }
        fn stats(&mut self, s: StatsState) {
            self.0.stats.push(s);
        }
    }
    let mut c = Collect::default();
    let meta = decode_with(bytes, &mut c)?;
    c.0.meta = meta;
    Ok(c.0)
}

/// Decodes a snapshot straight into `index` (meant for an empty index at
/// start). The whole input is verified (envelope, checksum) before anything
/// is written; a structural error found later leaves what was imported so
/// far, and is returned.
pub fn decode_into(
    bytes: &[u8],
    index: &Index,
) -> Result<(SnapshotMeta, ImportOutcome), PersistError> {
    struct Into<'a>(crate::export::Importer<'a>);
    impl Sink for Into<'_> {
        fn tables(&mut self, t: ExportTables) {
            self.0.tables(&t.partitions, &t.replicas);
        }
        fn key(&mut self, partition: u32, hash: &[u8], entries: &[EntryState]) {
            self.0.key(partition, hash, entries);
        }
        fn stats(&mut self, s: StatsState) {
            self.0.stats(&s);
        }
    }
    let mut sink = Into(index.importer());
    let meta = decode_with(bytes, &mut sink)?;
    Ok((meta, sink.0.finish()))
}

//! Export and import of the index's whole state, for snapshots.
//!
//! This is the index's public persistence boundary: the snapshot format
//! ([`crate::persist`]) is written against it and never reaches into the
//! storage, so the storage can change without touching the format.
//!
//! - [`Index::export_keys`] walks every key (one shard read lock at a time)
//!   and hands the visitor the key's partition *position*, hash bytes and
//!   entries; it returns the name tables the positions index into. Reserved
//!   tenants (the `/probe` tenant) are not exported: their entries are
//!   transient by design.
//! - [`Index::export_stats`] copies the replica stats.
//! - [`Importer`] writes them back: entries keep their `last_seen` (so ages
//!   survive a restart), tokens, tier and LFU count. Import goes through the
//!   same upsert as ingest (counters, cap and quota hooks) but tells no
//!   observer: it runs before anything is served. The cap is enforced once, in
//!   [`Importer::finish`].
//!
//! An export taken while writers run is per-shard consistent, like any scan;
//! replaying the updates after the snapshot's point on top of it converges
//! (upserts and removals are idempotent; the last one per entry wins).

use crate::catalog::Partition;
use crate::counters::Adds;
use crate::index::Index;
use crate::ingest::Writer;
use crate::key::KeyRef;
use crate::observer::Notes;
use crate::stats::StatsEntry;
use crate::sync::read;
use crate::types::{EvictionCounts, IngestOutcome, ReplicaStatsView, Tier};
use std::sync::Arc;

/// A partition's names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PartitionName {
    /// Tenant.
    pub tenant: Arc<str>,
    /// Model.
    pub model: Arc<str>,
    /// Engine hash scheme.
    pub hash_scheme: Arc<str>,
    /// Adapter (`""` = base).
    pub adapter: Arc<str>,
}

/// One (prefix key, replica) entry as exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EntryState {
    /// Position of the replica in [`ExportTables::replicas`].
    pub replica: u32,
    /// Stored token count.
    pub token_count: i32,
    /// Stored tier.
    pub tier: Tier,
    /// Last seen, Unix ns.
    pub last_seen_ns: i64,
    /// LFU access count (delivered hits).
    pub access_count: u64,
    /// A hybrid model's mark: the replica holds this key but a match may not
    /// end at it (`PrefixEntry::no_match_end`, `endpoints.rs`). Only 8-byte
    /// keys carry marks; `false` for every other key and every
    /// full-attention model.
    pub no_match_end: bool,
}

/// The name tables an export's positions refer to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExportTables {
    /// Partitions by position.
    pub partitions: Vec<PartitionName>,
    /// Replica ids by position.
    pub replicas: Vec<Arc<str>>,
}

/// Stats of one replica for one (tenant, model).
#[derive(Debug, Clone, PartialEq)]
pub struct StatsState {
    /// Tenant.
    pub tenant: Arc<str>,
    /// Model.
    pub model: Arc<str>,
    /// The stored stats.
    pub stats: ReplicaStatsView,
}

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImportOutcome {
    /// Keys imported.
    pub keys: u64,
    /// (prefix, replica) entries imported.
    pub entries: u64,
    /// Entries skipped: a position outside the tables, an empty hash, or a
    /// reserved tenant.
    pub skipped: u64,
    /// Stats entries imported.
    pub stats: u64,
    /// Cap and quota evictions when the import overflowed the budget.
    pub evictions: EvictionCounts,
}

impl Index {
    /// Visits every key of a non-reserved tenant as (partition position, hash
    /// bytes, entries) and returns the tables the positions refer to.
    pub fn export_keys(&self, mut visit: impl FnMut(u32, &[u8], &[EntryState])) -> ExportTables {
        let mut entries: Vec<EntryState> = Vec::new();
        let parts = self.partitions();
        let ends = &self.store.entries;
        self.scan_keys(|p, hash, holders| {
            if p.reserved {
                return;
            }
            // The arena hash the marks are kept under (`None`: no mark).
            let block = ends
                .has_end_marks()
                .then(|| ends.arena_block(hash).map(|(_, h)| h))
                .flatten();
            entries.clear();
            entries.extend(holders.iter().map(|h| EntryState {
                replica: h.replica(),
                token_count: h.tokens,
                tier: h.tier(),
                last_seen_ns: h.last_seen,
                access_count: holders.access(h),
                no_match_end: block.is_some_and(|b| ends.end_marked(p.id, b, h.replica())),
            }));
            visit(p.id, hash, &entries);
        });
        // Replica names are taken after the scan: ids interned during it are
        // then covered (names are never freed).
        ExportTables {
            partitions: parts
                .iter()
                .map(|p| PartitionName {
                    tenant: p.tenant.clone(),
                    model: p.model.clone(),
                    hash_scheme: p.scheme.clone(),
                    adapter: p.adapter.clone(),
                })
                .collect(),
            replicas: self.replica_names(),
        }
    }

    /// Every stored replica stats entry of a non-reserved tenant.
    pub fn export_stats(&self) -> Vec<StatsState> {
        let (tms, replicas) = {
            let c = read(&self.store.catalog);
            let tms: Vec<(Arc<str>, Arc<str>, bool)> = c
                .tms
                .iter()
                .map(|t| {
                    let reserved = c
                        .tenant_reserved
                        .get(t.tenant_id as usize)
                        .copied()
                        .unwrap_or(false);
                    (t.tenant.clone(), t.model.clone(), reserved)
                })
                .collect();
            (tms, c.replica_names().to_vec())
        };
        let stats = self.stats.read();
        let mut out = Vec::new();
        for (&tm, by_replica) in stats.iter() {
            let Some((tenant, model, false)) = tms.get(tm as usize) else {
                continue;
            };
            for (&r, s) in by_replica {
                let Some(replica_id) = replicas.get(r as usize) else {
                    continue;
                };
                out.push(StatsState {
                    tenant: tenant.clone(),
                    model: model.clone(),
                    stats: s.view(replica_id.clone()),
                });
            }
        }
        out.sort_by(|a, b| {
            (&a.tenant, &a.model, &a.stats.replica_id).cmp(&(
                &b.tenant,
                &b.model,
                &b.stats.replica_id,
            ))
        });
        out
    }

    /// An importer writing into this index.
    pub fn importer(&self) -> Importer<'_> {
        Importer {
            index: self,
            parts: Vec::new(),
            replicas: Vec::new(),
            out: ImportOutcome::default(),
            scratch: IngestOutcome::default(),
            last: None,
        }
    }
}

/// Writes exported state back into an index (see the module docs).
pub struct Importer<'a> {
    index: &'a Index,
    /// By partition position: the interned partition (`None` = reserved).
    parts: Vec<Option<Arc<Partition>>>,
    /// By replica position: interned id and name (`None` past the replica
    /// limit: its entries and stats are skipped, counted).
    replicas: Vec<Option<(u32, Arc<str>)>>,
    out: ImportOutcome,
    scratch: IngestOutcome,
    /// The last arena block imported, with its partition: the next key
    /// follows it in its run when the export walked one (`Writer::follows`).
    last: Option<(u32, u64)>,
}

impl std::fmt::Debug for Importer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Importer")
            .field("out", &self.out)
            .finish_non_exhaustive()
    }
}

impl Importer<'_> {
    /// Interns the name tables later positions refer to.
    pub fn tables(&mut self, partitions: &[PartitionName], replicas: &[Arc<str>]) {
        let idx = self.index;
        self.parts = partitions
            .iter()
            .map(|p| {
                (!idx.is_reserved(&p.tenant))
                    .then(|| idx.intern_partition(&p.tenant, &p.model, &p.hash_scheme, &p.adapter))
            })
            .collect();
        self.replicas = replicas.iter().map(|r| idx.intern_replica(r)).collect();
    }

    /// Imports one key's entries (positions refer to [`Importer::tables`]).
    pub fn key(&mut self, partition: u32, hash: &[u8], entries: &[EntryState]) {
        let Some(Some(part)) = self.parts.get(partition as usize).cloned() else {
            self.out.skipped += entries.len() as u64;
            return;
        };
        if hash.is_empty() {
            self.out.skipped += entries.len() as u64;
            return;
        }
        let mut notes = Notes::new(false);
        let mut imported = false;
        for e in entries {
            let Some(Some((replica, replica_id))) = self.replicas.get(e.replica as usize) else {
                self.out.skipped += 1;
                continue;
            };
            let w = Writer {
                replica: *replica,
                replica_id,
                ts: e.last_seen_ns,
                access: e.access_count,
                follows: self.last.filter(|(p, _)| *p == part.id).map(|(_, h)| h),
            };
            let mut adds = Adds::default();
            self.index.upsert(
                &part,
                &KeyRef::new(part.id, hash),
                e.token_count,
                e.tier,
                &w,
                &mut adds,
                &mut self.scratch,
                &mut notes,
            );
            self.index.count_adds(&part, *replica, adds);
            // After the holding exists: a mark needs one (`mark_end`).
            if e.no_match_end {
                self.index
                    .store
                    .entries
                    .mark_end(part.id, hash, *replica, true);
            }
            self.out.entries += 1;
            imported = true;
        }
        self.out.keys += u64::from(imported);
        self.last = self
            .index
            .store
            .entries
            .arena_block(hash)
            .map(|(_, h)| (part.id, h));
    }

    /// Imports one replica's stats.
    pub fn stats(&mut self, s: &StatsState) {
        let idx = self.index;
        if idx.is_reserved(&s.tenant) {
            return;
        }
        let Some((replica, _)) = idx.intern_replica(&s.stats.replica_id) else {
            self.out.skipped += 1;
            return;
        };
        let tm = idx.intern_tm(&s.tenant, &s.model);
        let v = &s.stats;
        let entry = StatsEntry {
            cache_memory_bytes: v.cache_memory_bytes,
            hit_rate: v.hit_rate,
            pressure: v.pressure,
            client_version: v.client_version.clone(),
            t2_hit_tokens: v.t2_hit_tokens,
            t2_query_tokens: v.t2_query_tokens,
            load: v.load,
            last_seen: v.last_seen_ns,
            stats_reported: v.stats_reported_ns,
        };
        idx.stats
            .write()
            .entry(tm)
            .or_default()
            .insert(replica, entry);
        self.out.stats += 1;
    }

    /// Enforces the cap once and reports what was imported.
    pub fn finish(mut self) -> ImportOutcome {
        let mut notes = Notes::new(false);
        self.index.enforce_cap(&mut self.out.evictions, &mut notes);
        self.out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use crate::{CacheUpdate, Index, IndexConfig, LookupRequest, ManualClock, PrefixEntry};
    use std::sync::Arc;

    const NOW: i64 = 1_700_000_000_000_000_000;

    fn index() -> Index {
        IndexConfig::new()
            .clock(Arc::new(ManualClock::new(NOW)))
            .build()
    }

    fn store(idx: &Index, replica: &str, chain: &[[u8; 8]]) {
        idx.ingest(&CacheUpdate {
            replica_id: replica.into(),
            model_id: "m".into(),
            tenant_id: "t".into(),
            hash_scheme: "s".into(),
            prefixes: vec![PrefixEntry {
                block_hashes: chain.iter().map(|h| h.to_vec()).collect(),
                block_token_counts: vec![16; chain.len()],
                ..PrefixEntry::default()
            }],
            ..CacheUpdate::default()
        });
    }

    fn lookup(idx: &Index, chain: &[[u8; 8]]) -> Vec<(String, i32)> {
        let counts = vec![16; chain.len()];
        let req = LookupRequest::new("t", "m", "s").chain(chain, &counts);
        let r = idx.lookup(&req);
        r.scores
            .iter()
            .map(|s| (s.replica_id.to_string(), s.matched_tokens))
            .collect()
    }

    /// A chain exported and imported key by key comes back as runs (the
    /// import appends each block to the one before it), not one run per
    /// block, with every holding as it was.
    #[test]
    fn an_imported_chain_is_one_run_again() {
        let a: Vec<[u8; 8]> = (0..40u64).map(|i| (1000 + i).to_le_bytes()).collect();
        let b: Vec<[u8; 8]> = (0..10u64).map(|i| (5000 + i).to_le_bytes()).collect();
        let src = index();
        store(&src, "r0", &a);
        store(&src, "r1", &a[..20]);
        store(&src, "r2", &b);
        let runs = |idx: &Index| Some(idx.store.entries.arena().runs());
        assert_eq!(runs(&src), Some(2));

        let mut keys: Vec<(u32, Vec<u8>, Vec<crate::EntryState>)> = Vec::new();
        let tables = src.export_keys(|p, h, e| keys.push((p, h.to_vec(), e.to_vec())));
        let dst = index();
        let mut imp = dst.importer();
        imp.tables(&tables.partitions, &tables.replicas);
        for (p, h, e) in &keys {
            imp.key(*p, h, e);
        }
        assert_eq!(imp.finish().entries, 70);
        // One run per chain at most (consecutive runs of the export may join).
        assert!(runs(&dst).is_some_and(|n| n <= 2), "runs {:?}", runs(&dst));
        for chain in [&a[..], &a[..25], &b[..], &b[..3]] {
            assert_eq!(lookup(&dst, chain), lookup(&src, chain));
        }
        assert_eq!(lookup(&dst, &a)[0], ("r0".to_string(), 40 * 16));
    }
}

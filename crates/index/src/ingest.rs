//! Ingest (§2.3): additive upserts, stats, quota, cap.

use crate::arena::BlockStored;
use crate::catalog::Partition;
use crate::clock::wire_us_to_ns;
use crate::counters::Adds;
use crate::entries::holder::Holder;
use crate::entries::odd::{OddKeys, Upsert};
use crate::index::Index;
use crate::key::{KeyRef, key_hash};
use crate::observer::{Note, Notes};
use crate::stats::StatsEntry;
use crate::sync::{read, write};
use crate::types::{CacheUpdate, EngineLoad, IngestOutcome, Tier};
use std::cell::RefCell;
use std::sync::Arc;

/// Non-finite → 0.
fn sanitize(v: f32) -> f32 {
    if v.is_finite() { v } else { 0.0 }
}

pub(crate) struct Writer<'a> {
    pub(crate) replica: u32,
    pub(crate) replica_id: &'a Arc<str>,
    pub(crate) ts: i64,
    /// LFU access count to restore (0 from ingest: a refresh keeps the count).
    pub(crate) access: u64,
    /// The arena block the written key follows in its chain, when the
    /// writer knows it (an import: the export walks runs in order), so a
    /// chain restored key by key is one run again (`ChainArena::store_after`).
    pub(crate) follows: Option<u64>,
}

/// A chain's blocks as the arena takes them, reused per thread.
#[derive(Default)]
struct ChainScratch {
    hashes: Vec<u64>,
    tokens: Vec<i32>,
    outcomes: Vec<BlockStored>,
}

thread_local! {
    static CHAIN: RefCell<ChainScratch> = RefCell::new(ChainScratch::default());
}

/// An arena block's outcome as the facade's.
fn blocked(o: BlockStored) -> Upsert {
    match o {
        BlockStored::Refreshed => Upsert::Refreshed,
        BlockStored::Added => Upsert::Added,
        BlockStored::NewKey => Upsert::NewKey,
        BlockStored::Lost => Upsert::Full,
    }
}

/// Keys whose memory a writer loads ahead, per pass (the arena's
/// `prefetch_keys`).
pub(crate) const PREFETCH: usize = 32;

impl Index {
    /// Ingest one `CacheStateUpdate` (§2.3). Never fails: bad input is dropped
    /// and counted in the outcome.
    pub fn ingest(&self, u: &CacheUpdate) -> IngestOutcome {
        let _gate = read(&self.store.gate);
        let mut out = IngestOutcome::default();
        let mut notes = Notes::new(self.env.observer.is_some());
        if self.store_update(u, self.now(), &mut out, &mut notes) {
            self.enforce_budgets([u.tenant_id.as_str()], &mut out.evictions, &mut notes);
        }
        notes.deliver(self.env.observer.as_ref());
        out
    }

    /// Tenant quotas (of `tenants`, in order; policy read now), then the
    /// global cap.
    pub(crate) fn enforce_budgets<'t>(
        &self,
        tenants: impl IntoIterator<Item = &'t str>,
        ev: &mut crate::types::EvictionCounts,
        notes: &mut Notes,
    ) {
        for t in tenants {
            if let Some(q) = self.env.policy.tenant_quota(t) {
                if q >= 0 {
                    self.enforce_quota(t, q as u64, ev, notes);
                }
            }
        }
        self.enforce_cap(ev, notes);
    }

    /// The writes of one update without the budget enforcement (the caller
    /// holds the gate and enforces quotas and the cap afterwards). Adds to
    /// `out`; false when the update was refused whole (replica limit).
    pub(crate) fn store_update(
        &self,
        u: &CacheUpdate,
        now: i64,
        out: &mut IngestOutcome,
        notes: &mut Notes,
    ) -> bool {
        let ts = wire_us_to_ns(u.timestamp_us, now);
        let writes_prefixes = !u.hash_scheme.is_empty() && !u.prefixes.is_empty();
        let interned = if writes_prefixes || u.stats.is_some() {
            match self.intern_replica(&u.replica_id) {
                Some(r) => Some(r),
                None => {
                    out.refused_replica_limit = true;
                    return false;
                }
            }
        } else {
            None
        };

        if u.hash_scheme.is_empty() {
            out.skipped_no_scheme += u.prefixes.len() as u64;
        } else if let Some((replica, replica_id)) = interned.as_ref().filter(|_| writes_prefixes) {
            let (replica, replica_id) = (*replica, replica_id.clone());
            // A replica that reports its cache: tentative holdings there only
            // cover the batching delay (`tentative.rs`).
            self.routing.tentative.mark_publisher(replica);
            let w = Writer {
                replica,
                replica_id: &replica_id,
                ts,
                access: 0,
                follows: None,
            };
            // Partition cache: entries of one update almost always share an adapter.
            let mut cached: Option<Arc<Partition>> = None;
            // Real entries replace tentative holdings (checked once per update).
            let track = self.routing.tentative.active();
            let mut confirmed: Vec<(u32, u64)> = Vec::new();
            for e in &u.prefixes {
                let adapter: &str = if !e.adapter_id.is_empty() {
                    &e.adapter_id
                } else {
                    &u.adapter_id
                };
                let chain = !e.block_hashes.is_empty() || !e.block_token_counts.is_empty();
                if chain && e.block_hashes.len() != e.block_token_counts.len() {
                    out.dropped_mismatched_chain += 1;
                    continue;
                }
                if !chain && e.prefix_hash.is_empty() {
                    out.dropped_empty_hash += 1;
                    continue;
                }
                let part = match &cached {
                    Some(p) if &*p.adapter == adapter => p.clone(),
                    _ => {
                        let p = self.intern_partition(
                            &u.tenant_id,
                            &u.model_id,
                            &u.hash_scheme,
                            adapter,
                        );
                        cached = Some(p.clone());
                        p
                    }
                };
                let tier = e.tier.normalized();
                let mut adds = Adds {
                    block_tokens: e
                        .block_token_counts
                        .iter()
                        .copied()
                        .max()
                        .map_or(0, |n| n.max(0) as u32),
                    ..Adds::default()
                };
                if chain && self.store_chain_in_arena(&part, e, tier, &w, &mut adds, out, notes) {
                    if track {
                        confirmed.extend(
                            e.block_hashes
                                .iter()
                                .map(|h| (part.id, key_hash(part.id, h))),
                        );
                    }
                } else if chain {
                    // A chain with a block that is not 8 bytes: block by block.
                    let mut cumulative: i32 = 0;
                    for (h, c) in e.block_hashes.iter().zip(&e.block_token_counts) {
                        cumulative = cumulative.wrapping_add(*c);
                        if h.is_empty() {
                            out.dropped_empty_hash += 1;
                            continue;
                        }
                        let key = KeyRef::new(part.id, h);
                        if track {
                            confirmed.push((part.id, key.hash));
                        }
                        self.upsert(&part, &key, cumulative, tier, &w, &mut adds, out, notes);
                    }
                }
                // The legacy key: the whole entry in legacy form (its empty
                // hash was dropped above), or co-set beside a chain.
                if !e.prefix_hash.is_empty() {
                    if track {
                        confirmed.push((part.id, key_hash(part.id, &e.prefix_hash)));
                    }
                    self.upsert(
                        &part,
                        &KeyRef::new(part.id, &e.prefix_hash),
                        e.token_count,
                        tier,
                        &w,
                        &mut adds,
                        out,
                        notes,
                    );
                }
                // Hybrid models: whether a match may end here (`endpoints.rs`).
                let ends = [e.block_hashes.last(), Some(&e.prefix_hash)];
                for key in ends.into_iter().flatten().filter(|k| !k.is_empty()) {
                    self.store
                        .entries
                        .mark_end(part.id, key, replica, e.no_match_end);
                }
                self.count_adds(&part, replica, adds);
            }
            out.tentative_confirmed += self.routing.tentative.confirm(replica, &confirmed);
        }

        if let (Some(s), Some((replica, _))) = (&u.stats, &interned) {
            let replica = *replica;
            let tm = self.intern_tm(&u.tenant_id, &u.model_id);
            let entry = StatsEntry {
                cache_memory_bytes: s.cache_memory_bytes,
                hit_rate: sanitize(s.hit_rate),
                pressure: sanitize(s.pressure),
                client_version: Arc::from(s.client_version.as_str()),
                t2_hit_tokens: s.t2_hit_tokens,
                t2_query_tokens: s.t2_query_tokens,
                load: s.load.map(|l| EngineLoad {
                    kv_cache_usage: sanitize(l.kv_cache_usage).clamp(0.0, 1.0),
                    ..l
                }),
                last_seen: ts,
                stats_reported: ts,
            };
            // The tie's held room reads the pool's capacity (`counters.rs`).
            let capacity = entry.load.map_or(0, |l| l.kv_cache_capacity_tokens);
            write(&self.store.counters).set_capacity(replica, capacity, now);
            if capacity > 0 {
                self.store
                    .pools_known
                    .store(true, std::sync::atomic::Ordering::Release);
            }
            if let Some(l) = &entry.load {
                // The ranking's queue restarts from the engine's own counts.
                self.routing
                    .load
                    .report(replica, l.running_requests, l.waiting_requests, ts);
            }
            let mut stats = self.stats.write();
            let m = stats.entry(tm).or_default();
            // The ranking's fleet sets are built from the stats (`cold.rs`):
            // rebuilt when what they read changes, not on every refresh.
            if self.routing.cold.stats_matter(m.get(&replica), &entry, now) {
                crate::cold_sets::fleet_changed();
            }
            m.insert(replica, entry);
            drop(stats);
            out.stats_stored = true;
        }

        true
    }

    /// Apply the counter updates `adds` gathered for `replica`'s upserts
    /// into `part` (after a run of [`Index::upsert`]s).
    pub(crate) fn count_adds(&self, part: &Partition, replica: u32, adds: Adds) {
        if adds.holders > 0 {
            write(&self.store.counters).on_add(part, replica, adds);
        }
    }

    /// A chain entry whose blocks are all 8 bytes stored in the arena with
    /// one call (its blocks stay one run as the chain grows turn by turn);
    /// false, storing nothing, when a block is not 8 bytes (the caller then
    /// upserts block by block).
    #[allow(clippy::too_many_arguments)]
    fn store_chain_in_arena(
        &self,
        part: &Arc<Partition>,
        e: &crate::types::PrefixEntry,
        tier: Tier,
        w: &Writer<'_>,
        adds: &mut Adds,
        out: &mut IngestOutcome,
        notes: &mut Notes,
    ) -> bool {
        let arena = self.store.entries.arena();
        if e.block_hashes.iter().any(|h| h.len() != 8) {
            return false;
        }
        CHAIN.with(|c| {
            let Ok(mut c) = c.try_borrow_mut() else {
                return false;
            };
            let ChainScratch {
                hashes,
                tokens,
                outcomes,
            } = &mut *c;
            hashes.clear();
            tokens.clear();
            let mut cumulative: i32 = 0;
            for (h, n) in e.block_hashes.iter().zip(&e.block_token_counts) {
                cumulative = cumulative.wrapping_add(*n);
                let b: [u8; 8] = h.as_slice().try_into().unwrap_or_default();
                hashes.push(u64::from_le_bytes(b));
                tokens.push(cumulative);
            }
            arena.store_each(part.id, w.replica, hashes, tokens, w.ts, tier, outcomes);
            for ((h, &t), &o) in e
                .block_hashes
                .iter()
                .zip(tokens.iter())
                .zip(outcomes.iter())
            {
                let hash = u64::from_le_bytes(h.as_slice().try_into().unwrap_or_default());
                self.after_upsert(part, h, hash, blocked(o), t, tier, w, adds, out, notes);
            }
            true
        })
    }

    /// The bookkeeping of one arena block's store: counts, the LFU count
    /// to restore, the cap and quota reserves, the observer's note.
    #[allow(clippy::too_many_arguments)]
    fn after_upsert(
        &self,
        part: &Arc<Partition>,
        bytes: &[u8],
        hash: u64,
        done: Upsert,
        tokens: i32,
        tier: Tier,
        w: &Writer<'_>,
        adds: &mut Adds,
        out: &mut IngestOutcome,
        notes: &mut Notes,
    ) {
        let (new_key, added) = match done {
            Upsert::Refreshed => (false, false),
            Upsert::Added => (false, true),
            Upsert::NewKey => (true, true),
            Upsert::Full => {
                out.dropped_shard_full += 1;
                return;
            }
        };
        out.entries_upserted += 1;
        if w.access > 0 {
            self.store
                .entries
                .arena()
                .set_access(part.id, hash, w.replica, w.access);
        }
        self.enforcement
            .cap
            .on_upsert(part, bytes, w.replica, w.replica_id, w.ts);
        if self.enforcement.quota.active() {
            self.store
                .entries
                .holders(&KeyRef::new(part.id, bytes), |hs| {
                    self.enforcement.quota.on_key_changed(part, bytes, hs)
                });
        }
        if added {
            adds.holders += 1;
            adds.keys += u64::from(new_key);
            out.entries_added += 1;
            notes.push(|| {
                let h = Holder::new(w.replica, tokens, tier, w.ts);
                Note::Added(Index::change(part, bytes, w.replica_id.clone(), &h))
            });
        }
    }

    /// Insert or refresh one (key, replica) entry. The counters are not
    /// updated here: new holders are added to `adds`, which the caller
    /// applies with [`Index::count_adds`] after its run of upserts.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn upsert(
        &self,
        part: &Arc<Partition>,
        key: &KeyRef<'_>,
        tokens: i32,
        tier: Tier,
        w: &Writer<'_>,
        adds: &mut Adds,
        out: &mut IngestOutcome,
        notes: &mut Notes,
    ) {
        let hash = key.bytes;
        if let Some((arena, h)) = self.store.entries.arena_block(hash) {
            let done = CHAIN.with(|c| {
                let mut scratch = ChainScratch::default();
                let mut c = c.try_borrow_mut();
                let outcomes = match c.as_mut() {
                    Ok(c) => &mut c.outcomes,
                    Err(_) => &mut scratch.outcomes,
                };
                let (r, ts) = (w.replica, w.ts);
                arena.store_after(key.part, w.follows, r, &[h], &[tokens], ts, tier, outcomes);
                outcomes.first().copied().map_or(Upsert::Full, blocked)
            });
            self.after_upsert(part, hash, h, done, tokens, tier, w, adds, out, notes);
            return;
        }
        let mut shard = self.store.entries.odd.write(OddKeys::shard(key));
        out.entries_upserted += 1;
        let h = Holder::new(w.replica, tokens, tier, w.ts);
        let (new_key, added) = match shard.upsert(key, h, w.access) {
            Upsert::Refreshed => (false, false),
            Upsert::Added => (false, true),
            Upsert::NewKey => (true, true),
            Upsert::Full => {
                out.entries_upserted -= 1;
                out.dropped_shard_full += 1;
                return;
            }
        };
        self.enforcement
            .cap
            .on_upsert(part, hash, w.replica, w.replica_id, w.ts);
        if self.enforcement.quota.active() {
            if let Some(hs) = shard.get(key) {
                self.enforcement.quota.on_key_changed(part, hash, hs);
            }
        }
        if added {
            adds.holders += 1;
            adds.keys += u64::from(new_key);
            out.entries_added += 1;
            drop(shard);
            notes.push(|| {
                let h = Holder::new(w.replica, tokens, tier, w.ts);
                Note::Added(Index::change(part, hash, w.replica_id.clone(), &h))
            });
        }
    }
}

//! The inference-cache prefix index: pure, synchronous, policy-unaware.
//!
//! Engines report which prompt prefixes (opaque hashes) each replica holds;
//! gateways ask for a ranked routing hint. This crate is the in-memory,
//! soft-state index behind both (server spec §2). It never sees protobuf
//! types: the server converts wire messages into [`CacheUpdate`],
//! [`CacheEvent`] and [`LookupRequest`].
//!
//! # Model
//!
//! - A **prefix key** is (tenant, model, hash_scheme, adapter, hash bytes).
//!   Each key has holders: one entry per replica with its token count,
//!   last-seen time, tier and LFU access counter.
//! - The **serving scope** (tenant, model, hash_scheme) is adapter-blind: it
//!   counts, per replica, how many keys the replica holds. It drives the
//!   distinguishing power, TENANT_HOT's "serves the engine domain" test, the
//!   miss classifier and the affinity picker.
//! - **Stats** live per (tenant, model, replica), independent of scheme and
//!   adapter.
//!
//! Two units are used and never mixed:
//! - **entries** = (prefix key, replica) pairs: the global cap
//!   ([`IndexConfig::max_entries`], default 1,000,000, `<= 0` unbounded; enforced
//!   at the end of every ingest and by every [`Index::sweep`]), cap/TTL
//!   eviction counters, snapshot `prefixCount`;
//! - **distinct prefixes** = prefix keys: tenant quotas, aggregates,
//!   `GetCacheState.total_prefixes`, the per-model gauge
//!   ([`Index::entry_counts_by_model`]).
//!
//! Ingest is additive: absence from a later update never removes anything.
//! Removal happens only through events, the TTL sweep, the cap and quotas.
//! Policy (TTL, eviction algorithm, quota) reaches the index through a
//! [`PolicyResolver`], except on lookups whose caller has already read the
//! tenant's policy: a [`LookupRequest::policy`] ([`LookupPolicy`]: TTL,
//! TENANT_HOT) is used as given and the lookup makes no resolver call. Time
//! reaches it only through a [`Clock`] (Unix nanoseconds).
//!
//! Writes come one at a time ([`Index::ingest`], [`Index::apply_event`]) or
//! as a batch ([`Index::apply_batch`]: stores and events in order, the quotas
//! and the cap enforced once at the end; see the `batch` module).
//!
//! Deliberate choices (spec decisions and open points):
//! - a legacy entry with an empty `prefix_hash`, and an empty block hash inside
//!   a chain, are dropped (counted in [`IngestOutcome::dropped_empty_hash`]);
//!   the chain's cumulative count still includes the dropped block;
//! - [`Index::lookup_route`] returns `None` for a request with no fingerprint
//!   input at all (no prefix hash, no chain);
//! - exact-path entries with `token_count <= 0` are returned with score 0
//!   (also for negative counts);
//! - `hot_prefixes` = distinct prefix keys whose holders' LFU access counts
//!   (delivered hits) sum to at least [`HOT_PREFIX_MIN_HITS`] (1). Hits are
//!   captured for every tenant (LRU ones too); only LFU tenants' cap
//!   eviction reads the counters;
//! - the observer is told about new entries (not refreshes), removals with a
//!   reason, `ALL_CLEARED` and `REPLICA_UPDATED`.
//!
//! # Rankings
//!
//! Two rankings share the storage:
//! - the **contract** ranking ([`Index::lookup_route`], [`Index::affinity_hint`]):
//!   the reference's formulas bit for bit (§2.6);
//! - the **estimated-TTFT** ranking ([`Index::route_ttft`], the server's
//!   default): every live replica scored by `queued + overhead + per-token ×
//!   uncached tokens (tier-weighted) + pressure cost`, ties by the seed
//!   (XXH3, the affinity rule's shape); delivered hints are reported back with
//!   [`Index::record_delivery`], which feeds the per-replica queue estimate
//!   (the delivered-hint window) and approximate mode's tentative holdings.
//!   A lookup estimates the matched and busy replicas one by one and takes
//!   the rest from a kept fleet set ordered by pressure, KV room and name
//!   (`cold` module): its cost follows the matches, not the fleet.
//!   See the `routing`, `cold`, `load` and `tentative` modules. Policy values
//!   come in as [`RouteParams`] per lookup.
//!
//! # Example
//!
//! ```
//! use inferencecache_index::*;
//!
//! // A reserved tenant's entries stay out of counts, snapshots and quotas
//! // (the server reserves its self-test tenant this way).
//! let idx = IndexConfig::new().reserved_tenants(["probe"]).build();
//! let hashes = vec![vec![1u8; 8], vec![2u8; 8]];
//! idx.ingest(&CacheUpdate {
//!     replica_id: "r1".into(),
//!     model_id: "llama".into(),
//!     tenant_id: "team-a".into(),
//!     hash_scheme: "vllm".into(),
//!     prefixes: vec![PrefixEntry {
//!         block_hashes: hashes.clone(),
//!         block_token_counts: vec![16, 16],
//!         ..PrefixEntry::default()
//!     }],
//!     ..CacheUpdate::default()
//! });
//! let counts = [16, 16];
//! let req = LookupRequest::new("team-a", "llama", "vllm").chain(&hashes, &counts);
//! let res = idx.lookup_route(&req);
//! assert_eq!(res.strategy, Strategy::PrefixMatch);
//! assert_eq!(res.scores[0].matched_tokens, 32);
//! idx.credit(&res.hits); // only when the handler delivers the hint
//! ```
//!
//! # Concurrency
//!
//! `Index` is `Send + Sync`; lookups run concurrently with ingest, events and
//! sweeps. There is no global lock:
//! - entries live behind one facade (the `entries` module) that routes a key
//!   by its length: 8-byte keys (chain blocks, every engine's) go to the
//!   chain-run arena (the `arena` module: 256 shards, each a block-table
//!   lock and a runs lock; a stored chain's blocks are one contiguous run
//!   and a replica's holding of a stretch one span, so a chain lookup
//!   probes once per run; its own docs state its lock order), every other
//!   length to a small sharded map (`entries/odd.rs`). Keys are (partition
//!   id, hash bytes) with partition = interned (tenant, model, scheme,
//!   adapter); a key's 64-bit hash is computed once. Holders come out
//!   sorted by interned replica id, so a chain of odd keys merge-joins runs
//!   against each block (`chain.rs`);
//! - a writer holds one store lock at a time for one key or one run, so
//!   each (key, replica) entry is always seen whole (never torn);
//! - counters (entries, distinct keys per tenant / (tenant, model) / model,
//!   serving scope replica counts) sit behind one small `RwLock` (lock
//!   order: entry store → counters, never the reverse); each
//!   scope's serving-replica count is mirrored into an atomic shared by its
//!   partitions, which lookups read without the lock. Stats have their own
//!   `RwLock`, names their own interning catalog;
//! - the TTL sweep walks the stores shard by shard, taking each write lock
//!   once, then enforces the cap;
//! - cap and quota victims follow the exact deterministic orders of §2.5.2
//!   and §2.5.3 without a full scan per over-budget ingest: one scan (shard
//!   by shard, read locks only) gathers a reserve of the smallest candidates
//!   (`max(need, 4096, entries / 32)`), and hooks on every upsert / partial
//!   removal keep the reserve exact until it runs dry (one generic reserve
//!   shared by both, the `reserve` module, states the invariant). The scans
//!   amortize to a constant per evicted entry; victims leave the reserve in
//!   ordered chunks (a sorted run consumed from its end, not a heap pop per
//!   victim), one reserve lock per chunk. Enforcement is serialized by its
//!   own mutex, never taken by lookups;
//! - LFU counts are bumped under a store read lock by [`Index::credit`]
//!   (the arena's per run, one edit per run and replica under the run
//!   shard's tally lock; an odd key's beside its holders);
//! - observer notifications are delivered after every lock is released.
//!
//! Interned names (partitions, replicas) are never freed; their number is
//! bounded by the deployment's tenants × models × schemes × adapters and
//! replicas.
//!
//! Known costs: [`Index::cache_state`] (its `hot_prefixes`), [`Index::snapshot`]
//! and `ALL_CLEARED` walk the shards (read / write locks one shard at a time).
//!
//! # Memory
//!
//! In the arena, a block is 8 bytes of hash in its run plus a 12-byte bucket
//! of its shard's block table (the bucket is the entry: tag, run, offset;
//! load at most 4/5), and a replica's holding of a stretch of a
//! run is one 24-byte span, whatever the stretch's length (LFU counts as
//! 16-byte counted stretches per credited run and replica). An odd key costs a map entry and
//! two small vectors (holders of 16 bytes, LFU counts of 4); no engine
//! sends such keys, so that store is built to be plainly right, not small.
//! See BENCHMARKS.md for the measured resident bytes per entry.

mod affinity;
mod aggregate;
// Public only for the benches that measure the arena on its own (feature
// `bench`); its internals are no part of the crate's API.
#[cfg(feature = "bench")]
#[doc(hidden)]
pub mod arena;
#[cfg(not(feature = "bench"))]
#[allow(unreachable_pub, dead_code, unused_imports)]
mod arena;
mod batch;
mod cap;
mod catalog;
mod chain;
mod classify;
mod clock;
mod cold;
mod cold_sets;
mod config;
mod counters;
mod endpoints;
mod entries;
mod events;
mod eviction;
mod export;
mod fleet;
mod hashing;
mod index;
mod ingest;
mod key;
mod load;
mod lookup;
mod name_order;
mod observer;
pub mod persist;
mod policy;
mod pools;
mod quota;
mod ranking;
mod remote_load;
mod replica_table;
mod replicas;
mod reserve;
mod routing;
#[cfg(test)]
mod routing_scan;
mod score_pool;
mod scratch;
mod snapshot;
mod spread_sort;
mod stats;
mod sync;
mod tentative;
mod types;

pub use affinity::{affinity_index, affinity_seed_value, chain_seed};
pub use aggregate::HOT_PREFIX_MIN_HITS;
pub use batch::{BatchOutcome, BatchWrite};
pub use clock::{Clock, ManualClock, SystemClock, duration_ns, wire_us_to_ns};
pub use config::{
    DEFAULT_CAP_RESERVE, DEFAULT_MAX_ENTRIES, DEFAULT_MAX_REPLICAS, DEFAULT_SWEEP_INTERVAL,
    DEFAULT_TTL, IndexConfig, RankingConfig,
};
pub use export::{EntryState, ExportTables, ImportOutcome, Importer, PartitionName, StatsState};
pub use index::Index;
pub use observer::{IndexObserver, PrefixChange, RemovalReason};
pub use policy::{EvictionAlgorithm, NoPolicy, PolicyResolver};
pub use ranking::{
    distinguishing_power, freshness, prefix_score, pressure_factor, recency, slo_coefficient,
};
pub use remote_load::MAX_REMOTE_HINTS;
pub use routing::{
    Delivery, DeliveryOutcome, Estimate, RankingMode, RouteParams, TtftRoute, TtftWeights,
};
pub use score_pool::recycle_scores;
pub use types::{
    Aggregate, CacheEvent, CacheState, CacheUpdate, EngineLoad, EventKind, EventOutcome,
    EvictionCounts, IngestOutcome, LfuHits, LookupPolicy, LookupRequest, LookupRouteResult,
    PrefixEntry, RankedScore, ReplicaId, ReplicaNames, ReplicaScore, ReplicaStatsReport,
    ReplicaStatsView, ScoreById, Snapshot, SnapshotReplica, SnapshotTenant, Strategy, SweepOutcome,
    Tier,
};

#[cfg(test)]
mod send_sync {
    fn assert_send_sync<T: Send + Sync>() {}
    #[test]
    fn index_is_send_and_sync() {
        assert_send_sync::<crate::Index>();
    }
}

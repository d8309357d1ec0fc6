//! The `Index` struct and shared helpers.

use crate::catalog::{Catalog, Partition};
use crate::clock::{Clock, duration_ns};
use crate::config::{DEFAULT_TTL, IndexConfig, RankingConfig};
use crate::counters::Counters;
use crate::entries::Held;
use crate::entries::holder::Holder;
use crate::observer::{IndexObserver, PrefixChange};
use crate::policy::{EvictionAlgorithm, PolicyResolver};
use crate::stats::Stats;
use crate::sync::{read, write};
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// Limits and defaults fixed at construction.
pub(crate) struct Settings {
    pub(crate) max_entries: i64,
    pub(crate) max_replicas: usize,
    pub(crate) cap_reserve: usize,
    pub(crate) default_ttl_ns: i64,
    pub(crate) reserved: HashSet<String>,
    pub(crate) ranking: RankingConfig,
    /// Unique per index in the process: keys the per-thread partition cache.
    pub(crate) uid: u64,
}

/// Source of [`Settings::uid`].
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The partition this thread last resolved (lookups and ingest alike),
    /// with its index's uid. Partitions are never freed or renamed, so a hit is exact; it
    /// saves a lookup the catalog's read lock (a shared line every lookup
    /// thread writes) and hashing four strings (~95 ns of the median
    /// lookup's ~720 ns in `benches/lookup.rs`).
    static LAST_PARTITION: RefCell<Option<(u64, Arc<Partition>)>> = const { RefCell::new(None) };
}

/// What the index is wired to: time, policy, the change observer.
pub(crate) struct Env {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) policy: Arc<dyn PolicyResolver>,
    pub(crate) observer: Option<Arc<dyn IndexObserver>>,
}

/// The entries and what names and counts them.
pub(crate) struct Store {
    /// Interned names: partitions, (tenant, model), scopes, replicas.
    pub(crate) catalog: RwLock<Catalog>,
    /// The catalog's [`crate::replica_table`] epoch, read without its lock.
    pub(crate) table_epoch: crate::replica_table::Epoch,
    /// The (key, holders) stores (`entries/`).
    pub(crate) entries: crate::entries::Entries,
    /// Entry and key counts, serving scopes (lock order: shard → counters).
    pub(crate) counters: RwLock<Counters>,
    /// Set once any replica reported its KV pool's capacity (never
    /// cleared): until then a delivery skips the counters' lock, as no
    /// pool can take its intake (`routing.rs`).
    pub(crate) pools_known: std::sync::atomic::AtomicBool,
    /// Model ids reported non-zero by the last `entry_counts_by_model`.
    pub(crate) gauge: Mutex<Vec<bool>>,
    /// Held shared by every ingest and event for its whole run, exclusively
    /// by the replica release (`replicas.rs`), so a replica id resolved by a
    /// writer is never released under it.
    pub(crate) gate: RwLock<()>,
}

/// Cap and quota enforcement: the victim reserves (`reserve.rs`).
pub(crate) struct Enforcement {
    /// Serializes cap and quota enforcement (victim selection + removal).
    pub(crate) evict_lock: Mutex<()>,
    /// Cap victim reserve.
    pub(crate) cap: crate::cap::CapReserve,
    /// Tenant quota victim reserves.
    pub(crate) quota: crate::quota::QuotaReserves,
}

/// Estimated-TTFT ranking state.
pub(crate) struct Routing {
    /// Delivered-hint window.
    pub(crate) load: crate::load::LoadTracker,
    /// Tentative holdings (approximate mode).
    pub(crate) tentative: crate::tentative::Tentative,
    /// The live fleets, ordered for the pick (`cold.rs`).
    pub(crate) cold: crate::cold_sets::ColdSets,
}

/// The prefix index. `Send + Sync`; share it behind an `Arc`.
pub struct Index {
    pub(crate) settings: Settings,
    pub(crate) env: Env,
    pub(crate) store: Store,
    /// Replica stats: (tenant, model) → replica → stats.
    pub(crate) stats: Stats,
    pub(crate) enforcement: Enforcement,
    pub(crate) routing: Routing,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index")
            .field("max_entries", &self.settings.max_entries)
            .field("total_entries", &self.total_entries())
            .field("distinct_prefixes", &self.distinct_prefixes())
            .finish_non_exhaustive()
    }
}

impl Default for Index {
    fn default() -> Self {
        Self::new(IndexConfig::default())
    }
}

impl Index {
    /// Build an index from its configuration.
    pub fn new(cfg: IndexConfig) -> Self {
        let catalog = Catalog::default();
        let ttl = if cfg.default_ttl.is_zero() {
            DEFAULT_TTL
        } else {
            cfg.default_ttl
        };
        Self {
            settings: Settings {
                max_entries: cfg.max_entries,
                max_replicas: cfg.max_replicas,
                cap_reserve: cfg.cap_reserve.max(1),
                default_ttl_ns: duration_ns(ttl),
                reserved: cfg.reserved_tenants.into_iter().collect(),
                ranking: cfg.ranking,
                uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            },
            env: Env {
                clock: cfg.clock,
                policy: cfg.policy,
                observer: cfg.observer,
            },
            store: Store {
                table_epoch: catalog.table_epoch(),
                catalog: RwLock::new(catalog),
                entries: crate::entries::Entries::new(),
                counters: RwLock::new(Counters::default()),
                pools_known: std::sync::atomic::AtomicBool::new(false),
                gauge: Mutex::new(Vec::new()),
                gate: RwLock::new(()),
            },
            stats: Stats::default(),
            enforcement: Enforcement {
                evict_lock: Mutex::new(()),
                cap: crate::cap::CapReserve::new(),
                quota: crate::quota::QuotaReserves::new(),
            },
            routing: Routing {
                load: crate::load::LoadTracker::default(),
                // As many tentative holdings as real entries at most.
                tentative: crate::tentative::Tentative::new(if cfg.max_entries > 0 {
                    usize::try_from(cfg.max_entries).unwrap_or(usize::MAX)
                } else {
                    crate::config::DEFAULT_MAX_ENTRIES as usize
                }),
                cold: crate::cold_sets::ColdSets::default(),
            },
        }
    }

    /// Shorthand for [`IndexConfig::new`].
    pub fn builder() -> IndexConfig {
        IndexConfig::new()
    }

    /// The configured global cap (`<= 0` = unbounded).
    pub fn max_entries(&self) -> i64 {
        self.settings.max_entries
    }

    /// The default TTL in nanoseconds.
    pub fn default_ttl_ns(&self) -> i64 {
        self.settings.default_ttl_ns
    }

    /// Resolved TTL of a tenant in nanoseconds (policy value if > 0, else default).
    pub fn tenant_ttl_ns(&self, tenant: &str) -> i64 {
        match self.env.policy.ttl(tenant) {
            Some(d) if !d.is_zero() => duration_ns(d),
            _ => self.settings.default_ttl_ns,
        }
    }

    /// The TTL a lookup uses: the request's resolved policy if it carries
    /// one (no resolver call), else the resolver's.
    pub(crate) fn request_ttl_ns<H>(&self, req: &crate::types::LookupRequest<'_, H>) -> i64 {
        match req.policy {
            Some(p) => match p.ttl {
                Some(d) if !d.is_zero() => duration_ns(d),
                _ => self.settings.default_ttl_ns,
            },
            None => self.tenant_ttl_ns(req.tenant),
        }
    }

    pub(crate) fn algorithm(&self, tenant: &str) -> EvictionAlgorithm {
        self.env.policy.eviction_algorithm(tenant)
    }

    /// Whether `tenant` is reserved.
    pub fn is_reserved(&self, tenant: &str) -> bool {
        self.settings.reserved.contains(tenant)
    }

    /// Number of (prefix, replica) entries, including reserved tenants.
    pub fn total_entries(&self) -> u64 {
        read(&self.store.counters).total_entries
    }

    /// Number of distinct prefix keys, including reserved tenants.
    pub fn distinct_prefixes(&self) -> u64 {
        read(&self.store.counters).total_keys
    }

    pub(crate) fn find_partition(
        &self,
        t: &str,
        m: &str,
        s: &str,
        a: &str,
    ) -> Option<Arc<Partition>> {
        self.with_partition(t, m, s, a, Arc::clone)
    }

    /// Runs `f` on the partition of (t, m, s, a), `None` when it does not
    /// exist. The partition comes from the thread's cache when it is the one
    /// the thread resolved last (no lock, no reference count: a lookup's
    /// usual case), else from the catalog, which then becomes the cached one.
    pub(crate) fn with_partition<T>(
        &self,
        t: &str,
        m: &str,
        s: &str,
        a: &str,
        f: impl FnOnce(&Arc<Partition>) -> T,
    ) -> Option<T> {
        let uid = self.settings.uid;
        // `Err(f)` hands `f` back when the cached partition is not this one.
        let cached = LAST_PARTITION.with(|c| match c.try_borrow() {
            Ok(c) => match c.as_ref() {
                Some((owner, p))
                    if *owner == uid
                        && *p.tenant == *t
                        && *p.model == *m
                        && *p.scheme == *s
                        && *p.adapter == *a =>
                {
                    Ok(f(p))
                }
                _ => Err(f),
            },
            Err(_) => Err(f),
        });
        let f = match cached {
            Ok(out) => return Some(out),
            Err(f) => f,
        };
        let found = read(&self.store.catalog)
            .find_partition(t, m, s, a)
            .cloned()?;
        LAST_PARTITION.with(|c| {
            if let Ok(mut c) = c.try_borrow_mut() {
                *c = Some((uid, found.clone()));
            }
        });
        Some(f(&found))
    }

    /// Runs `f` on the replica names and labels, without the catalog's
    /// lock while the thread's published table is current
    /// ([`crate::replica_table`]).
    #[inline]
    pub(crate) fn with_names<T>(&self, f: impl FnOnce(crate::replica_table::Names<'_>) -> T) -> T {
        crate::replica_table::with_names(
            self.settings.uid,
            &self.store.table_epoch,
            &self.store.catalog,
            f,
        )
    }

    pub(crate) fn intern_partition(&self, t: &str, m: &str, s: &str, a: &str) -> Arc<Partition> {
        if let Some(p) = self.find_partition(t, m, s, a) {
            return p;
        }
        let reserved = |x: &str| self.settings.reserved.contains(x);
        write(&self.store.catalog).intern_partition(t, m, s, a, &reserved)
    }

    /// Interns a replica id; `None` past the replica limit.
    pub(crate) fn intern_replica(&self, r: &str) -> Option<(u32, Arc<str>)> {
        {
            let c = read(&self.store.catalog);
            if let Some(id) = c.find_replica(r) {
                return Some((id, c.replica_name(id)));
            }
        }
        write(&self.store.catalog).intern_replica(r, self.settings.max_replicas)
    }

    pub(crate) fn intern_tm(&self, t: &str, m: &str) -> u32 {
        if let Some(id) = read(&self.store.catalog).find_tm(t, m) {
            return id;
        }
        let reserved = |x: &str| self.settings.reserved.contains(x);
        write(&self.store.catalog).intern_tm(t, m, &reserved)
    }

    /// Snapshot of partitions (for scans that must not nest the catalog lock).
    pub(crate) fn partitions(&self) -> Vec<Arc<Partition>> {
        read(&self.store.catalog).parts.clone()
    }

    /// Visits every key with its partition, hash and holders, one shard read
    /// lock at a time (writers wait for at most one shard's walk). Keys whose
    /// partition is not in the snapshot taken at the start are skipped.
    pub(crate) fn scan_keys(&self, visit: impl FnMut(&Arc<Partition>, &[u8], &Held<'_>)) {
        self.scan_keys_where(|_, _| true, visit);
    }

    /// [`Index::scan_keys`] that may skip the arena holdings `span_ok(partition,
    /// last_seen)` turns away (a span at a time; odd keys are all
    /// visited, so `visit` still filters what it needs).
    pub(crate) fn scan_keys_where(
        &self,
        mut span_ok: impl FnMut(&Partition, i64) -> bool,
        mut visit: impl FnMut(&Arc<Partition>, &[u8], &Held<'_>),
    ) {
        let parts = self.partitions();
        self.store.entries.scan_where(
            |pid, last_seen| {
                parts
                    .get(pid as usize)
                    .is_some_and(|p| span_ok(p, last_seen))
            },
            |pid, hash, holders| {
                if let Some(p) = parts.get(pid as usize) {
                    visit(p, hash, holders);
                }
            },
        );
    }

    pub(crate) fn replica_names(&self) -> Vec<Arc<str>> {
        read(&self.store.catalog).replica_names().to_vec()
    }

    /// Per tenant id: (ttl ns, algorithm), resolved once for a scan.
    pub(crate) fn tenant_policies(&self) -> Vec<(i64, EvictionAlgorithm)> {
        let names: Vec<Arc<str>> = {
            let c = read(&self.store.catalog);
            (0..c.tenant_count() as u32)
                .map(|i| c.tenant_name(i))
                .collect()
        };
        names
            .iter()
            .map(|t| (self.tenant_ttl_ns(t), self.algorithm(t)))
            .collect()
    }

    pub(crate) fn change(
        p: &Partition,
        hash: &[u8],
        replica_id: Arc<str>,
        h: &Holder,
    ) -> PrefixChange {
        PrefixChange {
            tenant: p.tenant.clone(),
            model: p.model.clone(),
            hash_scheme: p.scheme.clone(),
            adapter: p.adapter.clone(),
            prefix_hash: Arc::from(hash),
            replica_id,
            token_count: h.tokens,
            tier: h.tier(),
            last_seen_ns: h.last_seen,
        }
    }

    pub(crate) fn now(&self) -> i64 {
        self.env.clock.now_ns()
    }
}

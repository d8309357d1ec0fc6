//! Shared test helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use inferencecache_index::*;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// The server's self-test tenant (`inferencecache_control_api::PROBE_TENANT`),
/// which the tests reserve as the server does.
pub(crate) const PROBE_TENANT: &str = "inferencecache.io/probe";

/// Base time: 2023-11-14T22:13:20Z in ns.
pub(crate) const T0: i64 = 1_700_000_000_000_000_000;
pub(crate) const MIN: Duration = Duration::from_secs(60);

#[derive(Default)]
pub(crate) struct Pol {
    pub ttl: RwLock<HashMap<String, Duration>>,
    pub algo: RwLock<HashMap<String, EvictionAlgorithm>>,
    pub quota: RwLock<HashMap<String, i64>>,
}

impl Pol {
    pub(crate) fn set_ttl(&self, t: &str, d: Duration) {
        self.ttl.write().unwrap().insert(t.into(), d);
    }
    pub(crate) fn set_lfu(&self, t: &str) {
        self.algo
            .write()
            .unwrap()
            .insert(t.into(), EvictionAlgorithm::Lfu);
    }
    pub(crate) fn set_lru(&self, t: &str) {
        self.algo
            .write()
            .unwrap()
            .insert(t.into(), EvictionAlgorithm::Lru);
    }
    pub(crate) fn set_quota(&self, t: &str, q: i64) {
        self.quota.write().unwrap().insert(t.into(), q);
    }
}

impl PolicyResolver for Pol {
    fn ttl(&self, tenant: &str) -> Option<Duration> {
        self.ttl.read().unwrap().get(tenant).copied()
    }
    fn eviction_algorithm(&self, tenant: &str) -> EvictionAlgorithm {
        self.algo
            .read()
            .unwrap()
            .get(tenant)
            .copied()
            .unwrap_or_default()
    }
    fn tenant_quota(&self, tenant: &str) -> Option<i64> {
        self.quota.read().unwrap().get(tenant).copied()
    }
}

pub(crate) struct Env {
    pub idx: Index,
    pub clock: Arc<ManualClock>,
    pub pol: Arc<Pol>,
}

impl Env {
    pub(crate) fn new() -> Env {
        Env::with(|c| c)
    }

    pub(crate) fn with(f: impl FnOnce(IndexConfig) -> IndexConfig) -> Env {
        let clock = Arc::new(ManualClock::new(T0));
        let pol = Arc::new(Pol::default());
        let cfg = IndexConfig::new()
            .clock(clock.clone())
            .policy(pol.clone())
            .reserved_tenants([PROBE_TENANT]);
        Env {
            idx: f(cfg).build(),
            clock,
            pol,
        }
    }

    pub(crate) fn advance(&self, d: Duration) {
        self.clock.advance(d);
    }

    pub(crate) fn now_us(&self) -> i64 {
        self.clock.now_ns() / 1000
    }

    /// Legacy entries, one per (hash, tokens), timestamp = now.
    pub(crate) fn put(
        &self,
        tenant: &str,
        model: &str,
        scheme: &str,
        replica: &str,
        entries: &[(u64, i32)],
    ) -> IngestOutcome {
        let u = upd(
            tenant,
            model,
            scheme,
            replica,
            entries.iter().map(|&(h, t)| legacy(h, t)).collect(),
        );
        self.idx.ingest(&u)
    }

    /// One chain entry.
    pub(crate) fn put_chain(
        &self,
        tenant: &str,
        model: &str,
        scheme: &str,
        replica: &str,
        hashes: &[u64],
        counts: &[i32],
    ) -> IngestOutcome {
        let u = upd(tenant, model, scheme, replica, vec![chain(hashes, counts)]);
        self.idx.ingest(&u)
    }

    pub(crate) fn stats(
        &self,
        tenant: &str,
        model: &str,
        replica: &str,
        hit_rate: f32,
        pressure: f32,
    ) {
        let mut u = upd(tenant, model, "", replica, vec![]);
        u.stats = Some(ReplicaStatsReport {
            hit_rate,
            pressure,
            ..Default::default()
        });
        self.idx.ingest(&u);
    }

    pub(crate) fn exact(
        &self,
        tenant: &str,
        model: &str,
        scheme: &str,
        hash: u64,
    ) -> LookupRouteResult {
        let hb = h(hash);
        self.idx
            .lookup_route(&LookupRequest::<Vec<u8>>::new(tenant, model, scheme).exact(&hb, 0))
    }

    pub(crate) fn chain(
        &self,
        tenant: &str,
        model: &str,
        scheme: &str,
        hashes: &[u64],
        counts: &[i32],
    ) -> LookupRouteResult {
        let hs: Vec<Vec<u8>> = hashes.iter().map(|&x| h(x)).collect();
        self.idx
            .lookup_route(&LookupRequest::new(tenant, model, scheme).chain(&hs, counts))
    }

    pub(crate) fn event(
        &self,
        kind: EventKind,
        tenant: &str,
        model: &str,
        replica: &str,
        hash: Option<u64>,
        adapter: &str,
    ) -> EventOutcome {
        self.idx.apply_event(&CacheEvent {
            kind,
            replica_id: replica.into(),
            model_id: model.into(),
            tenant_id: tenant.into(),
            prefix_hash: hash.map(h).unwrap_or_default(),
            timestamp_us: 0,
            adapter_id: adapter.into(),
        })
    }
}

pub(crate) fn h(n: u64) -> Vec<u8> {
    n.to_be_bytes().to_vec()
}

pub(crate) fn upd(
    tenant: &str,
    model: &str,
    scheme: &str,
    replica: &str,
    prefixes: Vec<PrefixEntry>,
) -> CacheUpdate {
    CacheUpdate {
        replica_id: replica.into(),
        model_id: model.into(),
        tenant_id: tenant.into(),
        hash_scheme: scheme.into(),
        timestamp_us: 0,
        prefixes,
        stats: None,
        adapter_id: String::new(),
    }
}

pub(crate) fn legacy(hash: u64, tokens: i32) -> PrefixEntry {
    PrefixEntry {
        prefix_hash: h(hash),
        token_count: tokens,
        ..Default::default()
    }
}

pub(crate) fn chain(hashes: &[u64], counts: &[i32]) -> PrefixEntry {
    PrefixEntry {
        block_hashes: hashes.iter().map(|&x| h(x)).collect(),
        block_token_counts: counts.to_vec(),
        ..Default::default()
    }
}

pub(crate) fn ids(r: &LookupRouteResult) -> Vec<String> {
    r.scores.iter().map(|s| s.replica_id.to_string()).collect()
}

pub(crate) fn score_of(r: &LookupRouteResult, replica: &str) -> f32 {
    r.scores
        .iter()
        .find(|s| &*s.replica_id == replica)
        .map(|s| s.score)
        .unwrap()
}

pub(crate) fn approx(a: f32, b: f32) -> bool {
    (a - b).abs() <= 1e-4 * b.abs().max(1.0)
}

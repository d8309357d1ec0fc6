//! A lookup that carries the tenant's resolved policy (`LookupRequest::policy`)
//! answers exactly as one that asks the resolver, without asking it.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Wraps the test policy and counts TTL reads.
#[derive(Default)]
struct Counting {
    inner: Pol,
    ttl_reads: AtomicU64,
}

impl PolicyResolver for Counting {
    fn ttl(&self, tenant: &str) -> Option<Duration> {
        self.ttl_reads.fetch_add(1, Ordering::SeqCst);
        self.inner.ttl(tenant)
    }
    fn eviction_algorithm(&self, tenant: &str) -> EvictionAlgorithm {
        self.inner.eviction_algorithm(tenant)
    }
    fn tenant_quota(&self, tenant: &str) -> Option<i64> {
        self.inner.tenant_quota(tenant)
    }
}

fn index(pol: Arc<Counting>) -> (Index, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let idx = IndexConfig::new().clock(clock.clone()).policy(pol).build();
    (idx, clock)
}

fn store(idx: &Index, replica: &str, hashes: &[u64], hit_rate: f32) {
    idx.ingest(&CacheUpdate {
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            block_hashes: hashes.iter().map(|&x| h(x)).collect(),
            block_token_counts: vec![16; hashes.len()],
            ..PrefixEntry::default()
        }],
        stats: Some(ReplicaStatsReport {
            hit_rate,
            ..ReplicaStatsReport::default()
        }),
        ..CacheUpdate::default()
    });
}

#[test]
fn a_passed_policy_answers_as_the_resolver_without_calling_it() {
    let pol = Arc::new(Counting::default());
    pol.inner.set_ttl("t", Duration::from_secs(600));
    let (idx, clock) = index(pol.clone());
    store(&idx, "r1", &[1, 2, 3], 0.5);
    clock.advance(Duration::from_secs(300));
    store(&idx, "r2", &[1, 2], 0.5);
    let passed = LookupPolicy {
        ttl: Some(Duration::from_secs(600)),
        tenant_hot: true,
    };
    let hashes: Vec<Vec<u8>> = [1u64, 2, 3].iter().map(|&x| h(x)).collect();
    let counts = [16; 3];
    let exact = h(2);
    let novel = h(99);
    for secs in [0u64, 200, 400] {
        clock.advance(Duration::from_secs(secs));
        let reqs = [
            LookupRequest::new("t", "m", "vllm").chain(&hashes, &counts),
            LookupRequest::new("t", "m", "vllm").exact(&exact, 0),
            LookupRequest::new("t", "m", "vllm").exact(&novel, 0),
        ];
        for req in reqs {
            let asked = idx.lookup_route(&req);
            let before = pol.ttl_reads.load(Ordering::SeqCst);
            let given = idx.lookup_route(&req.policy(passed));
            assert_eq!(
                pol.ttl_reads.load(Ordering::SeqCst),
                before,
                "no resolver call"
            );
            assert_eq!(given, asked);
            assert_eq!(idx.lookup(&req.policy(passed)), idx.lookup(&req));
        }
    }
}

#[test]
fn tenant_hot_disabled_by_the_policy_is_the_demoted_answer() {
    let pol = Arc::new(Counting::default());
    let (idx, _clock) = index(pol);
    store(&idx, "r1", &[1], 0.9);
    let novel = h(99);
    let req: LookupRequest<'_> = LookupRequest::new("t", "m", "vllm").exact(&novel, 0);
    let mut asked = idx.lookup_route(&req);
    assert_eq!(asked.strategy, Strategy::TenantHot);
    asked.demote();
    let off = LookupPolicy {
        ttl: None,
        tenant_hot: false,
    };
    assert_eq!(idx.lookup_route(&req.policy(off)), asked);
    assert_eq!(asked.strategy, Strategy::None);
}

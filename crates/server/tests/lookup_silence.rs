//! The lookup hot path emits no log lines, on any branch (§3.2).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use inferencecache_proto::v1alpha1::*;
use inferencecache_server::convert::update_from_proto;
use inferencecache_server::core::Core;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Counts every event at every level, but for the decision log: an
/// operator's opt-in diagnosis switch (`INFERENCECACHE_LOG=...,
/// inferencecache::decisions=debug`), off unless its target is enabled.
struct Counter(Arc<AtomicUsize>);

impl Subscriber for Counter {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        m.target() != inferencecache_server::decision_log::TARGET
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, _: &Event<'_>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

#[test]
fn lookup_route_emits_no_logs_on_any_branch() {
    let count = Arc::new(AtomicUsize::new(0));
    let core = Core::with_defaults();
    core.ingest(&update_from_proto(CacheStateUpdate {
        replica_id: "r".into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            prefix_hash: vec![1; 8],
            token_count: 128,
            ..Default::default()
        }],
        stats: Some(ReplicaStats {
            hit_rate: 0.9,
            ..Default::default()
        }),
        ..Default::default()
    }));
    let base = LookupRouteRequest {
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        ..Default::default()
    };
    let requests = [
        LookupRouteRequest {
            prefix_hash: vec![1; 8],
            ..base.clone()
        },
        LookupRouteRequest {
            prefix_hash: vec![2; 8],
            ..base.clone()
        },
        LookupRouteRequest {
            tenant_id: "x".into(),
            prefix_hash: vec![2; 8],
            ..base.clone()
        },
        LookupRouteRequest {
            block_token_counts: vec![16],
            ..base.clone()
        },
        LookupRouteRequest {
            token_ids: (0..64).collect(),
            ..base.clone()
        },
        LookupRouteRequest {
            prompt_text: "hello".into(),
            ..base.clone()
        },
        LookupRouteRequest {
            tenant_id: "inferencecache.io/probe".into(),
            ..base.clone()
        },
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(Counter(Arc::clone(&count)), || {
        for r in &requests {
            rt.block_on(inferencecache_server::convert::lookup_route(
                &core.pipeline,
                r,
                None,
            ));
        }
        // Sanity: the counter does see events.
        tracing::info!("probe_of_the_counter");
    });
    assert_eq!(
        count.load(Ordering::Relaxed),
        1,
        "only the sanity event was logged"
    );
}

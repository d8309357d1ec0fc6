//! Producer and observer calls: report, publish, state, watch.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{NO_AFFINITY, Running, chain_entry, hot_update, update};
use futures::StreamExt;
use inferencecache_client::proto::cache_event::Type;
use inferencecache_client::{CacheEvent, Hint, RouteInput, RouteQuery, StreamEventsRequest};
use std::time::Duration;

fn prompt() -> Vec<u32> {
    (0..80).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_sees_reports_and_evictions_filtered_by_tenant() {
    let s = Running::start().await;
    let client = common::sdk(&s).await;
    let mut events = client
        .watch(StreamEventsRequest {
            tenant_id: "t".into(),
            types: vec![Type::PrefixAdded as i32, Type::PrefixEvicted as i32],
            ..Default::default()
        })
        .await
        .unwrap();
    // Another tenant's report must not show up.
    let mut other = update("r9", vec![chain_entry(&prompt())]);
    other.tenant_id = "other".into();
    client.report_state(vec![other]).await.unwrap();
    client
        .report_state(vec![update("r1", vec![chain_entry(&prompt())])])
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), events.next())
        .await
        .expect("an event within 5 s")
        .expect("stream open")
        .expect("event");
    assert_eq!(first.tenant_id, "t");
    assert_eq!(first.replica_id, "r1");
    assert_eq!(first.r#type, Type::PrefixAdded as i32);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_eviction_stops_the_match() {
    let s = Running::start().await;
    s.policy(NO_AFFINITY).await;
    let client = common::sdk(&s).await;
    let entry = inferencecache_client::PrefixEntry {
        prefix_hash: vec![3; 8],
        token_count: 128,
        ..Default::default()
    };
    client
        .report_state(vec![update("r1", vec![entry])])
        .await
        .unwrap();
    let q = RouteQuery::new(
        "t",
        "m",
        RouteInput::PrefixHash {
            hash: vec![3; 8],
            token_count: 128,
        },
    );
    assert!(matches!(
        client.lookup_route(&q).await.hint,
        Hint::PrefixMatch(_)
    ));
    let ack = client
        .publish_event(CacheEvent {
            r#type: Type::PrefixEvicted as i32,
            replica_id: "r1".into(),
            model_id: "m".into(),
            tenant_id: "t".into(),
            prefix_hash: vec![3; 8],
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(ack.accepted, "{ack:?}");
    assert!(!client.lookup_route(&q).await.hint.is_hint());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_state_lists_reporting_replicas() {
    let s = Running::start().await;
    let client = common::sdk(&s).await;
    client
        .report_state(vec![
            hot_update("r1", vec![chain_entry(&prompt())]),
            // Only replicas that report stats are listed.
            hot_update("r2", vec![chain_entry(&(100..164).collect::<Vec<_>>())]),
        ])
        .await
        .unwrap();
    let state = client.get_cache_state("t", "m").await.unwrap();
    let mut ids: Vec<&str> = state
        .replicas
        .iter()
        .map(|r| r.replica_id.as_str())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, ["r1", "r2"]);
    assert!(state.summary.unwrap().total_prefixes > 0);
    s.stop().await;
}

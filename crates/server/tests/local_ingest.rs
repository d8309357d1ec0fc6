//! The in-process ingest edge (`Server::local_ingest`, what the gateway's
//! embedded subscribers report to) against the gRPC edge: the same
//! messages build the same index and get the same refusals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use inferencecache_proto::v1alpha1::cache_event::Type;
use inferencecache_proto::v1alpha1::*;
use inferencecache_server::local_ingest::LocalIngest;
use inferencecache_server::{Server, ServerConfig};
use tokio_util::sync::CancellationToken;
use tonic::Code;

const WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// A served server and its in-process ingest.
async fn start() -> (common::Running, LocalIngest) {
    let server = Server::bind(&ServerConfig::ephemeral()).await.unwrap();
    let shutdown = CancellationToken::new();
    let local = server.local_ingest(shutdown.clone());
    (common::Running::serve(server, shutdown).await, local)
}

fn replica(i: u64) -> String {
    format!("r{}", (i / 7) % 3)
}

/// Runs of one replica cut by another (the handler's windows), then
/// evictions and a clear.
fn updates() -> Vec<CacheStateUpdate> {
    (0..200u64)
        .map(|i| CacheStateUpdate {
            replica_id: replica(i),
            model_id: "m".into(),
            tenant_id: "t".into(),
            hash_scheme: "vllm".into(),
            block_size: 16,
            prefixes: vec![PrefixEntry {
                prefix_hash: i.to_be_bytes().to_vec(),
                token_count: 128,
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect()
}

fn events() -> Vec<CacheEvent> {
    let evicted = (0..50u64).map(|i| CacheEvent {
        r#type: Type::PrefixEvicted as i32,
        replica_id: replica(i),
        model_id: "m".into(),
        tenant_id: "t".into(),
        prefix_hash: i.to_be_bytes().to_vec(),
        ..Default::default()
    });
    evicted
        .chain(std::iter::once(CacheEvent {
            r#type: Type::AllCleared as i32,
            replica_id: "r2".into(),
            model_id: "m".into(),
            tenant_id: "t".into(),
            ..Default::default()
        }))
        .collect()
}

/// (total prefixes, replica ids) as GetCacheState shows them.
async fn held(s: &common::Running) -> (i64, Vec<String>) {
    let state = common::cache_state(&mut s.client().await, "m", "t").await;
    (
        state.summary.unwrap().total_prefixes,
        state.replicas.into_iter().map(|r| r.replica_id).collect(),
    )
}

#[tokio::test]
async fn the_same_messages_build_the_same_index_either_way() {
    let (over_grpc, _) = start().await;
    let mut c = over_grpc.client().await;
    common::report(&mut c, updates()).await;
    for e in events() {
        assert!(c.publish_event(e).await.unwrap().into_inner().accepted);
    }

    let (in_process, local) = start().await;
    let ack = local
        .report_cache_state(futures::stream::iter(updates()))
        .await
        .unwrap();
    assert!(ack.accepted);
    for e in events() {
        assert!(local.publish_event(e).await.unwrap().accepted);
    }

    let want = held(&over_grpc).await;
    let left = (50..200u64).filter(|&i| replica(i) != "r2").count();
    assert_eq!(want.0, left as i64, "not evicted, not cleared");
    assert_eq!(held(&in_process).await, want);
    over_grpc.stop().await;
    in_process.stop().await;
}

#[tokio::test]
async fn refusals_are_the_grpc_edges() {
    let (s, local) = start().await;
    // A producer must name its replica.
    let refused = local
        .publish_event(CacheEvent::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    let over_grpc = s
        .client()
        .await
        .publish_event(CacheEvent::default())
        .await
        .unwrap_err();
    assert_eq!(over_grpc.code(), refused.code());
    assert_eq!(over_grpc.message(), refused.message());
    s.stop().await;
}

#[tokio::test]
async fn an_open_report_stream_ends_unavailable_on_shutdown() {
    let (s, local) = start().await;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let call = tokio::spawn(async move {
        local
            .report_cache_state(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    tx.send(updates().remove(0)).await.unwrap();
    // The producer keeps its stream open (tx stays alive), as a sidecar does.
    let stop = tokio::spawn(s.stop());
    let answer = tokio::time::timeout(WAIT, call).await.unwrap().unwrap();
    assert_eq!(answer.unwrap_err().code(), Code::Unavailable);
    tokio::time::timeout(WAIT, stop).await.unwrap().unwrap();
    drop(tx);
}

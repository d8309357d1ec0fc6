//! The gRPC surface over real loopback connections: every RPC answers, health
//! and reflection are served, and malformed requests get a status.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Running, cache_state};
use inferencecache_proto::v1alpha1::*;
use tonic::Code;

#[tokio::test]
async fn lookup_route_fails_open_with_no_hint() {
    let s = Running::start().await;
    let mut c = s.client().await;
    let resp = c
        .lookup_route(LookupRouteRequest {
            model_id: "m".into(),
            tenant_id: "t".into(),
            hash_scheme: "vllm".into(),
            prefix_hash: vec![1, 2, 3, 4, 5, 6, 7, 8],
            prefix_token_count: 16,
            adapter_id: "lora-a".into(),
            ..Default::default()
        })
        .await
        .expect("LookupRoute never errors")
        .into_inner();
    assert_eq!(resp.reason_code, "NO_HINT");
    assert!(resp.replica_scores.is_empty());
    assert!(resp.token_ids.is_empty());
    s.stop().await;
}

#[tokio::test]
async fn probe_tenant_lookup_is_short_circuited() {
    let s = Running::start().await;
    let resp = s
        .client()
        .await
        .lookup_route(LookupRouteRequest {
            tenant_id: "inferencecache.io/probe".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.reason_code, "NO_HINT");
    assert_eq!(resp.lookup_latency_us, 0);
    s.stop().await;
}

#[tokio::test]
async fn every_other_rpc_answers_its_fail_open_default() {
    let s = Running::start().await;
    let mut c = s.client().await;

    let r = c
        .render_template(RenderTemplateRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.reason_code, "TEMPLATE_NOT_FOUND", "no templates loaded");

    let r = c
        .lookup_pd_route(LookupPdRouteRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.reason_code, "NO_HINT");

    let r = common::cache_state(&mut c, "m", "t").await;
    assert!(r.replicas.is_empty());
    assert_eq!(
        r.summary,
        Some(CacheSummary::default()),
        "summary is always present"
    );

    let updates = (0..3).map(|i| CacheStateUpdate {
        replica_id: format!("r{i}"),
        ..Default::default()
    });
    let ack = c
        .report_cache_state(futures::stream::iter(updates))
        .await
        .unwrap()
        .into_inner();
    assert!(ack.accepted);

    let ack = c
        .publish_event(CacheEvent {
            replica_id: "r0".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(ack.accepted);
    // A producer must name its replica (the reference accepted "").
    let refused = c.publish_event(CacheEvent::default()).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");

    s.stop().await;
}

/// However the handler windows a stream's messages into index batches (runs
/// of one replica, cut by another replica), every message is applied.
#[tokio::test]
async fn a_report_stream_is_applied_whole_across_windows() {
    let s = Running::start().await;
    let mut c = s.client().await;
    let updates = (0..200u64).map(|i| CacheStateUpdate {
        replica_id: format!("r{}", (i / 7) % 3),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            prefix_hash: i.to_be_bytes().to_vec(),
            token_count: 128,
            ..Default::default()
        }],
        ..Default::default()
    });
    common::report(&mut c, updates.collect()).await;
    let state = common::cache_state(&mut c, "m", "t").await;
    assert_eq!(state.summary.unwrap().total_prefixes, 200);
    s.stop().await;
}

const STREAM_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[tokio::test]
async fn stream_cache_events_delivers_live_index_changes_filtered() {
    let s = Running::start().await;
    let mut c = s.client().await;
    let mut events = c
        .stream_cache_events(StreamEventsRequest {
            model_id: "m".into(),
            tenant_id: String::new(),
            types: vec![
                cache_event::Type::PrefixAdded as i32,
                cache_event::Type::AllCleared as i32,
            ],
        })
        .await
        .unwrap()
        .into_inner();
    let update = |model: &str| CacheStateUpdate {
        replica_id: "r1".into(),
        model_id: model.into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            prefix_hash: vec![7; 8],
            token_count: 16,
            ..Default::default()
        }],
        ..Default::default()
    };
    // Another model (filtered out), then ours.
    c.report_cache_state(futures::stream::iter([update("other"), update("m")]))
        .await
        .unwrap();
    c.publish_event(CacheEvent {
        r#type: cache_event::Type::AllCleared as i32,
        replica_id: "r1".into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    let first = tokio::time::timeout(STREAM_WAIT, events.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.r#type, cache_event::Type::PrefixAdded as i32);
    assert_eq!(first.model_id, "m");
    assert_eq!(first.replica_id, "r1");
    assert_eq!(first.prefix_hash, vec![7; 8]);
    // The PREFIX_EVICTED notes of the clear are filtered out; ALL_CLEARED is not.
    let second = tokio::time::timeout(STREAM_WAIT, events.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(second.r#type, cache_event::Type::AllCleared as i32);
    s.stop().await;
}

#[tokio::test]
async fn stream_metrics_samples_named_metrics() {
    let s = Running::start().await;
    let mut c = s.client().await;
    let mut samples = c
        .stream_metrics(StreamMetricsRequest {
            names: vec!["inferencecache_server_up".into()],
        })
        .await
        .unwrap()
        .into_inner();
    let m = tokio::time::timeout(STREAM_WAIT, samples.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(m.name, "inferencecache_server_up");
    assert_eq!(m.r#type, "gauge");
    assert_eq!(m.value, 1.0);
    assert!(m.timestamp_us > 0);
    s.stop().await;
}

#[tokio::test]
async fn open_streams_end_on_shutdown() {
    let s = Running::start().await;
    let mut c = s.client().await;
    let mut events = c
        .stream_cache_events(StreamEventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let stop = tokio::spawn(s.stop());
    let end = tokio::time::timeout(STREAM_WAIT, events.message())
        .await
        .expect("stream ends");
    assert!(matches!(end, Ok(None) | Err(_)));
    tokio::time::timeout(STREAM_WAIT, stop)
        .await
        .unwrap()
        .unwrap();
}

/// A producer's ReportCacheState call with one update sent and the stream
/// left open (the sender is returned alive).
async fn open_report_stream(
    s: &Running,
) -> (
    tokio::sync::mpsc::Sender<CacheStateUpdate>,
    tokio::task::JoinHandle<Result<tonic::Response<Ack>, tonic::Status>>,
) {
    let mut c = s.client().await;
    let (tx, rx) = tokio::sync::mpsc::channel::<CacheStateUpdate>(1);
    let call = tokio::spawn(async move {
        c.report_cache_state(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    // One real prefix, so a test can see the stream's first update land.
    tx.send(CacheStateUpdate {
        replica_id: "r".into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            prefix_hash: vec![7; 8],
            token_count: 16,
            ..Default::default()
        }],
        ..Default::default()
    })
    .await
    .unwrap();
    (tx, call)
}

#[tokio::test]
async fn open_report_stream_ends_unavailable_on_shutdown() {
    let s = Running::start().await;
    let (tx, call) = open_report_stream(&s).await;
    // The producer keeps its stream open (tx stays alive), as a sidecar does.
    let stop = tokio::spawn(s.stop());
    let answer = tokio::time::timeout(STREAM_WAIT, call)
        .await
        .expect("the open report stream ends with the shutdown")
        .unwrap();
    assert_eq!(answer.unwrap_err().code(), Code::Unavailable);
    tokio::time::timeout(STREAM_WAIT, stop)
        .await
        .unwrap()
        .unwrap();
    drop(tx);
}

#[tokio::test]
async fn health_reports_serving_overall_and_for_the_service() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let s = Running::start().await;
    let mut h = HealthClient::new(s.channel().await);
    for service in ["", inferencecache_proto::SERVICE_NAME] {
        let r = h
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            r.status,
            ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
    s.stop().await;
}

async fn list_services_v1alpha(s: &Running) -> Vec<String> {
    use tonic_reflection::pb::v1alpha::ServerReflectionRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse;
    let mut c = ServerReflectionClient::new(s.channel().await);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut resp = c
        .server_reflection_info(futures::stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let msg = resp.message().await.unwrap().expect("one response");
    match msg.message_response {
        Some(MessageResponse::ListServicesResponse(l)) => {
            l.service.into_iter().map(|s| s.name).collect()
        }
        other => panic!("unexpected reflection response {other:?}"),
    }
}

#[tokio::test]
async fn reflection_v1alpha_lists_the_service_and_health() {
    let s = Running::start().await;
    let names = list_services_v1alpha(&s).await;
    assert!(
        names
            .iter()
            .any(|n| n == "inferencecache.v1alpha1.InferenceCache"),
        "{names:?}"
    );
    assert!(
        names.iter().any(|n| n == "grpc.health.v1.Health"),
        "{names:?}"
    );
    s.stop().await;
}

#[tokio::test]
async fn reflection_v1_is_served_too() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let s = Running::start().await;
    let mut c = ServerReflectionClient::new(s.channel().await);
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            "inferencecache.v1alpha1.InferenceCache".into(),
        )),
    };
    let mut resp = c
        .server_reflection_info(futures::stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let msg = resp.message().await.unwrap().expect("one response");
    match msg.message_response {
        Some(MessageResponse::FileDescriptorResponse(f)) => {
            assert!(!f.file_descriptor_proto.is_empty())
        }
        other => panic!("unexpected reflection response {other:?}"),
    }
    s.stop().await;
}

/// A message whose field 1 is a varint, where LookupRouteRequest has a string.
#[derive(Clone, PartialEq, prost::Message)]
struct WrongWireType {
    #[prost(uint64, tag = "1")]
    model_id: u64,
}

/// A message whose field 1 carries bytes that are not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct NotUtf8 {
    #[prost(bytes = "vec", tag = "1")]
    model_id: Vec<u8>,
}

async fn call_raw<M: prost::Message + Default + Send + Sync + 'static>(
    s: &Running,
    msg: M,
) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(s.channel().await);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/inferencecache.v1alpha1.InferenceCache/LookupRoute",
    );
    let codec = tonic_prost::ProstCodec::<M, LookupRouteResponse>::default();
    grpc.unary(tonic::Request::new(msg), path, codec)
        .await
        .expect_err("garbage must be refused with a status")
}

#[tokio::test]
async fn garbage_request_bytes_get_a_status_not_a_crash() {
    let s = Running::start().await;
    let st = call_raw(&s, WrongWireType { model_id: 7 }).await;
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
    let st = call_raw(
        &s,
        NotUtf8 {
            model_id: vec![0xff, 0xfe, 0xfd],
        },
    )
    .await;
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
    // The server is still serving afterwards.
    let ok = s
        .client()
        .await
        .lookup_route(LookupRouteRequest::default())
        .await;
    assert!(ok.is_ok());
    s.stop().await;
}

#[tokio::test]
async fn cancelled_report_stream_gets_no_ack_and_server_survives() {
    let s = Running::start().await;
    let (tx, call) = open_report_stream(&s).await;
    // Cancelled once the server has applied the stream's first update.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut c = s.client().await;
    while cache_state(&mut c, "m", "t")
        .await
        .summary
        .is_none_or(|s| s.total_prefixes < 1)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the stream's first update never landed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    call.abort();
    let _ = call.await;
    drop(tx);
    let ok = s
        .client()
        .await
        .publish_event(CacheEvent {
            replica_id: "r".into(),
            ..Default::default()
        })
        .await;
    assert!(ok.is_ok());
    s.stop().await;
}

//! The HTTP listeners over real loopback connections.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Running;
use inferencecache_proto::v1alpha1::LookupRouteRequest;

#[tokio::test]
async fn healthz_and_readyz_answer_ok() {
    let s = Running::start().await;
    for path in ["/healthz", "/readyz"] {
        let r = reqwest::get(s.url(path)).await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.text().await.unwrap(), "ok\n");
    }
    s.stop().await;
}

#[tokio::test]
async fn metrics_are_classic_text_by_default() {
    let s = Running::start().await;
    let r = reqwest::get(s.url("/metrics")).await.unwrap();
    assert_eq!(r.status(), 200);
    let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    let body = r.text().await.unwrap();
    assert!(body.contains("\ninferencecache_server_up 1\n"), "{body}");
    assert!(
        body.contains("\ninferencecache_server_grpc_tls_enabled 0\n"),
        "{body}"
    );
    assert!(body.contains(
        "# HELP inferencecache_server_up 1 if the cache policy server is serving requests, 0 otherwise.\n"
    ));
    assert!(!body.contains("# EOF"));
    s.stop().await;
}

#[tokio::test]
async fn lookup_calls_are_counted_with_contract_labels() {
    let s = Running::start().await;
    s.client()
        .await
        .lookup_route(LookupRouteRequest {
            model_id: "m1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let body = s.metrics_text().await;
    assert!(
        body.contains("# TYPE inferencecache_lookup_route_calls_total counter\n"),
        "{body}"
    );
    assert!(
        body.contains(
            "inferencecache_lookup_route_calls_total{model=\"m1\",reason_code=\"NO_HINT\",hint_used=\"false\"} 1\n"
        ),
        "{body}"
    );
    assert!(
        body.contains(
            "inferencecache_lookup_route_latency_seconds_bucket{le=\"0.0001\",model=\"m1\"}"
        ) || body.contains(
            "inferencecache_lookup_route_latency_seconds_bucket{model=\"m1\",le=\"0.0001\"}"
        ),
        "{body}"
    );
    assert!(
        body.contains("inferencecache_lookup_route_latency_seconds_count{model=\"m1\"} 1\n"),
        "{body}"
    );
    s.stop().await;
}

#[tokio::test]
async fn metrics_speak_openmetrics_when_asked() {
    let s = Running::start().await;
    let r = reqwest::Client::new()
        .get(s.url("/metrics"))
        .header("accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap();
    let ct = r.headers()["content-type"].to_str().unwrap().to_owned();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    assert!(r.text().await.unwrap().ends_with("# EOF\n"));
    s.stop().await;
}

#[tokio::test]
async fn listeners_do_not_serve_each_others_endpoints() {
    let s = Running::start().await;
    for path in ["/snapshot", "/policy", "/probe"] {
        assert_eq!(
            reqwest::get(s.url(path)).await.unwrap().status(),
            404,
            "{path}"
        );
    }
    for path in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(
            reqwest::get(s.control_url(path)).await.unwrap().status(),
            404,
            "{path}"
        );
    }
    s.stop().await;
}

#[tokio::test]
async fn shutdown_stops_listeners() {
    let s = Running::start().await;
    let http = s.url("/healthz");
    s.stop().await;
    assert!(
        reqwest::get(http).await.is_err(),
        "listener closed after shutdown"
    );
}

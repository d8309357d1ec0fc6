//! What the operator pushes, read from a real apiserver: the `/policy`
//! document, `/templates` from PromptTemplates and `/pd-topologies` with
//! each pool's selector resolved to real pod names. The receiving end is a
//! loopback recorder (the server's `/templates` and `/pd-topologies` land in
//! another change; the policy round trip against the real server is in the
//! CLI's operator_e2e). A 404 from one target is "unsupported": counted,
//! and the others are still pushed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use inferencecache_operator::client::ServerClient;
use inferencecache_operator::crd;
use inferencecache_operator::metrics::Metrics;
use inferencecache_operator::push::Pusher;
use inferencecache_operator::testing::{Cluster, apiserver_binary};
use kube::api::{Api, PostParams};
use kube::core::{ApiResource, DynamicObject};
use std::sync::{Arc, Mutex};

type Seen = Arc<Mutex<Vec<(String, serde_json::Value)>>>;

async fn record(State(seen): State<Seen>, Path(target): Path<String>, body: Bytes) -> StatusCode {
    if target == "templates" {
        return StatusCode::NOT_FOUND;
    }
    seen.lock()
        .unwrap()
        .push((target, serde_json::from_slice(&body).unwrap()));
    StatusCode::NO_CONTENT
}

async fn create(client: &kube::Client, ns: &str, ar: &ApiResource, v: serde_json::Value) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
    api.create(&PostParams::default(), &serde_json::from_value(v).unwrap())
        .await
        .unwrap();
}

#[tokio::test]
async fn pushes_resolve_pd_pools_to_pod_names_and_skip_an_unsupported_target() {
    let Some(bin) = apiserver_binary() else {
        return;
    };
    let cluster = Cluster::start(&bin).await;
    cluster.install_crds(&crd::all()).await;
    cluster.namespace("pd").await;
    let client = cluster.client().await;

    let pod_ar = ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&());
    for (name, role) in [
        ("prefill-1", "prefill"),
        ("prefill-0", "prefill"),
        ("decode-0", "decode"),
        ("other", "x"),
    ] {
        create(
            &client,
            "pd",
            &pod_ar,
            serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": {"role": role}},
                "spec": {"containers": [{"name": "e", "image": "e"}]}
            }),
        )
        .await;
    }
    create(
        &client,
        "pd",
        &ApiResource::erase::<crd::PDTopology>(&()),
        serde_json::json!({
            "apiVersion": "inferencecache.io/v1alpha1", "kind": "PDTopology",
            "metadata": {"name": "qwen"},
            "spec": {"prefillPools": [{"name": "p", "matchLabels": {"role": "prefill"}}],
                     "decodePools": [{"name": "d", "matchLabels": {"role": "decode"}}],
                     "transport": "NIXL"}
        }),
    )
    .await;
    create(
        &client,
        "pd",
        &ApiResource::erase::<crd::PromptTemplate>(&()),
        serde_json::json!({
            "apiVersion": "inferencecache.io/v1alpha1", "kind": "PromptTemplate",
            "metadata": {"name": "greet"},
            "spec": {"body": "Hi {{name}}", "slots": [{"name": "name", "type": "Mutable"}]}
        }),
    )
    .await;
    create(
        &client,
        "pd",
        &ApiResource::erase::<crd::CachePolicy>(&()),
        serde_json::json!({
            "apiVersion": "inferencecache.io/v1alpha1", "kind": "CachePolicy",
            "metadata": {"name": "p"}, "spec": {"eviction": "LFU"}
        }),
    )
    .await;

    let seen: Seen = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = Router::new()
        .route("/{target}", post(record))
        .with_state(seen.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    let metrics = Metrics::new();
    let pusher = Pusher {
        client,
        http: ServerClient::new(),
        policy_url: format!("{base}/policy"),
        templates_url: format!("{base}/templates"),
        pd_url: format!("{base}/pd-topologies"),
        policy_token_file: cluster.dir.join("no-token"),
        metrics: metrics.clone(),
        templates_unsupported: Arc::default(),
        pd_unsupported: Arc::default(),
    };
    pusher.push_all().await.unwrap();
    pusher.push_all().await.unwrap();

    let seen = seen.lock().unwrap().clone();
    let targets: Vec<&str> = seen.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        targets,
        ["policy", "pd-topologies", "policy", "pd-topologies"]
    );
    assert_eq!(
        seen[0].1,
        serde_json::json!({"version": 7, "policies": [{
            "namespace": "pd", "eviction": "lfu", "minimumMatchedTokens": 64,
            "routingFloorScore": 0.1, "affinityRouting": true}]})
    );
    assert_eq!(
        seen[1].1,
        serde_json::json!([{"namespace": "pd", "name": "qwen",
            "prefillReplicas": ["prefill-0", "prefill-1"], "decodeReplicas": ["decode-0"],
            "transport": "NIXL"}])
    );
    let text = metrics.encode();
    for line in [
        "inferencecache_operator_pushes_total{target=\"policy\",result=\"ok\"} 2",
        "inferencecache_operator_pushes_total{target=\"templates\",result=\"unsupported\"} 2",
        "inferencecache_operator_pushes_total{target=\"pd-topologies\",result=\"ok\"} 2",
    ] {
        assert!(text.contains(line), "missing {line}\n{text}");
    }
    assert!(
        pusher
            .templates_unsupported
            .load(std::sync::atomic::Ordering::Relaxed)
    );
}

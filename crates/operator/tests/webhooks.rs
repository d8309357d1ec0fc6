//! The admission webhooks, called by a real kube-apiserver over TLS (a
//! `url` client config with an rcgen CA in `caBundle`): a second CachePolicy
//! in a namespace and the reserved probe tenant are rejected with our
//! messages, a selected pod comes back with the subscriber sidecar (it stays
//! Pending: there are no nodes), an opted-out pod does not, and a rotated
//! certificate is served without a restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use inferencecache_operator::crd::{self, CacheBackend, CachePolicy, CacheTenant};
use inferencecache_operator::testing::{Cluster, apiserver_binary, write_webhook_certs};
use inferencecache_operator::webhook::inject::{INJECTED_BY, InjectConfig, SIDECAR_NAME};
use inferencecache_operator::{Operator, OperatorConfig};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use std::path::Path;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

fn client_config(port: u16, path: &str, ca: &str) -> WebhookClientConfig {
    WebhookClientConfig {
        url: Some(format!("https://127.0.0.1:{port}{path}")),
        ca_bundle: Some(ByteString(ca.as_bytes().to_vec())),
        ..Default::default()
    }
}

fn rule(group: &str, resource: &str, ops: &[&str]) -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        api_groups: Some(vec![group.into()]),
        api_versions: Some(vec![
            if group.is_empty() { "v1" } else { "v1alpha1" }.into(),
        ]),
        operations: Some(ops.iter().map(|s| (*s).to_owned()).collect()),
        resources: Some(vec![resource.into()]),
        ..Default::default()
    }]
}

fn validating(port: u16, ca: &str) -> ValidatingWebhookConfiguration {
    let hook = |name: &str, path: &str, resource: &str| ValidatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        side_effects: "None".into(),
        failure_policy: Some("Fail".into()),
        client_config: client_config(port, path, ca),
        rules: Some(rule("inferencecache.io", resource, &["CREATE", "UPDATE"])),
        ..Default::default()
    };
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some("inference-cache-validating".into()),
            ..Default::default()
        },
        webhooks: Some(vec![
            hook(
                "vcachepolicy.inferencecache.io",
                "/validate-inferencecache-io-v1alpha1-cachepolicy",
                "cachepolicies",
            ),
            hook(
                "vcachetenant.inferencecache.io",
                "/validate-inferencecache-io-v1alpha1-cachetenant",
                "cachetenants",
            ),
        ]),
    }
}

fn mutating(port: u16, ca: &str) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some("inference-cache-mutating".into()),
            ..Default::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: "mpod.inferencecache.io".into(),
            admission_review_versions: vec!["v1".into()],
            side_effects: "None".into(),
            failure_policy: Some("Ignore".into()),
            client_config: client_config(port, "/mutate--v1-pod", ca),
            rules: Some(rule("", "pods", &["CREATE"])),
            ..Default::default()
        }]),
    }
}

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn tenant(name: &str, id: &str) -> CacheTenant {
    obj(serde_json::json!({
        "apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheTenant",
        "metadata": {"name": name}, "spec": {"tenantID": id}
    }))
}

fn policy(name: &str) -> CachePolicy {
    obj(serde_json::json!({
        "apiVersion": "inferencecache.io/v1alpha1", "kind": "CachePolicy",
        "metadata": {"name": name}, "spec": {}
    }))
}

fn engine_pod(name: &str, skip: bool) -> Pod {
    let mut ann = serde_json::Map::new();
    if skip {
        ann.insert("inferencecache.io/skip-inject".into(), "true".into());
    }
    obj(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"inferencecache.io/cache-domain": "qwen"}, "annotations": ann},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai", "args": ["--port=8100"]}]}
    }))
}

async fn operator(cluster: &Cluster, cert_dir: &Path) -> (u16, CancellationToken) {
    let cfg = OperatorConfig {
        kubeconfig: Some(cluster.kubeconfig.clone()),
        metrics_addr: "127.0.0.1:0".into(),
        health_addr: "127.0.0.1:0".into(),
        // No server in this test: pushes fail and are retried, harmlessly.
        policy_url: "http://127.0.0.1:9/policy".into(),
        snapshot_url: "http://127.0.0.1:9/snapshot".into(),
        templates_url: String::new(),
        pd_url: String::new(),
        policy_token_file: cert_dir.join("absent"),
        controller_token_file: cert_dir.join("absent"),
        push_interval: Duration::from_secs(30),
        refresh_interval: Duration::from_secs(30),
        leader: None,
        webhook: Some(("127.0.0.1:0".into(), cert_dir.to_owned())),
        webhook_certs: None,
        inject: InjectConfig {
            image: "inferencecache:dev".into(),
            server_grpc: "inference-cache-server:9090".into(),
        },
    };
    let op = Operator::bind(cfg).await.unwrap();
    let port = op.webhook_addr().unwrap().port();
    let stop = CancellationToken::new();
    tokio::spawn(op.run(stop.clone()));
    (port, stop)
}

#[tokio::test]
async fn the_apiserver_calls_the_webhooks_over_tls() {
    let Some(bin) = apiserver_binary() else {
        return;
    };
    let cluster = Cluster::start(&bin).await;
    cluster.install_crds(&crd::all()).await;
    cluster.namespace("team").await;
    let client = cluster.client().await;
    let certs = cluster.dir.join("webhook-certs");
    let ca = write_webhook_certs(&certs);
    let (port, stop) = operator(&cluster, &certs).await;

    let vwc: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mwc: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    vwc.create(&PostParams::default(), &validating(port, &ca))
        .await
        .unwrap();
    mwc.create(&PostParams::default(), &mutating(port, &ca))
        .await
        .unwrap();

    // The apiserver picks webhook configurations up asynchronously.
    let tenants: Api<CacheTenant> = Api::namespaced(client.clone(), "team");
    let deadline = Instant::now() + Duration::from_secs(20);
    let reserved = loop {
        match tenants
            .create(&PostParams::default(), &tenant("probe", crd::PROBE_TENANT))
            .await
        {
            Err(e) => break e.to_string(),
            Ok(_) => {
                tenants.delete("probe", &Default::default()).await.unwrap();
                assert!(Instant::now() < deadline, "webhook never called");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert!(
        reserved.contains("vcachetenant.inferencecache.io") && reserved.contains("is reserved"),
        "{reserved}"
    );
    tenants
        .create(&PostParams::default(), &tenant("acme", "acme"))
        .await
        .unwrap();
    let dup = tenants
        .create(&PostParams::default(), &tenant("acme2", "acme"))
        .await
        .unwrap_err()
        .to_string();
    assert!(dup.contains("Duplicate value: \"acme\""), "{dup}");

    let policies: Api<CachePolicy> = Api::namespaced(client.clone(), "team");
    policies
        .create(&PostParams::default(), &policy("a"))
        .await
        .unwrap();
    let second = policies
        .create(&PostParams::default(), &policy("b"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        second.contains("only one CachePolicy is allowed per namespace; \"a\" already exists"),
        "{second}"
    );
    // An update of the first is still fine.
    policies
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"evictionTTL": "10m"}})),
        )
        .await
        .unwrap();
    let bad_ttl = policies
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"evictionTTL": "0s"}})),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(bad_ttl.contains("spec.evictionTTL"), "{bad_ttl}");

    // Sidecar injection into a selected pod.
    let backends: Api<CacheBackend> = Api::namespaced(client.clone(), "team");
    backends
        .create(
            &PostParams::default(),
            &obj(serde_json::json!({
                "apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
                "metadata": {"name": "qwen"},
                "spec": {"runtime": "VLLM",
                         "engineSelector": {"matchLabels": {"inferencecache.io/cache-domain": "qwen"}},
                         "observation": {"modelID": "Qwen/Qwen3-0.6B"}}
            })),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "team");
    let created = pods
        .create(&PostParams::default(), &engine_pod("engine-0", false))
        .await
        .unwrap();
    let spec = created.spec.unwrap();
    let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["vllm", SIDECAR_NAME], "sidecar appended");
    let side = &spec.containers[1];
    let args = side.args.clone().unwrap();
    assert!(
        args.contains(&"--replica-id=$(POD_NAME)".to_owned()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--tenant-id=$(POD_NAMESPACE)".to_owned()),
        "{args:?}"
    );
    assert!(
        args.contains(&"--engine-metrics-url=http://127.0.0.1:8100/metrics".to_owned()),
        "{args:?}"
    );
    assert!(
        spec.containers[0]
            .args
            .clone()
            .unwrap()
            .contains(&"--kv-events-config".to_owned())
    );
    assert_eq!(
        created.metadata.annotations.unwrap()[INJECTED_BY],
        "team/qwen"
    );
    let skipped = pods
        .create(&PostParams::default(), &engine_pod("engine-1", true))
        .await
        .unwrap();
    assert_eq!(
        skipped.spec.unwrap().containers.len(),
        1,
        "opt-out respected"
    );

    // Certificate rotation: a new CA and leaf on disk, the new CA in the
    // configurations. Our own denial message (not "failed calling webhook")
    // proves the apiserver completed a handshake with the new certificate.
    // The reloader compares mtimes, which a coarse file system may give
    // in whole seconds: the new files are stamped 2 s past the old ones
    // instead of waiting for the clock to move.
    let old = std::fs::metadata(certs.join("tls.crt"))
        .unwrap()
        .modified()
        .unwrap();
    let ca2 = write_webhook_certs(&certs);
    for f in ["tls.crt", "tls.key"] {
        std::fs::File::options()
            .write(true)
            .open(certs.join(f))
            .unwrap()
            .set_modified(old + Duration::from_secs(2))
            .unwrap();
    }
    let mut v = vwc.get("inference-cache-validating").await.unwrap();
    for h in v.webhooks.iter_mut().flatten() {
        h.client_config.ca_bundle = Some(ByteString(ca2.as_bytes().to_vec()));
    }
    vwc.replace("inference-cache-validating", &PostParams::default(), &v)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let e = tenants
            .create(&PostParams::default(), &tenant("probe2", crd::PROBE_TENANT))
            .await
            .unwrap_err()
            .to_string();
        if e.contains("is reserved") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rotated certificate not served: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
}

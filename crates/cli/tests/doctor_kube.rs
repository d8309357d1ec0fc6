//! `inferencecache doctor --kubeconfig` against a real kube-apiserver + etcd
//! holding the shipped manifests (config/server, config/operator, the
//! samples) and a pod mutated by the operator's own injection code, with a
//! real `inferencecache serve`, a real sidecar and the Python engine
//! publisher behind them on loopback. The apiserver has no nodes, so the
//! cluster addresses are mapped to the loopback processes with
//! `--address-override`, as an operator does after `kubectl port-forward`.
//! Covered: the happy path with nothing but the kubeconfig and the
//! overrides; a bad context, an empty namespace (and a typed --server
//! beating discovery); unreachable, unaddressed and uninjected sidecar pods;
//! the server-tls overlay dialled with TLS against the Service's DNS name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/engine.rs"]
mod engine;

use common::{http_send, repo_root};
use inferencecache_operator::crd::{self, CacheBackend};
use inferencecache_operator::testing::{Cluster, apiserver_binary, free_port, require, which};
use inferencecache_operator::webhook::inject::{Decision, InjectConfig, decide};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::time::Duration;

const SYSTEM: &str = "inference-cache-system";
const TENANT: &str = "team-a";
/// The model of config/samples/cachebackend.yaml.
const MODEL: &str = "Qwen/Qwen3-0.6B";
const SVC: &str = "inference-cache-server";
/// The service account config/server/deployment.yaml admits on the control
/// listener (`--allowed-controller-sa`).
const CONTROLLER: &str = "inference-cache-controller";

/// Runs doctor with `args`; (exit code, stdout).
fn doctor(args: &[String]) -> (i32, String) {
    doctor_env(args, &[])
}

/// As [`doctor`], with extra environment variables.
fn doctor_env(args: &[String], env: &[(&str, &str)]) -> (i32, String) {
    common::run_doctor(args, env)
}

/// The `--json` report's check named exactly `name`.
fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    common::doctor_check(report, name, |n| n == name)
}

fn kubectl_ok(cluster: &Cluster, args: &[&str]) {
    let out = cluster.kubectl(args);
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A cluster with the CRDs and the tenant namespace, or `None` (skipped)
/// without the apiserver binaries or kubectl.
async fn cluster() -> Option<Cluster> {
    let bin = apiserver_binary()?;
    if !require(which("kubectl"), "kubectl") {
        return None;
    }
    let cluster = Cluster::start(&bin).await;
    cluster.namespace(SYSTEM).await;
    cluster.namespace(TENANT).await;
    Some(cluster)
}

/// The shipped server and operator manifests, with their Deployments
/// marked ready (no controller-manager or kubelet runs to do it).
fn install_control_plane(cluster: &Cluster) {
    let config = repo_root().join("config");
    let file = |p: &str| config.join(p).display().to_string();
    kubectl_ok(
        cluster,
        &[
            "apply",
            "-n",
            SYSTEM,
            "-f",
            &file("server/service.yaml"),
            "-f",
            &file("server/deployment.yaml"),
            "-f",
            &file("operator/deployment.yaml"),
        ],
    );
    for (deploy, n) in [
        ("inference-cache-server", 1),
        ("inference-cache-controller", 2),
    ] {
        let status = json!({"status": {"replicas": n, "readyReplicas": n}}).to_string();
        kubectl_ok(
            cluster,
            &[
                "patch",
                "-n",
                SYSTEM,
                &format!("deploy/{deploy}"),
                "--subresource=status",
                "--type=merge",
                "-p",
                &status,
            ],
        );
    }
}

/// The CRDs, the sample CacheBackend (cache domain `qwen`) and CacheTenant.
async fn install_samples(cluster: &Cluster) {
    cluster.install_crds(&crd::all()).await;
    let samples = repo_root().join("config/samples");
    let file = |p: &str| samples.join(p).display().to_string();
    kubectl_ok(
        cluster,
        &[
            "apply",
            "-f",
            &file("cachebackend.yaml"),
            "-f",
            &file("cachetenant.yaml"),
        ],
    );
}

/// An engine pod as config/samples/vllm-deployment.yaml templates it.
fn engine_pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": TENANT, "labels": {
            "app": "vllm-qwen", "inferencecache.io/cache-domain": "qwen"}},
        "spec": {"containers": [{
            "name": "vllm", "image": "vllm/vllm-openai:latest",
            "args": ["--model=Qwen/Qwen3-0.6B", "--port=8000", "--enable-prefix-caching"],
            "ports": [{"name": "http", "containerPort": 8000}]}]}
    }))
    .unwrap()
}

/// Creates `name` as the pod webhook admits it: mutated by the operator's
/// injection decision against the sample CacheBackend.
async fn injected_pod(cluster: &Cluster, name: &str) -> Pod {
    let client = cluster.client().await;
    let backend = Api::<CacheBackend>::namespaced(client.clone(), TENANT)
        .get("qwen")
        .await
        .unwrap();
    let cfg = InjectConfig {
        image: "inferencecache:dev".into(),
        server_grpc: format!("{SVC}.{SYSTEM}.svc:9090"),
    };
    let Decision::Mutate(pod) = decide(&cfg, &engine_pod(name), &[backend]) else {
        panic!("the sample CacheBackend must select the sample engine pod");
    };
    Api::<Pod>::namespaced(client, TENANT)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

/// `--address-override`s sending the server Service's three ports to `server`.
fn server_overrides(server: &engine::Proc) -> Vec<String> {
    let mut args = Vec::new();
    for (port, key) in [
        (9090, "grpc_addr"),
        (8080, "http_addr"),
        (8081, "snapshot_addr"),
    ] {
        args.push("--address-override".to_owned());
        args.push(format!("svc/{SVC}:{port}={}", server.addr(key)));
    }
    args
}

fn kube_args(cluster: &Cluster) -> Vec<String> {
    vec![
        "--kubeconfig".into(),
        cluster.kubeconfig.display().to_string(),
        "--timeout".into(),
        "2s".into(),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovers_server_operator_and_sidecar_and_every_check_passes() {
    let Some(py) = engine::python() else { return };
    let Some(cluster) = cluster().await else {
        return;
    };
    install_control_plane(&cluster);
    install_samples(&cluster).await;
    let pod = injected_pod(&cluster, "vllm-qwen-0").await;
    let sidecar_args = pod.spec.as_ref().unwrap().containers[1]
        .args
        .clone()
        .unwrap();
    assert!(
        sidecar_args.contains(&format!("--model-id={MODEL}")),
        "{sidecar_args:?}"
    );

    // The processes the cluster objects stand for. The server checks
    // control tokens with TokenReview against this cluster, as the shipped
    // Deployment's --allowed-controller-sa asks.
    cluster.service_account(SYSTEM, CONTROLLER).await;
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let server = engine::serve(&[
        "--allowed-controller-sa",
        &format!("system:serviceaccount:{SYSTEM}:{CONTROLLER}"),
        "--kubeconfig",
        &kubeconfig,
    ]);
    let control = server.addr("snapshot_addr");
    let policy = json!({"version": 3, "policies": [{"namespace": TENANT}]}).to_string();
    let policy_token = cluster
        .mint(SYSTEM, CONTROLLER, "inferencecache.io/policy")
        .await;
    let (status, _) = http_send(
        &control,
        "POST",
        "/policy",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &format!("Bearer {policy_token}")),
        ],
        policy.as_bytes(),
    );
    assert!(status.contains("204"), "{status}");
    let mut eng = engine::Publisher::start(&py);
    let sidecar = engine::subscribe_as(
        &eng,
        "vllm-qwen-0",
        MODEL,
        TENANT,
        &server.addr("grpc_addr"),
        &[],
    );
    eng.store(1, 4, None, 0);
    let bearer = format!(
        "Bearer {}",
        cluster
            .mint(SYSTEM, CONTROLLER, "inferencecache.io/controller")
            .await
    );
    for _ in 0..100 {
        let (_, body) = http_send(
            &control,
            "GET",
            "/snapshot",
            &[("Authorization", &bearer)],
            b"",
        );
        if body.contains("vllm-qwen-0") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // No --server, --sidecar, --tenant or --model: all of it is discovered.
    let mut args = kube_args(&cluster);
    args.extend(server_overrides(&server));
    args.push("--address-override".into());
    args.push(format!(
        "pod/{TENANT}/vllm-qwen-0:8090={}",
        sidecar.addr("http_addr")
    ));
    // Without a token the control listener refuses doctor, and doctor says
    // how to get one.
    let (code, text) = doctor(&args);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("warn  kube.token"), "{text}");
    assert!(text.contains("fix: pass --kube-token"), "{text}");
    assert!(text.contains("FAIL  server.probe"), "{text}");

    args.push("--kube-token".into());
    let (code, text) = doctor(&args);
    eprintln!("{text}");
    assert_eq!(code, 0, "{text}");
    assert!(
        !text.contains("fix:"),
        "a healthy setup needs no fix:\n{text}"
    );
    for name in [
        "kube.cluster",
        "kube.server ",
        "kube.server.deployment",
        "kube.token",
        "kube.operator",
        "kube.crds",
        "kube.sidecars",
        "sidecar.engine team-a/vllm-qwen-0",
        "sidecar.server team-a/vllm-qwen-0",
    ] {
        assert!(
            text.contains(&format!("ok    {name}")),
            "no {name:?} in\n{text}"
        );
    }

    args.push("--json".into());
    let (code, out) = doctor(&args);
    assert_eq!(code, 0, "{out}");
    let report = common::healthy_report(&out);
    let detail = |name| check(&report, name)["detail"].as_str().unwrap().to_owned();
    assert_eq!(
        detail("kube.server.deployment"),
        "deploy/inference-cache-server: 1/1 replicas ready, plaintext gRPC"
    );
    assert_eq!(
        detail("kube.operator"),
        "deploy/inference-cache-controller: 2/2 replicas ready"
    );
    assert_eq!(
        detail("kube.sidecars"),
        "1 pod(s) with an injected kvevent-subscriber: team-a/vllm-qwen-0"
    );
    assert!(
        detail("kube.server").starts_with(&format!(
            "svc/{SVC} in {SYSTEM}: grpc {}",
            server.addr("grpc_addr")
        )),
        "{}",
        detail("kube.server")
    );
    let crds = check(&report, "kube.crds")["detail"].as_str().unwrap();
    assert!(
        crds.contains("1 CacheBackend, 1 CacheTenant, 0 CachePolicy"),
        "{crds}"
    );
    // The tenant and model came from the injected sidecar's flags.
    let policy = check(&report, "policy.tenant")["detail"].as_str().unwrap();
    assert!(policy.contains("in force for team-a"), "{policy}");
    let lookup = check(&report, "lookup")["detail"].as_str().unwrap();
    assert!(
        lookup.contains(&format!("team-a/{MODEL}: PREFIX_MATCH")),
        "{lookup}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_server_service_and_an_unreachable_sidecar_say_what_to_fix() {
    let Some(cluster) = cluster().await else {
        return;
    };

    // A context the kubeconfig does not have.
    let mut args = kube_args(&cluster);
    args.extend(["--context".into(), "nope".into()]);
    let (code, text) = doctor(&args);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("FAIL  kube.cluster"), "{text}");
    assert!(text.contains("fix: pass --kubeconfig PATH"), "{text}");
    assert!(
        text.contains("not run: the cluster was not reachable (see kube.cluster)"),
        "{text}"
    );

    // An empty namespace: no Service, no operator, no CRDs. The kubeconfig
    // comes from KUBECONFIG this time (`--kubeconfig` without a path).
    let kubeconfig = cluster.kubeconfig.display().to_string();
    let (code, text) = doctor_env(
        &["--kubeconfig", "--context", "t", "--timeout", "2s"].map(String::from),
        &[("KUBECONFIG", &kubeconfig)],
    );
    eprintln!("{text}");
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("FAIL  kube.server ")
            && text.contains(
                "no Service labelled app.kubernetes.io/name=inference-cache-server in namespace \
                 inference-cache-system"
            ),
        "{text}"
    );
    assert!(
        text.contains("fix: install the server (`kubectl apply -k config/default`"),
        "{text}"
    );
    assert!(text.contains("warn  kube.operator"), "{text}");
    assert!(
        text.contains("fix: install the CRDs: `inferencecache crds | kubectl apply -f -`"),
        "{text}"
    );
    // What needs the server is skipped, not failed again.
    assert!(text.contains("skip  server.grpc"), "{text}");
    assert!(text.contains("skip  lookup"), "{text}");

    // --server on the command line beats discovery: the server checks run
    // and the missing Service is only a warning.
    let server = engine::serve(&[]);
    let mut args = kube_args(&cluster);
    args.extend([
        "--server".into(),
        format!("http://{}", server.addr("grpc_addr")),
        "--http".into(),
        server.addr("http_addr"),
        "--control".into(),
        server.addr("snapshot_addr"),
        "--json".into(),
    ]);
    let (code, out) = doctor(&args);
    assert_eq!(code, 0, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        check(&report, "kube.server")["status"],
        "warn",
        "{report:#}"
    );
    assert_eq!(check(&report, "server.probe")["status"], "ok", "{report:#}");

    // Now the control plane is installed, but one engine pod's sidecar
    // does not answer, another sits at an address nothing routes to, one
    // labelled pod never got a sidecar, and one has no address yet.
    install_control_plane(&cluster);
    install_samples(&cluster).await;
    for pod in ["vllm-qwen-0", "vllm-qwen-1", "vllm-qwen-3"] {
        injected_pod(&cluster, pod).await;
    }
    Api::<Pod>::namespaced(cluster.client().await, TENANT)
        .create(&PostParams::default(), &engine_pod("vllm-qwen-2"))
        .await
        .unwrap();
    // A pod IP as the kubelet would report it (TEST-NET-1: never routed).
    let ip = json!({"status": {"podIP": "192.0.2.7", "podIPs": [{"ip": "192.0.2.7"}]}});
    Api::<Pod>::namespaced(cluster.client().await, TENANT)
        .patch_status("vllm-qwen-1", &PatchParams::default(), &Patch::Merge(&ip))
        .await
        .unwrap();
    let dead = format!("127.0.0.1:{}", free_port());
    let mut args = kube_args(&cluster);
    args.extend(server_overrides(&server));
    args.extend([
        "--address-override".into(),
        format!("pod/{TENANT}/vllm-qwen-0:8090={dead}"),
    ]);
    let (code, text) = doctor(&args);
    eprintln!("{text}");
    assert_eq!(code, 1, "{text}");
    for line in [
        "ok    kube.server ",
        "FAIL  sidecar.reachable team-a/vllm-qwen-0",
        "fix: the sidecar does not answer at 192.0.2.7:8090: see `kubectl -n team-a logs \
         vllm-qwen-1 -c kvevent-subscriber`",
        "FAIL  sidecar.reachable team-a/vllm-qwen-1",
        "warn  kube.sidecar team-a/vllm-qwen-3",
        "`kubectl -n team-a port-forward pod/vllm-qwen-3 8090`",
        "warn  kube.sidecars",
        "`kubectl rollout restart`",
        "ok    server.probe",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }

    args.push("--json".into());
    let (code, out) = doctor(&args);
    assert_eq!(code, 1, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["healthy"], false);
    let c = check(&report, "sidecar.reachable team-a/vllm-qwen-0");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(
        c["remediation"]
            .as_str()
            .unwrap()
            .contains("--address-override pod/team-a/vllm-qwen-0:8090=127.0.0.1:18090"),
        "{c}"
    );
    let detail = |name| check(&report, name)["detail"].as_str().unwrap().to_owned();
    assert!(
        detail("sidecar.reachable team-a/vllm-qwen-0")
            .starts_with(&format!("http://{dead}/metrics")),
        "{report:#}"
    );
    // The pod-IP pod is dialled at its IP and the sidecar's container port.
    assert!(
        detail("sidecar.reachable team-a/vllm-qwen-1").starts_with("http://192.0.2.7:8090/metrics"),
        "{report:#}"
    );
    assert_eq!(check(&report, "kube.sidecars")["status"], "warn");
    assert!(
        detail("kube.sidecars").ends_with("without one: team-a/vllm-qwen-2"),
        "{report:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_deployment_is_dialled_with_tls_against_its_service_name() {
    let Some(cluster) = cluster().await else {
        return;
    };
    install_control_plane(&cluster);
    // The shipped server-tls overlay's patch (--tls-cert-file/--tls-key-file).
    let patch = repo_root().join("config/overlays/server-tls/server_tls_patch.yaml");
    kubectl_ok(
        &cluster,
        &[
            "patch",
            "-n",
            SYSTEM,
            "deploy/inference-cache-server",
            "--type=json",
            "--patch-file",
            &patch.display().to_string(),
        ],
    );
    // A certificate for the Service's name only, as the overlay's
    // cert-manager Certificate issues it: dialled at 127.0.0.1, it verifies
    // only if doctor checks it against the discovered Service name.
    let (cert, key) = (cluster.path("tls.crt"), cluster.path("tls.key"));
    common::self_signed_cert(
        &cert,
        &key,
        "inference-cache-server",
        &format!("DNS:{SVC}.{SYSTEM}.svc"),
    );
    let server = engine::serve(&[
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
    ]);
    let mut args = kube_args(&cluster);
    args.extend(server_overrides(&server));
    args.extend([
        "--tls-ca-file".into(),
        cert.display().to_string(),
        "--json".into(),
    ]);
    let (_, out) = doctor(&args);
    let report: Value = serde_json::from_str(&out).unwrap();
    let deployment = check(&report, "kube.server.deployment");
    assert_eq!(
        deployment["detail"], "deploy/inference-cache-server: 1/1 replicas ready, TLS",
        "{report:#}"
    );
    let grpc = check(&report, "server.grpc");
    assert_eq!(grpc["status"], "ok", "{report:#}");
    assert!(
        grpc["detail"]
            .as_str()
            .unwrap()
            .ends_with("answers gRPC (TLS)"),
        "{report:#}"
    );
    assert_eq!(check(&report, "lookup")["status"], "ok", "{report:#}");

    // A typed --tls-server-name wins, and a wrong one fails the handshake
    // with the fix that names it.
    args.extend(["--tls-server-name".into(), "localhost".into()]);
    let (code, out) = doctor(&args);
    assert_eq!(code, 1, "{out}");
    let report: Value = serde_json::from_str(&out).unwrap();
    let grpc = check(&report, "server.grpc");
    assert_eq!(grpc["status"], "fail", "{report:#}");
    assert!(
        grpc["remediation"]
            .as_str()
            .unwrap()
            .contains("--tls-server-name a name in it"),
        "{report:#}"
    );
}

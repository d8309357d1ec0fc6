//! `config/default` on a real single-node Kubernetes (testkit's
//! `kube_node`: kubelet, containerd, scheduler, controller-manager,
//! kube-proxy), from the image `.ci/build-image` made, as a new user would
//! install it: `kubectl apply -k config/default` on a plain cluster (no
//! cert-manager, no CoreDNS; the harness's dnsmasq answers Service names).
//!
//! One test, in the order a user meets things:
//! server and operator Available with zero restarts and the webhook CA
//! injected; a labelled engine pod (the stand-in engine image, since no GPU
//! engine runs here) gets the sidecar, which becomes ready and whose reports
//! reach the server (CacheIndex lists the replica, LookupRoute routes to
//! it); deleting the server pod loses nothing the sidecar holds (resync);
//! a CachePolicy changes LookupRoute's answer; the validating webhook
//! rejects a second CachePolicy; without the server the operators turn
//! NotReady (their `/readyz` says why) and the webhook still judges.
//!
//! The product image is built by `.ci/build-image` from the binary this test
//! build made (so it is never stale; about 20 s with the base cached), or
//! taken from INFERENCECACHE_IMAGE_ARCHIVE (e.g. the release image:
//! `INFERENCECACHE_IMAGE_ARCHIVE=$(.ci/build-image | tail -n 1)`). The
//! stand-in engine image comes from `.ci/build-image standin-engine`
//! (INFERENCECACHE_STANDIN_ENGINE_ARCHIVE overrides). Needs root,
//! `.ci/build-kube-apiserver` and `.ci/build-kube-node`; skips without
//! them, fails under INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use inferencecache_proto::v1alpha1::LookupRouteRequest;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_testkit::kube_node::{Node, node_binaries};
use inferencecache_testkit::{require, which};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const NS: &str = "inference-cache-system";
const TEAM: &str = "team-a";
const MODEL: &str = "m";

fn archive(env: &str, file: &str) -> Option<PathBuf> {
    let p = std::env::var(env).map_or_else(
        |_| PathBuf::from("/var/cache/inferencecache/image").join(file),
        PathBuf::from,
    );
    require(
        p.is_file(),
        &format!("image archive {} (run .ci/build-image)", p.display()),
    )
    .then_some(p)
}

/// Polls `f` until it returns `Some`, or panics with `what` and the node's
/// logs after `timeout`.
async fn eventually<T, F, Fut>(node: &Node, timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not after {timeout:?}\n{}\n{}",
            describe(node),
            node.diagnostics()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn describe(node: &Node) -> String {
    let pods = node.kubectl(&["get", "pods", "-A", "-o", "wide"]);
    let events = node.kubectl(&["get", "events", "-A", "--sort-by=.lastTimestamp"]);
    let logs = node.kubectl(&[
        "logs",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/name",
        "--all-containers",
        "--tail=20",
    ]);
    format!(
        "{}\n{}\n{}",
        String::from_utf8_lossy(&pods.stdout),
        String::from_utf8_lossy(&events.stdout)
            .lines()
            .rev()
            .take(25)
            .collect::<Vec<_>>()
            .join("\n"),
        String::from_utf8_lossy(&logs.stdout)
    )
}

fn apply(node: &Node, yaml: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new("kubectl")
        .arg(format!("--kubeconfig={}", node.kubeconfig.display()))
        .args(["apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn jsonpath(node: &Node, args: &[&str], path: &str) -> String {
    let mut a = args.to_vec();
    let jp = format!("jsonpath={path}");
    a.extend_from_slice(&["-o", &jp]);
    String::from_utf8_lossy(&node.kubectl(&a).stdout).into_owned()
}

/// LookupRoute as a gateway asks it: the prompt's token ids.
async fn lookup(server: &str) -> Option<(String, Vec<(String, i32)>)> {
    let mut client = InferenceCacheClient::connect(format!("http://{server}"))
        .await
        .ok()?;
    let r = client
        .lookup_route(LookupRouteRequest {
            model_id: MODEL.into(),
            tenant_id: TEAM.into(),
            hash_scheme: "vllm".into(),
            // One token past the engine's 128 cached ones: the engine (and
            // the default ranking) never reuses the block holding a
            // prompt's last token.
            token_ids: (0..129).collect(),
            ..Default::default()
        })
        .await
        .ok()?
        .into_inner();
    Some((
        r.reason_code,
        r.replica_scores
            .into_iter()
            .map(|s| (s.replica_id, s.matched_tokens))
            .collect(),
    ))
}

fn engine_manifests() -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {TEAM}
---
apiVersion: inferencecache.io/v1alpha1
kind: CacheBackend
metadata:
  name: standin
  namespace: {TEAM}
spec:
  runtime: VLLM
  integration:
    mode: EventsOnly
  engineSelector:
    matchLabels:
      inferencecache.io/cache-domain: standin
  observation:
    modelID: {MODEL}
---
apiVersion: v1
kind: Pod
metadata:
  name: engine-0
  namespace: {TEAM}
  labels:
    inferencecache.io/cache-domain: standin
spec:
  containers:
  - name: engine
    image: inferencecache-standin-engine:dev
    imagePullPolicy: Never
    args: ["--port=8000"]
    env:
    - name: STANDIN_REPUBLISH_FOR
      value: "40"
    ports:
    - containerPort: 8000
"#
    )
}

fn policy(name: &str, min_tokens: u32) -> String {
    format!(
        "apiVersion: inferencecache.io/v1alpha1\nkind: CachePolicy\nmetadata:\n  name: {name}\n  namespace: {TEAM}\nspec:\n  minimumMatchedTokens: {min_tokens}\n"
    )
}

/// The product image: the given archive, or one `.ci/build-image` makes
/// from this build's binary.
fn product_image() -> Option<PathBuf> {
    if std::env::var_os("INFERENCECACHE_IMAGE_ARCHIVE").is_some() {
        return archive("INFERENCECACHE_IMAGE_ARCHIVE", "inferencecache-dev.tar");
    }
    if !require(
        which("podman") && which("mmdebstrap"),
        "podman and mmdebstrap for .ci/build-image (run .ci/build-kube-node)",
    ) {
        return None;
    }
    let out = std::process::Command::new("bash")
        .arg(common::repo_root().join(".ci/build-image"))
        .env("INFERENCECACHE_BINARY", common::BIN)
        .env("IMAGE_TAG", "dev")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        ".ci/build-image: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .map(PathBuf::from)
        .expect("archive path");
    assert!(path.is_file(), "{}", path.display());
    Some(path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_default_serves_routed_traffic_on_a_real_node() {
    let Some(bins) = node_binaries() else { return };
    let (Some(image), Some(engine)) = (
        product_image(),
        archive(
            "INFERENCECACHE_STANDIN_ENGINE_ARCHIVE",
            "inferencecache-standin-engine-dev.tar",
        ),
    ) else {
        return;
    };
    let t0 = Instant::now();
    let node = tokio::task::spawn_blocking(move || Node::start(&bins, &[image, engine]))
        .await
        .unwrap();
    eprintln!("node up in {:?}", t0.elapsed());

    // --- install: server + operator Available, zero restarts ---------------
    let config = common::repo_root().join("config/default");
    node.kubectl_ok(&["apply", "-k", config.to_str().unwrap()]);
    let t1 = Instant::now();
    eventually(
        &node,
        Duration::from_secs(240),
        "both Deployments Available",
        || async {
            node.kubectl(&[
                "wait",
                "-n",
                NS,
                "--for=condition=Available",
                "deployment",
                "--all",
                "--timeout=5s",
            ])
            .status
            .success()
            .then_some(())
        },
    )
    .await;
    eprintln!("config/default Available in {:?}", t1.elapsed());
    let ready = jsonpath(
        &node,
        &["get", "deploy", "-n", NS],
        "{range .items[*]}{.metadata.name}={.status.readyReplicas}/{.spec.replicas} {end}",
    );
    assert!(ready.contains("inference-cache-controller=2/2"), "{ready}");
    assert!(ready.contains("inference-cache-server=1/1"), "{ready}");
    let restarts = jsonpath(
        &node,
        &["get", "pods", "-n", NS],
        "{.items[*].status.containerStatuses[*].restartCount}",
    );
    assert!(
        restarts.split_whitespace().all(|n| n == "0"),
        "restarts: {restarts}\n{}",
        describe(&node)
    );
    // The operator made its own webhook certificate and injected the CA.
    let ca = jsonpath(
        &node,
        &[
            "get",
            "validatingwebhookconfiguration",
            "inference-cache-validating-webhook-configuration",
        ],
        "{.webhooks[0].clientConfig.caBundle}",
    );
    assert!(ca.len() > 100, "no caBundle injected: {ca:?}");

    // --- an engine pod gets the sidecar, its reports reach the server ------
    let out = apply(&node, &engine_manifests());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let containers = jsonpath(
        &node,
        &["get", "pod", "-n", TEAM, "engine-0"],
        "{.spec.containers[*].name}",
    );
    assert_eq!(containers, "engine kvevent-subscriber", "sidecar injected");
    eventually(
        &node,
        Duration::from_secs(180),
        "engine pod Ready (sidecar probes pass)",
        || async {
            node.kubectl(&[
                "wait",
                "-n",
                TEAM,
                "--for=condition=Ready",
                "pod/engine-0",
                "--timeout=5s",
            ])
            .status
            .success()
            .then_some(())
        },
    )
    .await;
    let server_ip = jsonpath(
        &node,
        &["get", "svc", "-n", NS, "inference-cache-server"],
        "{.spec.clusterIP}",
    );
    let server = format!("{server_ip}:9090");
    let routed = |want_reason: &'static str| {
        let server = server.clone();
        move || {
            let server = server.clone();
            async move {
                let (reason, scores) = lookup(&server).await?;
                (reason == want_reason
                    && scores
                        .first()
                        .is_some_and(|(r, m)| r == "engine-0" && *m == 128))
                .then_some(())
            }
        }
    };
    eventually(
        &node,
        Duration::from_secs(120),
        "LookupRoute routes the prompt to engine-0",
        routed("PREFIX_MATCH"),
    )
    .await;
    eventually(
        &node,
        Duration::from_secs(120),
        "CacheIndex status lists engine-0",
        || async {
            let ids = jsonpath(
                &node,
                &["get", "cacheindex", "cluster-default"],
                "{.status.replicas[*].id}",
            );
            ids.split_whitespace()
                .any(|id| id == "engine-0")
                .then_some(())
        },
    )
    .await;
    let matched = jsonpath(
        &node,
        &["get", "cachebackend", "-n", TEAM, "standin"],
        "{.status.matchedEnginePods}",
    );
    assert_eq!(matched, "1", "CacheBackend counts its engine pod");

    // --- the server pod is deleted: the sidecar's state comes back --------
    // The stand-in stops re-publishing 40 s after it started, so from then
    // on only the sidecar's resync can refill a new server (waited for below).
    let quiet = || async {
        let logs = node.kubectl(&["logs", "-n", TEAM, "engine-0", "-c", "engine"]);
        String::from_utf8_lossy(&logs.stdout)
            .contains("quiet from now on")
            .then_some(())
    };
    eventually(
        &node,
        Duration::from_secs(90),
        "the stand-in engine went quiet",
        quiet,
    )
    .await;
    let old = jsonpath(
        &node,
        &[
            "get",
            "pods",
            "-n",
            NS,
            "-l",
            "app.kubernetes.io/name=inference-cache-server",
        ],
        "{.items[0].metadata.name}",
    );
    node.kubectl_ok(&["delete", "pod", "-n", NS, &old, "--wait=true"]);
    eventually(
        &node,
        Duration::from_secs(180),
        "a new server pod is Ready",
        || async {
            let name = jsonpath(
                &node,
                &[
                    "get",
                    "pods",
                    "-n",
                    NS,
                    "-l",
                    "app.kubernetes.io/name=inference-cache-server",
                ],
                "{.items[?(@.status.containerStatuses[0].ready==true)].metadata.name}",
            );
            (!name.is_empty() && name != old).then_some(())
        },
    )
    .await;
    eventually(
        &node,
        Duration::from_secs(120),
        "the sidecar resyncs the new server",
        routed("PREFIX_MATCH"),
    )
    .await;

    // --- a CachePolicy changes LookupRoute's answer ------------------------
    let out = apply(&node, &policy("default", 1000));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        &node,
        Duration::from_secs(90),
        "the CachePolicy reaches LookupRoute",
        || {
            let server = server.clone();
            async move {
                let (reason, _) = lookup(&server).await?;
                (reason != "PREFIX_MATCH").then_some(reason)
            }
        },
    )
    .await;

    // --- the validating webhook rejects a second CachePolicy ---------------
    let out = apply(&node, &policy("second", 10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("denied the request"),
        "{err}"
    );

    // --- the server goes away: operators turn unready, admission goes on ---
    node.kubectl_ok(&[
        "scale",
        "-n",
        NS,
        "deploy/inference-cache-server",
        "--replicas=0",
    ]);
    eventually(
        &node,
        Duration::from_secs(120),
        "operators report NotReady without the server",
        || async {
            let ready = jsonpath(
                &node,
                &["get", "deploy", "-n", NS, "inference-cache-controller"],
                "{.status.readyReplicas}",
            );
            (ready.is_empty() || ready == "0").then_some(())
        },
    )
    .await;
    let pod = jsonpath(
        &node,
        &[
            "get",
            "pods",
            "-n",
            NS,
            "-l",
            "app.kubernetes.io/name=inference-cache-controller",
        ],
        "{.items[0].metadata.name}",
    );
    let why = node.kubectl(&[
        "get",
        "--raw",
        &format!("/api/v1/namespaces/{NS}/pods/{pod}:8081/proxy/readyz"),
    ]);
    let body = format!(
        "{}{}",
        String::from_utf8_lossy(&why.stdout),
        String::from_utf8_lossy(&why.stderr)
    );
    assert!(
        !why.status.success(),
        "readyz answered 200 without a server: {body}"
    );
    // Not-ready operators still answer admission reviews.
    let out = apply(&node, &policy("third", 10));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("denied the request"),
        "the webhook must still judge (not fail) while the server is down: {err}"
    );
    eprintln!("node suite done in {:?}", t0.elapsed());
    drop(node);
}

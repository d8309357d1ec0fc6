//! `inferencecache operator` end to end: a real kube-apiserver + etcd, the
//! real `inferencecache serve` binary and the real `inferencecache operator`
//! binary. CRDs go in through `inferencecache crds | kubectl apply -f -`
//! (the README's tour). Lookups go through the server's gRPC API, so each
//! assertion is on what a gateway would see.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::BIN;
use inferencecache_operator::crd::{CacheIndex, CachePolicy, CacheTenant};
use inferencecache_operator::testing::{
    Cluster, Proc, apiserver_binary, free_port, require, which,
};
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::{
    CacheStateUpdate, LookupRouteRequest, PrefixEntry, ReplicaStats,
};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TENANT: &str = "team-a";
const MODEL: &str = "m";

/// A server on fixed loopback ports (so a restart keeps its address).
struct Server {
    grpc: u16,
    http: u16,
    control: u16,
    proc: Option<Proc>,
}

impl Server {
    fn start() -> Self {
        let mut s = Self {
            grpc: free_port(),
            http: free_port(),
            control: free_port(),
            proc: None,
        };
        s.restart();
        s
    }

    fn restart(&mut self) {
        self.proc.take();
        let child = Command::new(BIN)
            .args(["serve", "--insecure-disable-auth"])
            .arg(format!("--grpc-bind-address=127.0.0.1:{}", self.grpc))
            .arg(format!("--http-bind-address=127.0.0.1:{}", self.http))
            .arg(format!(
                "--snapshot-bind-address=127.0.0.1:{}",
                self.control
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.proc = Some(Proc(child));
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.grpc)).is_err() {
            assert!(Instant::now() < deadline, "server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(&mut self) {
        self.proc.take();
    }

    fn control_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.control)
    }

    async fn client(&self) -> InferenceCacheClient<tonic::transport::Channel> {
        InferenceCacheClient::connect(format!("http://127.0.0.1:{}", self.grpc))
            .await
            .unwrap()
    }

    /// Reports `prefixes` (100 tokens each) on replica `r1` with stats.
    async fn ingest(&self, prefixes: &[&str]) {
        let update = CacheStateUpdate {
            replica_id: "r1".into(),
            model_id: MODEL.into(),
            tenant_id: TENANT.into(),
            hash_scheme: "vllm".into(),
            prefixes: prefixes
                .iter()
                .map(|p| PrefixEntry {
                    prefix_hash: p.as_bytes().to_vec(),
                    token_count: 100,
                    ..Default::default()
                })
                .collect(),
            stats: Some(ReplicaStats {
                replica_id: "r1".into(),
                hit_rate: 0.5,
                pressure: 0.25,
                cache_memory_bytes: 1024,
                ..Default::default()
            }),
            ..Default::default()
        };
        self.client()
            .await
            .report_cache_state(futures::stream::iter(vec![update]))
            .await
            .unwrap();
    }

    /// The value of the sample `series` (name and labels exactly as
    /// exposed) on the server's `/metrics`; 0 when absent.
    fn metric(&self, series: &str) -> f64 {
        let (_, body) = common::http_get(&format!("127.0.0.1:{}", self.http), "/metrics");
        body.lines()
            .find_map(|l| {
                l.strip_prefix(series)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0.0)
    }

    /// The reason code of a lookup for prefix `p1` in `tenant`.
    async fn lookup(&self, tenant: &str) -> String {
        self.client()
            .await
            .lookup_route(LookupRouteRequest {
                model_id: MODEL.into(),
                tenant_id: tenant.into(),
                hash_scheme: "vllm".into(),
                prefix_hash: b"p1".to_vec(),
                prefix_token_count: 100,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .reason_code
    }
}

struct OperatorProc {
    proc: Option<Proc>,
    metrics: u16,
    health: u16,
    log: std::path::PathBuf,
}

impl OperatorProc {
    fn start(cluster: &Cluster, server: &Server, extra: &[&str], name: &str) -> Self {
        let (metrics, health) = (free_port(), free_port());
        let log = cluster.dir.join(format!("{name}.log"));
        let child = Command::new(BIN)
            .arg("operator")
            .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
            .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
            .arg(format!("--health-probe-bind-address=127.0.0.1:{health}"))
            .arg("--webhook-bind-address=")
            .arg(format!(
                "--server-policy-url={}",
                server.control_url("/policy")
            ))
            .arg(format!(
                "--server-snapshot-url={}",
                server.control_url("/snapshot")
            ))
            .arg(format!(
                "--server-templates-url={}",
                server.control_url("/templates")
            ))
            .arg(format!(
                "--server-pd-topologies-url={}",
                server.control_url("/pd-topologies")
            ))
            .arg("--policy-token-file=/nonexistent/token")
            .arg("--controller-token-file=/nonexistent/token")
            .arg("--cachepolicy-push-interval=2s")
            .arg("--cacheindex-refresh-interval=1s")
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Self {
            proc: Some(Proc(child)),
            metrics,
            health,
            log,
        }
    }

    fn get(&self, port: u16, path: &str) -> (String, String) {
        common::http_get(&format!("127.0.0.1:{port}"), path)
    }

    /// SIGTERM, then the exit status.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut p = self.proc.take().unwrap();
        let ok = Command::new("kill")
            .args(["-s", "TERM", &p.0.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = p.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn metrics_text(&self) -> String {
        self.get(self.metrics, "/metrics").1
    }

    fn kill(&mut self) {
        self.proc.take();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The distinct-prefix quota the server holds for `tenant`, from
/// `/ui/state` (which lists only tenants with something indexed).
async fn server_quota(server: &Server, tenant: &str) -> Option<i64> {
    let body = reqwest::get(server.control_url("/ui/state"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let state: serde_json::Value = serde_json::from_str(&body).ok()?;
    state["tenants"]
        .as_array()?
        .iter()
        .find(|t| t["tenantId"] == tenant)?["quota"]
        .as_i64()
}

/// Polls `f` until it returns true or `within` passes.
async fn eventually<F, Fut>(within: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + within;
    loop {
        if f().await {
            return;
        }
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Applies `inferencecache crds` and waits until every CRD is Established;
/// returns how many there are.
fn install_crds_with_kubectl(cluster: &Cluster) -> usize {
    let crds = Command::new(BIN).arg("crds").output().unwrap();
    assert!(crds.status.success());
    let kinds = String::from_utf8_lossy(&crds.stdout)
        .matches("kind: CustomResourceDefinition")
        .count();
    let mut kubectl = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", cluster.kubeconfig.display()))
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    kubectl
        .stdin
        .take()
        .unwrap()
        .write_all(&crds.stdout)
        .unwrap();
    let out = kubectl.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wait = cluster.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "--all",
        "--timeout=30s",
    ]);
    assert!(
        wait.status.success(),
        "{}",
        String::from_utf8_lossy(&wait.stderr)
    );
    kinds
}

async fn setup() -> Option<Cluster> {
    let bin = apiserver_binary()?;
    if !require(which("kubectl"), "kubectl") {
        return None;
    }
    let cluster = Cluster::start(&bin).await;
    let kinds = install_crds_with_kubectl(&cluster);
    // Discovery catches up with new CRDs a moment after Established.
    let client = cluster.client().await;
    eventually(
        Duration::from_secs(10),
        "discovery serves every CRD",
        || {
            let client = client.clone();
            async move {
                kube::discovery::group(&client, "inferencecache.io")
                    .await
                    .is_ok_and(|g| g.recommended_resources().len() >= kinds)
            }
        },
    )
    .await;
    cluster.namespace(TENANT).await;
    Some(cluster)
}

fn cachepolicy(name: &str, spec: serde_json::Value) -> CachePolicy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "inferencecache.io/v1alpha1", "kind": "CachePolicy",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cachepolicy_lifecycle_reaches_lookups_and_survives_a_server_restart() {
    let Some(cluster) = setup().await else { return };
    let mut server = Server::start();
    server.ingest(&["p1"]).await;
    assert_eq!(
        server.lookup(TENANT).await,
        "PREFIX_MATCH",
        "defaults: 100 ≥ 64 tokens"
    );
    let op = OperatorProc::start(&cluster, &server, &[], "operator");
    let client = cluster.client().await;
    let policies: Api<CachePolicy> = Api::namespaced(client.clone(), TENANT);

    // Create: a matched-tokens floor above the prefix turns the match off.
    policies
        .create(
            &PostParams::default(),
            &cachepolicy("p", serde_json::json!({"minimumMatchedTokens": 200})),
        )
        .await
        .unwrap();
    let t0 = Instant::now();
    eventually(
        Duration::from_secs(2),
        "create reaches LookupRoute",
        || async { server.lookup(TENANT).await == "AFFINITY_HINT" },
    )
    .await;
    eprintln!("create → LookupRoute in {:?}", t0.elapsed());
    assert!(op.get(op.health, "/healthz").0.contains(" 200"), "healthz");
    assert!(op.get(op.health, "/readyz").0.contains(" 200"), "readyz");
    // /templates and /pd-topologies are pushed too; a server without them
    // (404) is "unsupported", never an error that holds up the policy.
    // They go out after the policy, so give them a moment on a loaded machine.
    for target in ["templates", "pd-topologies"] {
        let pushed = |m: &str| {
            m.contains(&format!("{{target=\"{target}\",result=\"ok\"}}"))
                || m.contains(&format!("{{target=\"{target}\",result=\"unsupported\"}}"))
        };
        eventually(Duration::from_secs(10), target, || {
            let m = op.metrics_text();
            async move { pushed(&m) }
        })
        .await;
        let m = op.metrics_text();
        assert!(
            !m.contains(&format!("{{target=\"{target}\",result=\"error\"}}")),
            "{m}"
        );
    }

    // Edit: affinity off too → NO_HINT.
    policies
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"affinityRouting": "Disabled"}})),
        )
        .await
        .unwrap();
    eventually(
        Duration::from_secs(2),
        "edit reaches LookupRoute",
        || async { server.lookup(TENANT).await == "NO_HINT" },
    )
    .await;

    // A policy the operator cannot read (no webhook here) in another
    // namespace does not stop this one from being pushed.
    cluster.namespace("broken").await;
    Api::<CachePolicy>::namespaced(client.clone(), "broken")
        .create(
            &PostParams::default(),
            &cachepolicy("bad", serde_json::json!({"evictionTTL": "forever"})),
        )
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "bad CR counted", || async {
        op.metrics_text().contains(
            "inferencecache_operator_push_skipped_total{kind=\"CachePolicy\",reason=\"invalid\"}",
        )
    })
    .await;
    assert_eq!(
        server.lookup(TENANT).await,
        "NO_HINT",
        "team-a keeps its policy"
    );

    // Server killed: pushes fail, are retried and counted; the operator lives.
    server.stop();
    eventually(Duration::from_secs(10), "failed pushes counted", || async {
        op.metrics_text()
            .contains("inferencecache_operator_pushes_total{target=\"policy\",result=\"error\"}")
    })
    .await;
    server.restart();
    server.ingest(&["p1"]).await;
    // Within one push interval (2 s) plus the retry backoff in flight.
    eventually(
        Duration::from_secs(4),
        "policy back after restart",
        || async { server.lookup(TENANT).await == "NO_HINT" },
    )
    .await;

    // Delete: defaults again.
    policies
        .delete("p", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        Duration::from_secs(2),
        "delete reverts to defaults",
        || async { server.lookup(TENANT).await == "PREFIX_MATCH" },
    )
    .await;
    assert!(
        op.log().contains("left out of the policy push"),
        "{}",
        op.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cachepolicy_routing_switches_the_ranking_and_the_push_version() {
    let Some(cluster) = setup().await else { return };
    let server = Server::start();
    server.ingest(&["p1"]).await;
    let _op = OperatorProc::start(&cluster, &server, &[], "operator");
    let client = cluster.client().await;
    let policies: Api<CachePolicy> = Api::namespaced(client.clone(), TENANT);
    let version = "inferencecache_policy_version";
    let ranked = |r: &str| format!("inferencecache_lookup_route_rankings_total{{ranking=\"{r}\"}}");

    // No `routing` anywhere: version 7, the server's own ranking (ttft).
    policies
        .create(
            &PostParams::default(),
            &cachepolicy("p", serde_json::json!({"minimumMatchedTokens": 64})),
        )
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "version 7 pushed", || async {
        server.metric(version) == 7.0
    })
    .await;
    server.lookup(TENANT).await;
    assert_eq!(server.metric(&ranked("contract")), 0.0);

    // `routing.ranking: Contract` → version 8, and lookups of the tenant
    // are answered by the contract ranking.
    policies
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"routing": {"ranking": "Contract"}}})),
        )
        .await
        .unwrap();
    eventually(
        Duration::from_secs(5),
        "routing reaches LookupRoute",
        || async {
            server.lookup(TENANT).await;
            server.metric(version) == 8.0 && server.metric(&ranked("contract")) > 0.0
        },
    )
    .await;
    let stored = policies.get("p").await.unwrap();
    assert_eq!(
        stored.spec.routing.and_then(|r| r.ranking),
        Some(inferencecache_operator::crd::Ranking::Contract)
    );

    // Removed again: back to version 7 and the server's ranking.
    policies
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"routing": null}})),
        )
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "version 7 again", || async {
        server.metric(version) == 7.0
    })
    .await;
    let contract = server.metric(&ranked("contract"));
    let ttft = server.metric(&ranked("ttft"));
    server.lookup(TENANT).await;
    assert_eq!(server.metric(&ranked("contract")), contract);
    assert_eq!(server.metric(&ranked("ttft")), ttft + 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cacheindex_and_cachetenant_status_follow_the_snapshot() {
    let Some(cluster) = setup().await else { return };
    let server = Server::start();
    let op = OperatorProc::start(&cluster, &server, &[], "operator");
    let client = cluster.client().await;
    let tenants: Api<CacheTenant> = Api::namespaced(client.clone(), TENANT);
    tenants
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheTenant",
                "metadata": {"name": "t"},
                "spec": {"tenantID": TENANT, "quota": {"maxIndexEntries": 2}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let indices: Api<CacheIndex> = Api::all(client.clone());
    eventually(
        Duration::from_secs(10),
        "CacheIndex singleton created",
        || async {
            indices
                .get_opt("cluster-default")
                .await
                .unwrap()
                .and_then(|c| c.status)
                .and_then(|s| s.observed_server)
                .is_some()
        },
    )
    .await;

    // The quota reaches the server: three prefixes, two kept. A quota is
    // enforced when the tenant's prefixes are stored, so it must be in force
    // before they arrive. "Some push succeeded" does not say so: the
    // operator's first push can predate its sight of the CacheTenant. So the
    // tenant gets one prefix (making it visible in /ui/state, which shows
    // the quota the server holds for each indexed tenant), and the rest
    // follow once the server reports the quota.
    server.ingest(&["p1"]).await;
    eventually(
        Duration::from_secs(10),
        "quota in force on the server",
        || async { server_quota(&server, TENANT).await == Some(2) },
    )
    .await;
    server.ingest(&["p2", "p3"]).await;
    eventually(
        Duration::from_secs(5),
        "CacheIndex follows /snapshot",
        || async {
            let Some(s) = indices.get("cluster-default").await.unwrap().status else {
                return false;
            };
            s.prefixes.is_some_and(|p| p.summary.total == 2)
                && s.replicas.iter().any(|r| {
                    r.id == "r1"
                        && r.tenant.as_deref() == Some(TENANT)
                        && r.hit_rate.as_deref() == Some("0.5")
                })
                && s.tenants
                    .iter()
                    .any(|t| t.id == TENANT && t.index_entries == Some(2))
        },
    )
    .await;
    eventually(
        Duration::from_secs(5),
        "CacheTenant status follows /snapshot",
        || async {
            let Some(s) = tenants.get("t").await.unwrap().status else {
                return false;
            };
            s.index_entries == Some(2)
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
                && s.conditions
                    .iter()
                    .any(|c| c.type_ == "QuotaExceeded" && c.reason == "WithinBudget")
        },
    )
    .await;
    // CacheBackend participation: the replica is pod r1 in team-a, selected
    // by the backend's cache domain.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), TENANT);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "r1", "labels": {"inferencecache.io/cache-domain": "qwen"}},
            "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    let backends: Api<inferencecache_operator::crd::CacheBackend> =
        Api::namespaced(client.clone(), TENANT);
    backends
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "inferencecache.io/v1alpha1", "kind": "CacheBackend",
                "metadata": {"name": "qwen"},
                "spec": {"runtime": "VLLM",
                         "engineSelector": {"matchLabels": {"inferencecache.io/cache-domain": "qwen"}}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    eventually(
        Duration::from_secs(5),
        "CacheBackend participation",
        || async {
            backends
                .get("qwen")
                .await
                .unwrap()
                .status
                .and_then(|s| s.index_participation)
                .is_some_and(|p| p.prefix_count == 2)
        },
    )
    .await;

    // Soft state: no writes while nothing changes.
    let stamp = indices
        .get("cluster-default")
        .await
        .unwrap()
        .status
        .unwrap()
        .last_updated;
    // Three more snapshot polls (one a second): three chances to write.
    let polls = || {
        series_sum(
            &op.metrics_text(),
            "inferencecache_operator_snapshot_polls_total",
        )
    };
    let before = polls();
    eventually(Duration::from_secs(15), "three more snapshot polls", || {
        let now = polls();
        async move { now >= before + 3.0 }
    })
    .await;
    assert_eq!(
        indices
            .get("cluster-default")
            .await
            .unwrap()
            .status
            .unwrap()
            .last_updated,
        stamp,
        "lastUpdated moves only on change"
    );
}

/// The lease's last renewal time, as the API server has it.
async fn renew_time(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("inference-cache-controller-leader-lock")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.renew_time)
        .map(|t| format!("{:?}", t.0))
}

/// The sum of every sample of `name` (any labels) in a metrics body.
fn series_sum(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt("inference-cache-controller-leader-lock")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_operators_elect_exactly_one_leader_and_fail_over() {
    let Some(cluster) = setup().await else { return };
    cluster.namespace("inference-cache-system").await;
    let server = Server::start();
    let elect = |id: &'static str| {
        [
            "--leader-elect",
            "--leader-elect-namespace=inference-cache-system",
            "--leader-elect-lease-duration=3s",
            "--leader-elect-retry-period=500ms",
        ]
        .into_iter()
        .map(str::to_owned)
        .chain([format!("--leader-elect-id={id}")])
        .collect::<Vec<_>>()
    };
    let args_a = elect("a");
    let args_b = elect("b");
    let mut a = OperatorProc::start(
        &cluster,
        &server,
        &args_a.iter().map(String::as_str).collect::<Vec<_>>(),
        "a",
    );
    let mut b = OperatorProc::start(
        &cluster,
        &server,
        &args_b.iter().map(String::as_str).collect::<Vec<_>>(),
        "b",
    );
    let leases: Api<Lease> = Api::namespaced(cluster.client().await, "inference-cache-system");
    eventually(Duration::from_secs(10), "a leader", || async {
        holder(&leases).await.is_some()
    })
    .await;
    // Both settle: exactly one reports leadership once the holder has
    // renewed the lease twice more (each renewal is a retry period in which
    // the other replica could have taken it).
    let mut renewals = vec![renew_time(&leases).await];
    let deadline = Instant::now() + Duration::from_secs(15);
    while renewals.len() < 3 {
        let t = renew_time(&leases).await;
        if renewals.last() != Some(&t) {
            renewals.push(t);
        }
        assert!(Instant::now() < deadline, "the lease was not renewed twice");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leading = |o: &OperatorProc| {
        o.metrics_text()
            .contains("inferencecache_operator_leader 1\n")
    };
    assert!(
        leading(&a) ^ leading(&b),
        "exactly one leads:\n{}\n{}",
        a.log(),
        b.log()
    );
    let first = holder(&leases).await.unwrap();
    assert_eq!(
        first == "a",
        leading(&a),
        "the Lease names the reporting leader"
    );

    // Kill the leader hard (no release): the other takes over after the
    // lease expires.
    let (dead, survivor) = if first == "a" {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    dead.kill();
    let t0 = Instant::now();
    eventually(
        Duration::from_secs(10),
        "the standby takes over",
        || async { holder(&leases).await.as_deref() != Some(first.as_str()) && leading(survivor) },
    )
    .await;
    eprintln!("failover in {:?}", t0.elapsed());

    // Graceful shutdown: SIGTERM exits 0 and releases the Lease at once.
    let survivor = if first == "a" { &mut b } else { &mut a };
    let status = survivor.terminate();
    assert!(status.success(), "{status:?}\n{}", survivor.log());
    assert_eq!(holder(&leases).await, None, "released on shutdown");
}

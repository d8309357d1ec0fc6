//! The sidecar against a server that authorizes producers (issue 19):
//! it presents the token of `--server-token-file` and picks up a rotated
//! token on reconnect (real kube-apiserver + etcd, TokenRequest); and when
//! the server's ingest limit pushes back it waits, resyncs, and loses
//! nothing (mTLS identity, certificates from rcgen). The apiserver test is
//! skipped with a printed reason when the binaries are absent, unless
//! INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use inferencecache_server::config::TlsFiles;
use inferencecache_server::producer::ratelimit::Limits;
use inferencecache_server::producer::{DEFAULT_PRODUCER_AUDIENCE, ProducerAuth, ProducerConfig};
use inferencecache_server::{Server, ServerConfig};
use inferencecache_subscriber::forward::{ForwardConfig, Identity, ServerTls};
use inferencecache_subscriber::loopback::{LoopbackEngine, Stored, churn_batch, stored_batch};
use inferencecache_subscriber::mapping::MappingConfig;
use inferencecache_subscriber::sidecar::{self, SidecarConfig};
use inferencecache_subscriber::{DecodeOptions, TransportConfig};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DeleteParams, PostParams};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tokio_util::sync::CancellationToken;

const TENANT: &str = "team-a";

struct RunningServer {
    grpc: SocketAddr,
    control: SocketAddr,
    http: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), inferencecache_server::ServeError>>,
}

impl RunningServer {
    async fn start(config: ServerConfig) -> Self {
        let server = Server::bind(&config).await.unwrap();
        let (grpc, control, http) = (
            server.grpc_addr(),
            server.control_addr(),
            server.http_addr(),
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn(server.serve(stop.clone()));
        Self {
            grpc,
            control,
            http,
            stop,
            task,
        }
    }

    async fn total_prefixes(&self) -> i64 {
        let body = reqwest::get(format!("http://{}/snapshot", self.control))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let snap: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        snap["totalPrefixes"].as_i64().unwrap_or(-1)
    }

    async fn wait_prefixes(&self, want: i64, within: Duration) -> i64 {
        let deadline = Instant::now() + within;
        loop {
            let n = self.total_prefixes().await;
            if n == want || Instant::now() > deadline {
                return n;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn metrics(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.http))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

fn sidecar_config(
    engine: &LoopbackEngine,
    grpc: SocketAddr,
    forward: ForwardConfig,
) -> SidecarConfig {
    SidecarConfig {
        transport: TransportConfig {
            engine_endpoint: engine.endpoint.clone(),
            topic: "kv-events".into(),
            ..TransportConfig::default()
        },
        first_rank: 0,
        ranks: 1,
        mapping: MappingConfig::default(),
        decode: DecodeOptions::default(),
        forward: ForwardConfig {
            server: grpc.to_string(),
            identity: Identity {
                replica_id: "r1".into(),
                model_id: "m".into(),
                tenant_id: TENANT.into(),
                hash_scheme: "vllm".into(),
            },
            window: Duration::from_millis(20),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_millis(400),
            ..forward
        },
        stats: None,
        http_bind: None,
    }
}

/// Chain `i`: 4 blocks of 16 distinct tokens, engine hashes 4i+1..4i+4.
fn chain(i: u64) -> Stored {
    let t = u32::try_from(i).unwrap() * 64;
    Stored {
        hashes: (4 * i + 1..=4 * i + 4).collect(),
        parent: None,
        tokens: t..t + 64,
    }
}

async fn wait_up(metrics: &inferencecache_subscriber::metrics::SidecarMetrics) {
    for _ in 0..400 {
        if metrics.server_up() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("sidecar never connected");
}

/// Publishes `payload` until the server holds `want` prefixes. What a PUB
/// sends before the sidecar's subscription has reached it is dropped (ZMQ's
/// slow joiner) and the loopback engine has no replay socket, so the batch
/// is sent again until it lands; a repeated store is idempotent.
async fn publish_until(
    engine: &mut LoopbackEngine,
    server: &RunningServer,
    payload: impl Fn() -> Vec<u8>,
    want: i64,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        engine.publish(payload()).await.unwrap();
        if server.wait_prefixes(want, Duration::from_millis(250)).await == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the server never held {want} prefixes"
        );
    }
}

fn counter(body: &str, name: &str) -> f64 {
    body.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_file_is_used_after_the_old_token_dies() {
    let Some(bin) = inferencecache_testkit::kube::apiserver_binary() else {
        return;
    };
    let cluster = inferencecache_testkit::kube::Cluster::start(&bin).await;
    cluster.service_account(TENANT, "old").await;
    cluster.service_account(TENANT, "new").await;
    let token_file = cluster.path("token");
    let old_token = cluster.mint(TENANT, "old", DEFAULT_PRODUCER_AUDIENCE).await;
    std::fs::write(&token_file, &old_token).unwrap();

    let mut config = ServerConfig::ephemeral();
    config.kubeconfig = Some(cluster.kubeconfig.clone());
    config.producer = ProducerConfig {
        auth: ProducerAuth::Token,
        // A dead token must be noticed within the test's time.
        review_ttl: Duration::from_millis(500),
        ..ProducerConfig::default()
    };
    let server = RunningServer::start(config).await;
    let mut engine = LoopbackEngine::bind("kv-events").await.unwrap();
    let cancel = CancellationToken::new();
    let running = sidecar::start(
        sidecar_config(
            &engine,
            server.grpc,
            ForwardConfig {
                token_file: Some(token_file.clone()),
                ..ForwardConfig::default()
            },
        ),
        cancel.clone(),
    )
    .await
    .unwrap();
    wait_up(&running.metrics).await;
    publish_until(
        &mut engine,
        &server,
        || stored_batch(0.0, &[chain(0)], 16),
        4,
    )
    .await;
    // The server reviewed the old token before this point; its cached
    // answer lives `review_ttl` from then.
    let reviewed_before = tokio::time::Instant::now();

    // Rotate: the kubelet writes a new token; the old one stops working
    // (its service account is gone) while the sidecar still holds it.
    std::fs::write(
        &token_file,
        cluster.mint(TENANT, "new", DEFAULT_PRODUCER_AUDIENCE).await,
    )
    .unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(cluster.client().await, TENANT);
    sas.delete("old", &DeleteParams::default()).await.unwrap();
    // The apiserver caches a successful authentication (10 s): wait until
    // it refuses the old token, then until our review cache (0.5 s) has
    // expired too.
    let reviews: Api<TokenReview> = Api::all(cluster.client().await);
    let refused_by = Instant::now() + Duration::from_secs(30);
    loop {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(old_token.clone()),
                audiences: Some(vec![DEFAULT_PRODUCER_AUDIENCE.into()]),
            },
            ..TokenReview::default()
        };
        let r = reviews
            .create(&PostParams::default(), &review)
            .await
            .unwrap();
        if !r.status.and_then(|s| s.authenticated).unwrap_or(false) {
            break;
        }
        assert!(
            Instant::now() < refused_by,
            "the apiserver still accepts the deleted account's token"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tokio::time::sleep_until(reviewed_before + Duration::from_millis(500)).await;

    // An eviction forces a PublishEvent with the old token: refused, so the
    // sidecar reconnects, re-reads the file and resyncs with the new token.
    engine
        .publish(churn_batch(0.0, &[4], &[chain(1)], 16))
        .await
        .unwrap();
    assert_eq!(
        server.wait_prefixes(7, Duration::from_secs(20)).await,
        7,
        "chain 0 minus its tail, plus chain 1"
    );
    let body = server.metrics().await;
    assert!(
        counter(
            &body,
            "inferencecache_producer_auth_total{result=\"unauthenticated\"}"
        ) >= 1.0,
        "the old token was refused\n{body}"
    );
    let m = running.metrics.encode();
    assert!(
        counter(&m, "inferencecache_subscriber_resyncs_total") >= 2.0,
        "reconnected with the new token\n{m}"
    );
    cancel.cancel();
    running.wait().await.unwrap();
    server.stop().await;
}

fn ca() -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "test ca");
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(ca: &CertifiedIssuer<'static, KeyPair>, san: &str, cn: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(vec![san.to_owned()]).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    let cert = p.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_sidecar_waits_resyncs_and_loses_nothing() {
    let dir = std::env::temp_dir().join(format!("ic-sub-throttle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |f: &str| -> PathBuf { dir.join(f) };
    let ca = ca();
    std::fs::write(path("ca.crt"), ca.pem()).unwrap();
    let (cert, key) = leaf(&ca, "localhost", "server");
    std::fs::write(path("tls.crt"), cert).unwrap();
    std::fs::write(path("tls.key"), key).unwrap();
    // The sidecar's identity is its certificate's CN: its tenant.
    let (cert, key) = leaf(&ca, "sidecar", TENANT);
    std::fs::write(path("client.crt"), cert).unwrap();
    std::fs::write(path("client.key"), key).unwrap();

    let mut config = ServerConfig::ephemeral();
    config.tls = Some(TlsFiles {
        cert: path("tls.crt"),
        key: path("tls.key"),
        client_ca: Some(path("ca.crt")),
    });
    config.producer = ProducerConfig {
        auth: ProducerAuth::Mtls,
        limits: Limits {
            blocks_per_second: 2_000,
            burst_blocks: 1_000,
            max_streams: 4,
        },
        ..ProducerConfig::default()
    };
    let server = RunningServer::start(config).await;
    let mut engine = LoopbackEngine::bind("kv-events").await.unwrap();
    let cancel = CancellationToken::new();
    let running = sidecar::start(
        sidecar_config(
            &engine,
            server.grpc,
            ForwardConfig {
                tls: Some(ServerTls {
                    ca_file: path("ca.crt"),
                    client_identity: Some((path("client.crt"), path("client.key"))),
                    server_name: Some("localhost".into()),
                }),
                // Resync chunks must fit the server's burst.
                max_batch: 200,
                ..ForwardConfig::default()
            },
        ),
        cancel.clone(),
    )
    .await
    .unwrap();
    wait_up(&running.metrics).await;
    // Chain 0 (one of the 1,000 below) until the subscription is live.
    publish_until(
        &mut engine,
        &server,
        || stored_batch(0.0, &[chain(0)], 16),
        4,
    )
    .await;
    // 1,000 chains = 4,000 blocks at once: four bursts' worth.
    for batch in 0..50u64 {
        let chains: Vec<Stored> = (batch * 20..batch * 20 + 20).map(chain).collect();
        engine
            .publish(stored_batch(0.0, &chains, 16))
            .await
            .unwrap();
    }
    assert_eq!(
        server.wait_prefixes(4_000, Duration::from_secs(30)).await,
        4_000,
        "every block arrived despite the limit"
    );
    let body = server.metrics().await;
    assert!(
        counter(
            &body,
            "inferencecache_producer_rejected_total{identity=\"team-a\",reason=\"rate_limited\"}"
        ) >= 1.0,
        "the server pushed back\n{body}"
    );
    let m = running.metrics.encode();
    assert!(
        counter(&m, "inferencecache_subscriber_throttled_total") >= 1.0,
        "the sidecar saw the pushback\n{m}"
    );
    cancel.cancel();
    running.wait().await.unwrap();
    server.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

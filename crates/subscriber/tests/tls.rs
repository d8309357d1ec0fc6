//! The sidecar reaches a TLS-only server with `--server-tls-ca` and a client
//! certificate (mTLS), with real certificates made in the test (rcgen).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::time::Duration;

use inferencecache_server::config::TlsFiles;
use inferencecache_server::{Server, ServerConfig};
use inferencecache_subscriber::forward::{ForwardConfig, Identity, ServerTls};
use inferencecache_subscriber::loopback::{LoopbackEngine, Stored, stored_batch};
use inferencecache_subscriber::mapping::MappingConfig;
use inferencecache_subscriber::sidecar::{self, SidecarConfig};
use inferencecache_subscriber::{DecodeOptions, TransportConfig};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tokio_util::sync::CancellationToken;

fn ca() -> CertifiedIssuer<'static, KeyPair> {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name.push(DnType::CommonName, "test ca");
    CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap()
}

fn leaf(ca: &CertifiedIssuer<'static, KeyPair>, name: &str) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![name.to_owned()])
        .unwrap()
        .signed_by(&key, ca)
        .unwrap();
    (cert.pem(), key.serialize_pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_over_mutual_tls() {
    let dir = std::env::temp_dir().join(format!("ic-sub-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = |f: &str| -> PathBuf { dir.join(f) };
    let ca = ca();
    std::fs::write(path("ca.crt"), ca.pem()).unwrap();
    let (cert, key) = leaf(&ca, "localhost");
    std::fs::write(path("tls.crt"), cert).unwrap();
    std::fs::write(path("tls.key"), key).unwrap();
    let (cert, key) = leaf(&ca, "sidecar");
    std::fs::write(path("client.crt"), cert).unwrap();
    std::fs::write(path("client.key"), key).unwrap();

    let mut config = ServerConfig::ephemeral();
    config.tls = Some(TlsFiles {
        cert: path("tls.crt"),
        key: path("tls.key"),
        client_ca: Some(path("ca.crt")),
    });
    let server = Server::bind(&config).await.unwrap();
    let (grpc, control) = (server.grpc_addr(), server.control_addr());
    let stop = CancellationToken::new();
    let task = tokio::spawn(server.serve(stop.clone()));

    let mut engine = LoopbackEngine::bind("kv-events").await.unwrap();
    let cancel = CancellationToken::new();
    let running = sidecar::start(
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
                tls: Some(ServerTls {
                    ca_file: path("ca.crt"),
                    client_identity: Some((path("client.crt"), path("client.key"))),
                    server_name: Some("localhost".into()),
                }),
                identity: Identity {
                    replica_id: "r-tls".into(),
                    model_id: "m".into(),
                    tenant_id: "t".into(),
                    hash_scheme: "vllm".into(),
                },
                window: Duration::from_millis(20),
                ..ForwardConfig::default()
            },
            stats: None,
            http_bind: None,
        },
        cancel.clone(),
    )
    .await
    .unwrap();
    for _ in 0..200 {
        if running.metrics.server_up() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(running.metrics.server_up(), "connected over mTLS");
    let ev = Stored {
        hashes: vec![1, 2, 3, 4],
        parent: None,
        tokens: 0..64,
    };
    let mut count = 0;
    for i in 0..200 {
        // Sent again every 250 ms: what the PUB sends before the sidecar's
        // subscription reaches it is dropped (slow joiner; no replay here),
        // and a repeated store is idempotent.
        if i % 10 == 0 {
            engine
                .publish(stored_batch(0.0, std::slice::from_ref(&ev), 16))
                .await
                .unwrap();
        }
        let body = reqwest::get(format!("http://{control}/snapshot"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let snap: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        count = snap["totalPrefixes"].as_i64().unwrap_or(0);
        if count == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(count, 4, "the four blocks reached the TLS server");
    cancel.cancel();
    running.wait().await.unwrap();
    stop.cancel();
    let _ = task.await;
    let _ = std::fs::remove_dir_all(&dir);
}

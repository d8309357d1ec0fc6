//! TLS and mTLS with real certificates (rcgen) against a real TLS server:
//! `TlsOptions` verify the server, present a client identity, and a failed
//! handshake is just `NoHint(Unavailable)`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Running;
use inferencecache_client::{
    Client, ClientConfig, Hint, NoHintReason, RouteInput, RouteQuery, TlsOptions,
};
use inferencecache_server::ServerConfig;
use inferencecache_server::config::TlsFiles;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use std::path::PathBuf;
use std::time::Duration;

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str) -> Self {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        Self(CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap())
    }

    /// A leaf for `names`: (cert PEM, key PEM).
    fn leaf(&self, names: &[&str]) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let cert = CertificateParams::new(names)
            .unwrap()
            .signed_by(&key, &self.0)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A temporary directory of PEM files, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("ic-client-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }

    fn write(&self, file: &str, body: &str) -> PathBuf {
        let path = self.0.join(file);
        std::fs::write(&path, body).unwrap();
        path
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A TLS server whose certificate names only `server.test`, so dialling
/// 127.0.0.1 needs the domain override.
async fn tls_server(dir: &Dir, ca: &Ca, client_ca: Option<&Ca>) -> Running {
    let (cert, key) = ca.leaf(&["server.test"]);
    let mut config = ServerConfig::ephemeral();
    config.tls = Some(TlsFiles {
        cert: dir.write("tls.crt", &cert),
        key: dir.write("tls.key", &key),
        client_ca: client_ca.map(|c| dir.write("client-ca.crt", &c.0.pem())),
    });
    Running::start_with(config).await
}

async fn ask(endpoint: String, tls: TlsOptions) -> Hint {
    let client = Client::connect_lazy(
        ClientConfig::new(endpoint)
            .lookup_deadline(Duration::from_secs(5))
            .tls(tls),
    )
    .unwrap();
    let query = RouteQuery::new("t", "m", RouteInput::TokenIds((0..32).collect()));
    client.lookup_route(&query).await.hint
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_is_verified_against_the_given_ca_and_name() {
    let dir = Dir::new("verify");
    let ca = Ca::new("ca");
    let s = tls_server(&dir, &ca, None).await;
    let ca_file = dir.write("ca.crt", &ca.0.pem());
    let url = format!("https://{}", s.grpc);

    let ok = ask(
        url.clone(),
        TlsOptions::with_ca(&ca_file).domain("server.test"),
    )
    .await;
    assert_eq!(
        ok,
        Hint::NoHint(NoHintReason::NoHint),
        "the server answered"
    );

    // The certificate does not name 127.0.0.1: without the override the
    // handshake fails, and that is just no hint.
    let wrong_name = ask(url.clone(), TlsOptions::with_ca(&ca_file)).await;
    assert_eq!(wrong_name, Hint::NoHint(NoHintReason::Unavailable));

    let other = dir.write("other.crt", &Ca::new("other").0.pem());
    let wrong_ca = ask(url, TlsOptions::with_ca(other).domain("server.test")).await;
    assert_eq!(wrong_ca, Hint::NoHint(NoHintReason::Unavailable));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_needs_the_client_identity() {
    let dir = Dir::new("mtls");
    let ca = Ca::new("ca");
    let clients = Ca::new("clients");
    let s = tls_server(&dir, &ca, Some(&clients)).await;
    let ca_file = dir.write("ca.crt", &ca.0.pem());
    let (cert, key) = clients.leaf(&["gateway"]);
    let (cert, key) = (dir.write("gw.crt", &cert), dir.write("gw.key", &key));
    let url = format!("https://{}", s.grpc);

    let with_identity = TlsOptions::with_ca(&ca_file)
        .domain("server.test")
        .identity(cert, key);
    assert_eq!(
        ask(url.clone(), with_identity).await,
        Hint::NoHint(NoHintReason::NoHint)
    );
    let without = TlsOptions::with_ca(&ca_file).domain("server.test");
    assert_eq!(
        ask(url, without).await,
        Hint::NoHint(NoHintReason::Unavailable)
    );
    s.stop().await;
}

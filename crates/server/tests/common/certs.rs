//! Real certificates made in the test (rcgen): a CA, server leaves for
//! `localhost`, and client leaves carrying a SPIFFE URI SAN or only a CN.

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, SanType};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A certificate authority.
pub(crate) struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub(crate) fn new(name: &str) -> Self {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        Self {
            issuer: CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A leaf for `localhost` / 127.0.0.1: (cert PEM, key PEM).
    pub(crate) fn leaf(&self) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let p =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    /// A client leaf with subject CN `cn` and, if given, a URI SAN
    /// (e.g. `spiffe://cluster.local/ns/team-a/sa/sidecar`).
    pub(crate) fn client(&self, cn: &str, uri: Option<&str>) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        if let Some(uri) = uri {
            p.subject_alt_names
                .push(SanType::URI(uri.try_into().unwrap()));
        }
        let cert = p.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

/// A scratch directory removed on drop.
pub(crate) struct Dir(pub PathBuf);

impl Dir {
    pub(crate) fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("ic-tls-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }
    pub(crate) fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a file and pushes its mtime forward, so a rewrite within the same
/// clock tick still counts as a change.
pub(crate) fn write_newer(path: &Path, body: &str, ahead: Duration) {
    std::fs::write(path, body).unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() + ahead).unwrap();
}

/// Server TLS files in `dir` signed by `ca`, with `client_ca` for mTLS.
pub(crate) fn server_files(
    dir: &Dir,
    ca: &Ca,
    client_ca: Option<&Ca>,
) -> inferencecache_server::config::TlsFiles {
    let (cert, key) = ca.leaf();
    std::fs::write(dir.path("tls.crt"), cert).unwrap();
    std::fs::write(dir.path("tls.key"), key).unwrap();
    let client_ca = client_ca.map(|c| {
        std::fs::write(dir.path("client-ca.crt"), c.pem()).unwrap();
        dir.path("client-ca.crt")
    });
    inferencecache_server::config::TlsFiles {
        cert: dir.path("tls.crt"),
        key: dir.path("tls.key"),
        client_ca,
    }
}

/// A TLS channel to `addr` trusting `trust`, presenting `identity`.
pub(crate) async fn channel(
    addr: std::net::SocketAddr,
    trust: &Ca,
    identity: Option<(String, String)>,
) -> Result<tonic::transport::Channel, String> {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(trust.pem()))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))
}

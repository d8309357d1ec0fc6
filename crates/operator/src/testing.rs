//! Test harness (feature `testing`): the shared apiserver harness of
//! `inferencecache-testkit` (one for the whole workspace), plus webhook
//! certificates made with rcgen. The operator's and the CLI's integration
//! tests use it.
//!
//! Tests that need the apiserver call [`apiserver_binary`] first: it returns
//! `None` with a printed SKIPPED reason when the binaries are missing, and
//! panics instead under `INFERENCECACHE_REQUIRE_REAL_PARTS=1` (CI).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::missing_panics_doc)]

pub use inferencecache_testkit::kube::{ADMIN_TOKEN, Cluster, Proc, apiserver_binary};
pub use inferencecache_testkit::{free_port, real_parts_required, require, which};
use std::path::Path;

/// A CA and a serving certificate for 127.0.0.1, written as `tls.crt` /
/// `tls.key` into `dir`; returns the CA PEM (for a webhook `caBundle`).
pub fn write_webhook_certs(dir: &Path) -> String {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, "webhook-test-ca");
    let ca = CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("tls.crt"), leaf.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    ca.pem()
}

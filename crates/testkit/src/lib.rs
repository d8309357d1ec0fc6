//! Test support shared by the workspace's integration tests (a
//! dev-dependency only; nothing here ships in a binary).
//!
//! [`kube`]: a real etcd + kube-apiserver on loopback ports (the binary
//! `.ci/build-kube-apiserver` caches), an admin kubeconfig, namespaces,
//! service accounts and TokenRequest tokens, CRD installation, `kubectl`.
//! The server's TokenReview tests and the operator's and CLI's Kubernetes
//! tests all start their cluster here, so there is one way to do it.
//!
//! Tests that need a real part call its probe first ([`kube::apiserver_binary`],
//! [`require`]): `None`/`false` with a printed SKIPPED reason when it is
//! missing, a panic instead under `INFERENCECACHE_REQUIRE_REAL_PARTS=1` (CI).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::missing_panics_doc)]

pub mod kube;

use std::process::Command;

/// Whether real parts are mandatory (CI).
pub fn real_parts_required() -> bool {
    std::env::var("INFERENCECACHE_REQUIRE_REAL_PARTS").as_deref() == Ok("1")
}

/// Skips (prints, returns false) or panics under CI when `what` is missing.
pub fn require(present: bool, what: &str) -> bool {
    if present {
        return true;
    }
    assert!(!real_parts_required(), "{what} missing");
    eprintln!("SKIPPED: {what} missing");
    false
}

/// Whether a program is on PATH.
pub fn which(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

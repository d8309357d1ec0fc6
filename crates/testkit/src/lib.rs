//! Test support shared by the workspace's integration tests (a
//! dev-dependency only; nothing here ships in a binary).
//!
//! [`kube`]: a real etcd + kube-apiserver on loopback ports (the binary
//! `.ci/build-kube-apiserver` caches), an admin kubeconfig, namespaces,
//! service accounts and TokenRequest tokens, CRD installation, `kubectl`.
//! The server's TokenReview tests and the operator's and CLI's Kubernetes
//! tests all start their cluster here, so there is one way to do it.
//!
//! [`kube_node`]: a whole single-node Kubernetes (kubelet, containerd,
//! scheduler, controller-manager, kube-proxy) where pods really run, for the
//! suite that installs `config/default` from an image built here.
//!
//! `server` (feature `server`): a real server in-process, the one
//! running-server harness of the server's and the client's suites.
//!
//! [`vllm`]: real vLLM engines (CPU build) with a tiny model made at test
//! time, for suites that judge hints by what the engine reuses.
//!
//! Tests that need a real part call its probe first ([`kube::apiserver_binary`],
//! [`require`]): `None`/`false` with a printed SKIPPED reason when it is
//! missing, a panic instead under `INFERENCECACHE_REQUIRE_REAL_PARTS=1` (CI).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::missing_panics_doc)]

pub mod kube;
pub mod kube_node;
#[cfg(feature = "server")]
pub mod server;
pub mod vllm;

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

/// A free loopback port, below the kernel's ephemeral range (Linux:
/// 32768-60999). A port from `bind(":0")` is an ephemeral one, which any
/// outgoing connection may take as its source port before the test's
/// server binds it: another test's client, or a client already retrying
/// against this very port (a TCP self-connect), so "Address already in
/// use" came back now and then. Ports below the range are only ever
/// bound on purpose; each pick is checked free and spread by process id,
/// a counter and the clock so parallel tests and processes differ.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    for _ in 0..2000 {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let mix = (u64::from(std::process::id()) << 32 | u64::from(n))
            .wrapping_add(u64::from(nanos))
            .wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let port = 10_000 + ((mix >> 40) % 22_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in 10000-31999")
}

//! Test harness (feature `testing`): a real etcd + kube-apiserver on
//! loopback ports (the binary `.ci/build-kube-apiserver` caches), an admin
//! kubeconfig, CRD installation, `kubectl`, and webhook certificates made
//! with rcgen. The operator's and the CLI's integration tests share it.
//!
//! Tests that need the apiserver call [`apiserver_binary`] first: it returns
//! `None` with a printed SKIPPED reason when the binaries are missing, and
//! panics instead under `INFERENCECACHE_REQUIRE_REAL_PARTS=1` (CI).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::missing_panics_doc)]

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The admin user's static token.
pub const ADMIN_TOKEN: &str = "admin-token";

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

/// The kube-apiserver binary, when it and etcd are installed.
pub fn apiserver_binary() -> Option<PathBuf> {
    let bin = std::env::var("KUBE_APISERVER").map_or_else(
        |_| PathBuf::from("/var/cache/inferencecache/kube-apiserver"),
        PathBuf::from,
    );
    let etcd = which("etcd");
    require(
        bin.is_file() && etcd,
        &format!(
            "kube-apiserver ({}) or etcd (run .ci/build-kube-apiserver)",
            bin.display()
        ),
    )
    .then_some(bin)
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

/// A child process killed on drop.
#[derive(Debug)]
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running etcd + kube-apiserver, stopped and deleted on drop.
#[derive(Debug)]
pub struct Cluster {
    apiserver: Option<Proc>,
    _etcd: Proc,
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// Scratch directory (removed on drop).
    pub dir: PathBuf,
    /// The apiserver's HTTPS port.
    pub port: u16,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.apiserver.take();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Cluster {
    /// Starts etcd and the apiserver on fresh ports and waits until the
    /// `default` namespace answers.
    pub async fn start(bin: &Path) -> Self {
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ic-op-kube-{}-{seq}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("certs")).unwrap();
        let (client_port, peer_port, port) = (free_port(), free_port(), free_port());
        let etcd = Proc(
            Command::new("etcd")
                .arg("--data-dir")
                .arg(dir.join("etcd"))
                .arg(format!(
                    "--listen-client-urls=http://127.0.0.1:{client_port}"
                ))
                .arg(format!(
                    "--advertise-client-urls=http://127.0.0.1:{client_port}"
                ))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
                ))
                .arg(format!(
                    "--initial-cluster=default=http://127.0.0.1:{peer_port}"
                ))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        run_ok(
            Command::new("openssl")
                .args(["genrsa", "-out"])
                .arg(dir.join("sa.key"))
                .arg("2048"),
        );
        run_ok(
            Command::new("openssl")
                .args(["rsa", "-pubout", "-in"])
                .arg(dir.join("sa.key"))
                .arg("-out")
                .arg(dir.join("sa.pub")),
        );
        std::fs::write(
            dir.join("tokens.csv"),
            format!("{ADMIN_TOKEN},admin,1,\"system:masters\"\n"),
        )
        .unwrap();
        let p = |f: &str| dir.join(f).display().to_string();
        let log = std::fs::File::create(dir.join("apiserver.log")).unwrap();
        let apiserver = Proc(
            Command::new(bin)
                .arg(format!("--etcd-servers=http://127.0.0.1:{client_port}"))
                .arg("--etcd-prefix=/inferencecache-operator-test")
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--secure-port={port}"))
                .arg(format!("--cert-dir={}", p("certs")))
                .arg("--insecure-port=0")
                .arg(format!("--token-auth-file={}", p("tokens.csv")))
                .arg("--authorization-mode=RBAC")
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg(format!("--service-account-key-file={}", p("sa.pub")))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    p("sa.key")
                ))
                .arg("--service-cluster-ip-range=10.0.0.0/24")
                .arg("--disable-admission-plugins=ServiceAccount")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap(),
        );
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\n\
                 users:\n- name: admin\n  user:\n    token: {ADMIN_TOKEN}\ncontexts:\n- name: t\n  context:\n    cluster: t\n    user: admin\ncurrent-context: t\n"
            ),
        )
        .unwrap();
        let cluster = Self {
            apiserver: Some(apiserver),
            _etcd: etcd,
            kubeconfig,
            dir,
            port,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(client) = cluster.try_client().await {
                let ns: Api<Namespace> = Api::all(client);
                if ns.get("default").await.is_ok() {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "apiserver not ready");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        cluster
    }

    async fn try_client(&self) -> Result<Client, crate::RunError> {
        crate::run::kube_client(Some(&self.kubeconfig)).await
    }

    /// An admin client.
    pub async fn client(&self) -> Client {
        self.try_client().await.unwrap()
    }

    /// Stops the apiserver (etcd keeps running).
    pub fn stop_apiserver(&mut self) {
        self.apiserver.take();
    }

    /// Runs kubectl against the cluster.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .output()
            .unwrap()
    }

    /// Creates `name` unless it exists.
    pub async fn namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.client().await);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create namespace {name}: {e}"),
        }
    }

    /// Installs `crds` and waits until each is Established and served.
    pub async fn install_crds(&self, crds: &[CustomResourceDefinition]) {
        let client = self.client().await;
        let api: Api<CustomResourceDefinition> = Api::all(client.clone());
        for crd in crds {
            api.create(&PostParams::default(), crd)
                .await
                .unwrap_or_else(|e| panic!("create CRD {:?}: {e}", crd.metadata.name));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            loop {
                let c = api.get(&name).await.unwrap();
                let established = c
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    break;
                }
                assert!(Instant::now() < deadline, "CRD {name} never established");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // Discovery lags Established by a moment.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    /// The apiserver's log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("apiserver.log")).unwrap_or_default()
    }
}

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

//! A real kube-apiserver + etcd on loopback ports (built by
//! `.ci/build-kube-apiserver`), for the TokenReview tests: service accounts
//! are created in the test and their tokens minted through TokenRequest.
//! `None` (with a printed reason) when the binaries are absent, unless
//! INFERENCECACHE_REQUIRE_REAL_PARTS=1.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, ObjectMeta, PostParams};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ADMIN_TOKEN: &str = "admin-token";

/// The apiserver binary, or `None` (skip) when it or etcd is missing.
pub fn apiserver_binary() -> Option<PathBuf> {
    let bin = std::env::var("KUBE_APISERVER").map_or_else(
        |_| PathBuf::from("/var/cache/inferencecache/kube-apiserver"),
        PathBuf::from,
    );
    let etcd = Command::new("sh").args(["-c", "command -v etcd"]).output();
    if bin.is_file() && etcd.is_ok_and(|o| o.status.success()) {
        return Some(bin);
    }
    let msg = format!(
        "kube-apiserver ({}) or etcd missing; run .ci/build-kube-apiserver",
        bin.display()
    );
    if std::env::var("INFERENCECACHE_REQUIRE_REAL_PARTS").as_deref() == Ok("1") {
        panic!("{msg}");
    }
    eprintln!("SKIPPED: {msg}");
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed on drop.
pub struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// etcd + kube-apiserver, stopped and cleaned up on drop.
pub struct Cluster {
    _etcd: Proc,
    /// Take it to stop the apiserver early.
    pub apiserver: Option<Proc>,
    /// Admin kubeconfig.
    pub kubeconfig: PathBuf,
    dir: PathBuf,
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

impl Cluster {
    /// Starts etcd and the apiserver; ready once a ServiceAccount can be
    /// created in `default`.
    pub async fn start(bin: &Path, name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ic-kube-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("certs")).unwrap();
        let (client_port, peer_port, secure_port) = (free_port(), free_port(), free_port());
        let etcd = Proc(
            Command::new("etcd")
                .args([
                    "--data-dir",
                    dir.join("etcd").to_str().unwrap(),
                    "--listen-client-urls",
                    &format!("http://127.0.0.1:{client_port}"),
                    "--advertise-client-urls",
                    &format!("http://127.0.0.1:{client_port}"),
                    "--listen-peer-urls",
                    &format!("http://127.0.0.1:{peer_port}"),
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer_port}"),
                    "--initial-cluster",
                    &format!("default=http://127.0.0.1:{peer_port}"),
                ])
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
        let path = |f: &str| dir.join(f).to_str().unwrap().to_owned();
        let apiserver = Proc(
            Command::new(bin)
                .args([
                    &format!("--etcd-servers=http://127.0.0.1:{client_port}"),
                    "--etcd-prefix=/inferencecache-test",
                    "--bind-address=127.0.0.1",
                    &format!("--secure-port={secure_port}"),
                    &format!("--cert-dir={}", path("certs")),
                    "--insecure-port=0",
                    &format!("--token-auth-file={}", path("tokens.csv")),
                    "--authorization-mode=RBAC",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    &format!("--service-account-key-file={}", path("sa.pub")),
                    &format!("--service-account-signing-key-file={}", path("sa.key")),
                    "--service-cluster-ip-range=10.0.0.0/24",
                    "--disable-admission-plugins=ServiceAccount",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://127.0.0.1:{secure_port}\n    insecure-skip-tls-verify: true\n\
                 users:\n- name: admin\n  user:\n    token: {ADMIN_TOKEN}\ncontexts:\n- name: t\n  context:\n    cluster: t\n    user: admin\ncurrent-context: t\n"
            ),
        )
        .unwrap();
        let cluster = Self {
            _etcd: etcd,
            apiserver: Some(apiserver),
            kubeconfig,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match cluster.try_service_account("default", "ready-check").await {
                Ok(()) => break,
                Err(e) if Instant::now() > deadline => panic!("apiserver not ready: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
        cluster
    }

    /// An admin client.
    pub async fn client(&self) -> kube::Client {
        inferencecache_server::auth::kube_client(Some(&self.kubeconfig))
            .await
            .unwrap()
    }

    async fn try_service_account(&self, ns: &str, name: &str) -> Result<(), kube::Error> {
        let client = self.client().await;
        if ns != "default" {
            let nss: Api<Namespace> = Api::all(client.clone());
            let obj = Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.into()),
                    ..Default::default()
                },
                ..Default::default()
            };
            match nss.create(&PostParams::default(), &obj).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e),
            }
        }
        let sas: Api<ServiceAccount> = Api::namespaced(client, ns);
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match sas.create(&PostParams::default(), &sa).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates namespace `ns` (if needed) and service account `name` in it.
    pub async fn service_account(&self, ns: &str, name: &str) {
        self.try_service_account(ns, name).await.unwrap();
    }

    /// A token for `ns/sa` bound to `audience` (TokenRequest).
    pub async fn mint(&self, ns: &str, sa: &str, audience: &str) -> String {
        let sas: Api<ServiceAccount> = Api::namespaced(self.client().await, ns);
        let req = TokenRequest {
            spec: TokenRequestSpec {
                audiences: vec![audience.into()],
                ..Default::default()
            },
            ..Default::default()
        };
        sas.create_token_request(sa, &PostParams::default(), &req)
            .await
            .unwrap()
            .status
            .unwrap()
            .token
    }

    /// `token` with its validity moved two hours into the past, re-signed
    /// with the cluster's service-account key: a genuine token of this
    /// cluster that has expired (TokenRequest refuses lifetimes under
    /// 10 minutes, so a test cannot wait for one).
    pub fn expired(&self, token: &str) -> String {
        let mut parts = token.split('.');
        let (header, payload) = (parts.next().unwrap(), parts.next().unwrap());
        let mut claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        claims["iat"] = (now - 7200).into();
        claims["nbf"] = (now - 7200).into();
        claims["exp"] = (now - 3600).into();
        let signed = format!(
            "{header}.{}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap())
        );
        let mut child = Command::new("openssl")
            .args(["dgst", "-sha256", "-sign"])
            .arg(self.dir.join("sa.key"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(signed.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "openssl dgst -sign");
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(out.stdout))
    }

    /// A scratch directory inside the cluster's.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

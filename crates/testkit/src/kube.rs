//! A real etcd + kube-apiserver on loopback ports, stopped and deleted on
//! drop. Static-token admin (`ADMIN_TOKEN`, `system:masters`), RBAC, and
//! service-account tokens signed by a key of the cluster's own, so
//! TokenRequest and TokenReview work as in a real cluster.

use crate::{free_port, require, which};
use ::kube::api::{Api, ObjectMeta, PostParams};
use ::kube::{Client, Config};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The admin user's static token.
pub const ADMIN_TOKEN: &str = "admin-token";

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
    /// Starts etcd and the apiserver on fresh ports; ready once a
    /// ServiceAccount can be created in `default` (reads and writes work).
    pub async fn start(bin: &Path) -> Self {
        let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ic-kube-{}-{seq}", std::process::id()));
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
                .arg("--etcd-prefix=/inferencecache-test")
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
            match cluster.try_service_account("default", "ready-check").await {
                Ok(()) => break,
                Err(e) if Instant::now() > deadline => {
                    panic!("apiserver not ready: {e}\n{}", cluster.log())
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
        cluster
    }

    async fn try_client(&self) -> Result<Client, String> {
        let kc =
            ::kube::config::Kubeconfig::read_from(&self.kubeconfig).map_err(|e| e.to_string())?;
        let config =
            Config::from_custom_kubeconfig(kc, &::kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| e.to_string())?;
        Client::try_from(config).map_err(|e| e.to_string())
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

    /// The apiserver's log so far (for assertion messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("apiserver.log")).unwrap_or_default()
    }

    /// A scratch path inside the cluster's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    async fn try_namespace(&self, client: Client, name: &str) -> Result<(), String> {
        let api: Api<Namespace> = Api::all(client);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => Ok(()),
            Err(::kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(format!("create namespace {name}: {e}")),
        }
    }

    /// Creates `name` unless it exists.
    pub async fn namespace(&self, name: &str) {
        self.try_namespace(self.client().await, name).await.unwrap();
    }

    async fn try_service_account(&self, ns: &str, name: &str) -> Result<(), String> {
        let client = self.try_client().await?;
        if ns != "default" {
            self.try_namespace(client.clone(), ns).await?;
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
            Err(::kube::Error::Api(e)) if e.code == 409 => Ok(()),
            Err(e) => Err(e.to_string()),
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

    /// Installs `crds` and waits until each is Established and served.
    pub async fn install_crds(&self, crds: &[CustomResourceDefinition]) {
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await);
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
}

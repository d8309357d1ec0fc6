//! A real single-node Kubernetes 1.20 on this machine: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler, containerd (runc, the bridge
//! CNI), kubelet and kube-proxy, with a dnsmasq stand-in for cluster DNS, all
//! built from Debian (`.ci/build-kube-node`, `.ci/build-kube-apiserver`).
//! Pods really run: images are imported from archives (no registry), the
//! sandbox image is built here from the `pause` binary.
//!
//! The node lives on loopback: its IP ([`NODE_IP`]) is put on `lo`, pods get
//! `10.244.0.0/24` on the `cni0` bridge, and an iptables rule drops pod
//! traffic that would leave through anything but the bridge (nothing gets
//! out of the machine). Services: kube-proxy (iptables mode); their names
//! are answered by dnsmasq on the node IP from a hosts file the harness
//! keeps in sync with the Services (no CoreDNS package exists here; the
//! product must not depend on this stand-in, and does not).
//!
//! Host changes are recorded before and undone on drop, after every process
//! was stopped by PID (pods by their cgroups, containerd shims by the socket
//! address they were started with): iptables rules (saved and restored),
//! sysctls kubelet and kube-proxy set, mounts under the scratch directory and
//! the network namespaces containerd made, the bridge, the node IP, the
//! `kubepods` cgroups, `/var/log/pods` entries and CNI state. One node per
//! machine at a time (the bridge, the address and the iptables rules are
//! machine-wide); needs root.

use crate::{free_port, require, which};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The node's IP (on `lo`): apiserver, kubelet, and cluster DNS listen here.
pub const NODE_IP: &str = "10.245.0.1";
/// The node's name.
pub const NODE_NAME: &str = "ic-node";
/// The Service IP range.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The pods' subnet on the bridge.
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The bridge's name.
const BRIDGE: &str = "cni0";
/// The sandbox image the kubelet asks containerd for.
const PAUSE_IMAGE: &str = "k8s.gcr.io/pause:3.2";
/// The admin's static token (`system:masters`).
pub const ADMIN_TOKEN: &str = "node-admin-token";
/// Sysctls the kubelet, kube-proxy and the bridge set, restored on drop.
const SYSCTLS: &[&str] = &[
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/conf/all/route_localnet",
    "net/bridge/bridge-nf-call-iptables",
    "net/bridge/bridge-nf-call-ip6tables",
    "net/ipv4/ip_forward",
];
/// cgroup v1 hierarchies the kubelet makes `kubepods` in.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The binaries a node needs.
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    /// kube-apiserver.
    pub apiserver: PathBuf,
    /// kube-controller-manager.
    pub controller_manager: PathBuf,
    /// kube-scheduler.
    pub scheduler: PathBuf,
    /// kubelet.
    pub kubelet: PathBuf,
    /// kube-proxy.
    pub proxy: PathBuf,
    /// The static `pause` binary (the sandbox image is made from it).
    pub pause: PathBuf,
}

/// The node's binaries and tools when everything is installed (`None`, or a
/// panic under `INFERENCECACHE_REQUIRE_REAL_PARTS=1`, when not).
pub fn node_binaries() -> Option<NodeBinaries> {
    let dir = std::env::var("KUBE_NODE_CACHE").map_or_else(
        |_| PathBuf::from("/var/cache/inferencecache"),
        PathBuf::from,
    );
    let bins = NodeBinaries {
        apiserver: std::env::var("KUBE_APISERVER")
            .map_or_else(|_| dir.join("kube-apiserver"), PathBuf::from),
        controller_manager: dir.join("kube-controller-manager"),
        scheduler: dir.join("kube-scheduler"),
        kubelet: dir.join("kubelet"),
        proxy: dir.join("kube-proxy"),
        pause: dir.join("pause"),
    };
    let missing: Vec<String> = [
        &bins.apiserver,
        &bins.controller_manager,
        &bins.scheduler,
        &bins.kubelet,
        &bins.proxy,
        &bins.pause,
    ]
    .iter()
    .filter(|p| !p.is_file())
    .map(|p| p.display().to_string())
    .chain(
        [
            "etcd",
            "containerd",
            "containerd-shim-runc-v2",
            "runc",
            "ctr",
            "iptables-save",
            "iptables-restore",
            "dnsmasq",
            "kubectl",
            "openssl",
            "ip",
            "tar",
            "sha256sum",
        ]
        .iter()
        .filter(|t| !which(t))
        .map(|t| (*t).to_owned()),
    )
    .chain((!Path::new("/usr/lib/cni/bridge").is_file()).then(|| "/usr/lib/cni/bridge".to_owned()))
    .collect();
    let root = is_root();
    require(
        missing.is_empty() && root,
        &format!(
            "a real node ({}{}; run .ci/build-kube-apiserver and .ci/build-kube-node)",
            missing.join(", "),
            if root { "" } else { " and root" }
        ),
    )
    .then_some(bins)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn sh(cmd: &str) -> Output {
    Command::new("sh").args(["-c", cmd]).output().unwrap()
}

fn sh_ok(cmd: &str) -> String {
    let out = sh(cmd);
    assert!(
        out.status.success(),
        "{cmd}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the host looked like before the node, to put it back.
#[derive(Debug, Default)]
struct HostState {
    sysctls: Vec<(String, String)>,
    iptables: Option<String>,
    ip6tables: Option<String>,
    added_ip: bool,
    bridge_existed: bool,
    netns: BTreeSet<String>,
    log_pods: BTreeSet<String>,
    log_containers: BTreeSet<String>,
    var_lib_cni: bool,
    run_containerd: BTreeSet<String>,
    run_containerd_existed: bool,
    cgroups: BTreeSet<PathBuf>,
}

fn list(dir: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn kubepods_cgroups() -> BTreeSet<PathBuf> {
    let mut out = BTreeSet::new();
    for h in std::fs::read_dir(CGROUP_ROOT)
        .into_iter()
        .flatten()
        .flatten()
    {
        let root = h.path().join("kubepods");
        if root.is_dir() {
            let mut stack = vec![root];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        stack.push(e.path());
                    }
                }
                out.insert(d);
            }
        }
    }
    out
}

impl HostState {
    fn record() -> Self {
        let sysctls = SYSCTLS
            .iter()
            .filter_map(|k| {
                let v = std::fs::read_to_string(format!("/proc/sys/{k}")).ok()?;
                Some(((*k).to_owned(), v.trim().to_owned()))
            })
            .collect();
        let save = |cmd: &str| {
            let out = sh(cmd);
            out.status
                .success()
                .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
        };
        Self {
            sysctls,
            iptables: save("iptables-save"),
            ip6tables: save("ip6tables-save"),
            added_ip: false,
            bridge_existed: Path::new(&format!("/sys/class/net/{BRIDGE}")).exists(),
            netns: list("/run/netns"),
            log_pods: list("/var/log/pods"),
            log_containers: list("/var/log/containers"),
            var_lib_cni: Path::new("/var/lib/cni").exists(),
            run_containerd: list("/run/containerd/s"),
            run_containerd_existed: Path::new("/run/containerd").exists(),
            cgroups: kubepods_cgroups(),
        }
    }

    fn restore(&self) {
        // iptables first: it also removes the kubelet's and kube-proxy's
        // chains. A table the dump did not show was empty before: flush it.
        for (save, cmd) in [(&self.iptables, "iptables"), (&self.ip6tables, "ip6tables")] {
            let Some(rules) = save else { continue };
            for table in ["filter", "nat", "mangle", "raw"] {
                if !rules.lines().any(|l| l == format!("*{table}")) {
                    let _ = sh(&format!("{cmd} -t {table} -F; {cmd} -t {table} -X"));
                }
            }
            restore_rules(&format!("{cmd}-restore"), rules);
        }
        if !self.bridge_existed {
            let _ = sh(&format!("ip link delete {BRIDGE} 2>/dev/null"));
        }
        if self.added_ip {
            let _ = sh(&format!("ip addr del {NODE_IP}/32 dev lo"));
        }
        for ns in list("/run/netns").difference(&self.netns) {
            let p = format!("/run/netns/{ns}");
            let _ = sh(&format!("umount -l {p} 2>/dev/null; rm -f {p}"));
        }
        for (dir, before) in [
            ("/var/log/pods", &self.log_pods),
            ("/var/log/containers", &self.log_containers),
        ] {
            for e in list(dir).difference(before) {
                let _ = std::fs::remove_dir_all(format!("{dir}/{e}"))
                    .or_else(|_| std::fs::remove_file(format!("{dir}/{e}")));
            }
        }
        if !self.var_lib_cni {
            let _ = std::fs::remove_dir_all("/var/lib/cni");
        }
        if self.run_containerd_existed {
            for e in list("/run/containerd/s").difference(&self.run_containerd) {
                let _ = std::fs::remove_file(format!("/run/containerd/s/{e}"));
            }
        } else {
            let _ = std::fs::remove_dir_all("/run/containerd");
        }
        // Deepest first: a cgroup is removed with rmdir once it is empty.
        let mut made: Vec<PathBuf> = kubepods_cgroups()
            .difference(&self.cgroups)
            .cloned()
            .collect();
        made.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for d in made {
            let _ = std::fs::remove_dir(&d);
        }
        // ip_forward last (writing it resets per-interface forwarding).
        for (k, v) in self.sysctls.iter().rev() {
            let _ = std::fs::write(format!("/proc/sys/{k}"), v);
        }
    }
}

fn restore_rules(cmd: &str, rules: &str) {
    use std::io::Write;
    if let Ok(mut child) = Command::new(cmd).stdin(Stdio::piped()).spawn() {
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(rules.as_bytes());
        }
        let _ = child.wait();
    }
}

/// One started component.
#[derive(Debug)]
struct Component {
    name: &'static str,
    child: Child,
}

/// A running single-node cluster; everything is stopped and undone on drop.
#[derive(Debug)]
pub struct Node {
    components: Vec<Component>,
    host: Option<HostState>,
    dns_stop: Arc<AtomicBool>,
    dns_thread: Option<std::thread::JoinHandle<()>>,
    /// Admin kubeconfig (server `https://NODE_IP:port`, CA-verified).
    pub kubeconfig: PathBuf,
    /// Scratch directory (removed on drop; logs under `logs/`).
    pub dir: PathBuf,
    socket: PathBuf,
    proxy_bin: PathBuf,
}

fn wait_until(
    what: &str,
    timeout: Duration,
    mut ok: impl FnMut() -> bool,
    why: impl Fn() -> String,
) {
    let deadline = Instant::now() + timeout;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "{what} not ready after {timeout:?}\n{}",
            why()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

impl Node {
    /// Brings the node up (about 30-60 s) and imports `images` (docker or
    /// OCI archives) into its containerd.
    pub fn start(bins: &NodeBinaries, images: &[PathBuf]) -> Self {
        let dir = std::env::temp_dir().join(format!("ic-node-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["logs", "pki", "net.d", "cni-ipam", "kubelet", "containerd"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        let host = HostState::record();
        let mut node = Self {
            components: Vec::new(),
            host: Some(host),
            dns_stop: Arc::new(AtomicBool::new(false)),
            dns_thread: None,
            kubeconfig: dir.join("kubeconfig"),
            socket: dir.join("containerd.sock"),
            proxy_bin: bins.proxy.clone(),
            dir,
        };
        node.prepare_host();
        node.pki();
        node.start_control_plane(bins);
        node.start_containerd();
        node.import(&node.pause_archive(&bins.pause));
        for image in images {
            node.import(image);
        }
        node.start_dns();
        node.start_kubelet(bins);
        node.start_proxy(bins);
        node
    }

    fn p(&self, f: &str) -> String {
        self.dir.join(f).display().to_string()
    }

    fn spawn(&mut self, name: &'static str, cmd: &mut Command) {
        let log = std::fs::File::create(self.dir.join(format!("logs/{name}.log"))).unwrap();
        let err = log.try_clone().unwrap();
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        self.components.push(Component { name, child });
    }

    /// The last lines of a component's log.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let text =
            std::fs::read_to_string(self.dir.join(format!("logs/{name}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn prepare_host(&mut self) {
        let has_ip = sh_ok("ip -o addr show dev lo").contains(&format!(" {NODE_IP}/"));
        if !has_ip {
            sh_ok(&format!("ip addr add {NODE_IP}/32 dev lo"));
            if let Some(h) = self.host.as_mut() {
                h.added_ip = true;
            }
        }
        // Pod ↔ Service traffic over the bridge must see iptables (kube-proxy).
        for k in ["net/bridge/bridge-nf-call-iptables", "net/ipv4/ip_forward"] {
            let _ = std::fs::write(format!("/proc/sys/{k}"), "1");
        }
        // Pod traffic stays on this machine: whatever does not leave on the
        // bridge (to another pod) or go to the host itself is dropped.
        sh_ok(&format!(
            "iptables -I FORWARD 1 -i {BRIDGE} ! -o {BRIDGE} -j DROP"
        ));
        std::fs::write(
            self.dir.join("net.d/10-bridge.conflist"),
            serde_json::json!({
                "cniVersion": "0.4.0",
                "name": "ic-node",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": BRIDGE,
                        "isGateway": true,
                        "ipMasq": false,
                        "hairpinMode": true,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{"subnet": POD_CIDR}]],
                            "routes": [{"dst": "0.0.0.0/0"}],
                            "dataDir": self.p("cni-ipam"),
                        }
                    },
                    {"type": "portmap", "capabilities": {"portMappings": true}}
                ]
            })
            .to_string(),
        )
        .unwrap();
    }

    fn pki(&self) {
        let d = self.p("pki");
        sh_ok(&format!(
            "cd {d} && openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3 -subj /CN=ic-node-ca 2>/dev/null \
             && openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr -subj /CN=kube-apiserver 2>/dev/null \
             && printf 'subjectAltName=IP:{NODE_IP},IP:10.0.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\\n' > san.ext \
             && openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out apiserver.crt -days 3 -extfile san.ext 2>/dev/null \
             && openssl genrsa -out sa.key 2048 2>/dev/null && openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null"
        ));
        std::fs::write(
            self.dir.join("pki/tokens.csv"),
            format!("{ADMIN_TOKEN},admin,1,\"system:masters\"\n"),
        )
        .unwrap();
    }

    fn start_control_plane(&mut self, bins: &NodeBinaries) {
        let (client, peer, port) = (free_port(), free_port(), free_port());
        let etcd_dir = self.p("etcd");
        self.spawn(
            "etcd",
            Command::new("etcd")
                .arg(format!("--data-dir={etcd_dir}"))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!(
                    "--initial-advertise-peer-urls=http://127.0.0.1:{peer}"
                ))
                .arg(format!("--initial-cluster=default=http://127.0.0.1:{peer}")),
        );
        std::fs::write(
            &self.kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: ic-node\n  cluster:\n    server: https://{NODE_IP}:{port}\n    certificate-authority: {ca}\n\
                 users:\n- name: admin\n  user:\n    token: {ADMIN_TOKEN}\ncontexts:\n- name: ic-node\n  context:\n    cluster: ic-node\n    user: admin\ncurrent-context: ic-node\n",
                ca = self.p("pki/ca.crt")
            ),
        )
        .unwrap();
        let pki_dir = self.dir.join("pki");
        let pki = |f: &str| pki_dir.join(f).display().to_string();
        let mut api = Command::new(&bins.apiserver);
        api.arg(format!("--etcd-servers=http://127.0.0.1:{client}"))
            .arg(format!("--bind-address={NODE_IP}"))
            .arg(format!("--advertise-address={NODE_IP}"))
            .arg(format!("--secure-port={port}"))
            .arg("--insecure-port=0")
            .arg(format!("--tls-cert-file={}", pki("apiserver.crt")))
            .arg(format!("--tls-private-key-file={}", pki("apiserver.key")))
            .arg(format!("--client-ca-file={}", pki("ca.crt")))
            .arg(format!("--token-auth-file={}", pki("tokens.csv")))
            .arg("--authorization-mode=RBAC")
            .arg("--allow-privileged=true")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", pki("sa.pub")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                pki("sa.key")
            ))
            .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
            .arg("--kubelet-preferred-address-types=InternalIP,Hostname")
            .arg("--enable-aggregator-routing=true");
        self.spawn("kube-apiserver", &mut api);
        wait_until(
            "kube-apiserver",
            Duration::from_secs(90),
            || self.kubectl(&["get", "--raw", "/readyz"]).status.success(),
            || {
                let out = self.kubectl(&["get", "--raw", "/readyz?verbose"]);
                format!(
                    "{}{}\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr),
                    self.log_tail("kube-apiserver", 30)
                )
            },
        );
        let kc = self.kubeconfig.display().to_string();
        let (cm_port, sched_port) = (free_port(), free_port());
        let cm_dir = self.p("controller-manager");
        self.spawn(
            "kube-controller-manager",
            Command::new(&bins.controller_manager)
                .arg(format!("--kubeconfig={kc}"))
                .arg(format!("--authentication-kubeconfig={kc}"))
                .arg(format!("--authorization-kubeconfig={kc}"))
                .arg("--leader-elect=false")
                .arg("--port=0")
                .arg(format!("--secure-port={cm_port}"))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--cert-dir={cm_dir}"))
                .arg(format!(
                    "--service-account-private-key-file={}",
                    pki("sa.key")
                ))
                .arg(format!("--root-ca-file={}", pki("ca.crt")))
                .arg("--use-service-account-credentials=false"),
        );
        let sched_dir = self.p("scheduler");
        self.spawn(
            "kube-scheduler",
            Command::new(&bins.scheduler)
                .arg(format!("--kubeconfig={kc}"))
                .arg(format!("--authentication-kubeconfig={kc}"))
                .arg(format!("--authorization-kubeconfig={kc}"))
                .arg("--leader-elect=false")
                .arg("--port=0")
                .arg(format!("--secure-port={sched_port}"))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--cert-dir={sched_dir}")),
        );
    }

    fn ctr(&self, args: &str) -> Output {
        sh(&format!(
            "ctr --address {} --namespace k8s.io {args}",
            self.socket.display()
        ))
    }

    fn start_containerd(&mut self) {
        let d = self.p("containerd");
        std::fs::write(
            self.dir.join("containerd.toml"),
            format!(
                r#"version = 2
root = "{d}/root"
state = "{d}/state"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{netd}"
"#,
                sock = self.socket.display(),
                netd = self.p("net.d"),
            ),
        )
        .unwrap();
        let config = self.p("containerd.toml");
        self.spawn(
            "containerd",
            Command::new("containerd").arg(format!("--config={config}")),
        );
        wait_until(
            "containerd",
            Duration::from_secs(60),
            || self.ctr("version").status.success(),
            || self.log_tail("containerd", 30),
        );
    }

    /// A docker-archive of the sandbox image, built from the static pause
    /// binary (no registry to pull `k8s.gcr.io/pause` from).
    fn pause_archive(&self, pause: &Path) -> PathBuf {
        let d = self.p("pause-image");
        let out = self.dir.join("pause.tar");
        sh_ok(&format!(
            "set -e; mkdir -p {d}/layer && cp {pause} {d}/layer/pause && chmod 0755 {d}/layer/pause && cd {d} \
             && tar -C layer --owner=0 --group=0 --numeric-owner -cf layer.tar pause \
             && diff=$(sha256sum layer.tar | cut -d' ' -f1) \
             && printf '{{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{{\"Entrypoint\":[\"/pause\"]}},\"rootfs\":{{\"type\":\"layers\",\"diff_ids\":[\"sha256:%s\"]}}}}' \"$diff\" > config.json \
             && cfg=$(sha256sum config.json | cut -d' ' -f1) && mv config.json \"$cfg.json\" \
             && printf '[{{\"Config\":\"%s.json\",\"RepoTags\":[\"{PAUSE_IMAGE}\"],\"Layers\":[\"layer.tar\"]}}]' \"$cfg\" > manifest.json \
             && tar -cf {out} manifest.json \"$cfg.json\" layer.tar",
            pause = pause.display(),
            out = out.display(),
        ));
        out
    }

    /// Imports an image archive into the node's containerd.
    pub fn import(&self, archive: &Path) {
        let out = self.ctr(&format!(
            "images import --no-unpack=false {}",
            archive.display()
        ));
        assert!(
            out.status.success(),
            "import {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn start_dns(&mut self) {
        let hosts = self.p("dns-hosts");
        std::fs::write(&hosts, "").unwrap();
        let pid_file = self.p("dnsmasq.pid");
        self.spawn(
            "dnsmasq",
            Command::new("dnsmasq")
                .arg("--keep-in-foreground")
                .arg("--no-resolv")
                .arg("--no-hosts")
                .arg("--bind-interfaces")
                .arg(format!("--listen-address={NODE_IP}"))
                .arg("--port=53")
                .arg(format!("--addn-hosts={hosts}"))
                // Names under these are ours: unknown ones are NXDOMAIN at
                // once (the resolver's search list walks through them).
                .arg("--local=/cluster.local/")
                .arg("--local=/svc/")
                .arg(format!("--pid-file={pid_file}"))
                .arg("--user=root")
                .arg("--log-facility=-"),
        );
        let pid = self.components.last().map(|c| c.child.id()).unwrap_or(0);
        let (kubeconfig, stop) = (self.kubeconfig.clone(), self.dns_stop.clone());
        let hosts = PathBuf::from(hosts);
        self.dns_thread = Some(std::thread::spawn(move || {
            let mut last = String::new();
            while !stop.load(Ordering::Relaxed) {
                if let Some(text) = service_hosts(&kubeconfig) {
                    if text != last {
                        let _ = std::fs::write(&hosts, &text);
                        let _ = Command::new("kill")
                            .args(["-HUP", &pid.to_string()])
                            .status();
                        last = text;
                    }
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        }));
    }

    fn start_kubelet(&mut self, bins: &NodeBinaries) {
        let (port, healthz) = (free_port(), free_port());
        std::fs::write(
            self.dir.join("resolv.conf"),
            format!("nameserver {NODE_IP}\n"),
        )
        .unwrap();
        std::fs::write(
            self.dir.join("kubelet.yaml"),
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                 address: {NODE_IP}\nport: {port}\nreadOnlyPort: 0\n\
                 healthzBindAddress: 127.0.0.1\nhealthzPort: {healthz}\n\
                 cgroupDriver: cgroupfs\nclusterDNS: [\"{NODE_IP}\"]\nclusterDomain: cluster.local\n\
                 resolvConf: {resolv}\n\
                 authentication:\n  anonymous:\n    enabled: true\n  webhook:\n    enabled: false\n\
                 authorization:\n  mode: AlwaysAllow\n\
                 failSwapOn: false\n\
                 imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n\
                 evictionHard:\n  memory.available: 100Mi\n  nodefs.available: 1%\n  imagefs.available: 1%\n  nodefs.inodesFree: 1%\n\
                 nodeStatusUpdateFrequency: 4s\nsyncFrequency: 10s\n\
                 serializeImagePulls: false\n\
                 volumePluginDir: {plugins}\n",
                resolv = self.p("resolv.conf"),
                plugins = self.p("volume-plugins"),
            ),
        )
        .unwrap();
        let (config, kc, root, pki) = (
            self.p("kubelet.yaml"),
            self.kubeconfig.display().to_string(),
            self.p("kubelet"),
            self.p("kubelet-pki"),
        );
        let sock = self.socket.display().to_string();
        self.spawn(
            "kubelet",
            Command::new(&bins.kubelet)
                .arg(format!("--config={config}"))
                .arg(format!("--kubeconfig={kc}"))
                .arg("--container-runtime=remote")
                .arg(format!("--container-runtime-endpoint=unix://{sock}"))
                .arg(format!("--pod-infra-container-image={PAUSE_IMAGE}"))
                .arg(format!("--root-dir={root}"))
                .arg(format!("--cert-dir={pki}"))
                .arg(format!("--node-ip={NODE_IP}"))
                .arg(format!("--hostname-override={NODE_NAME}")),
        );
        wait_until(
            "the node",
            Duration::from_secs(120),
            || {
                self.kubectl(&[
                    "wait",
                    "--for=condition=Ready",
                    &format!("node/{NODE_NAME}"),
                    "--timeout=2s",
                ])
                .status
                .success()
            },
            || self.log_tail("kubelet", 40),
        );
    }

    fn start_proxy(&mut self, bins: &NodeBinaries) {
        let kc = self.kubeconfig.display().to_string();
        let (metrics, healthz) = (free_port(), free_port());
        self.spawn(
            "kube-proxy",
            Command::new(&bins.proxy)
                .arg(format!("--kubeconfig={kc}"))
                .arg(format!("--hostname-override={NODE_NAME}"))
                .arg("--proxy-mode=iptables")
                .arg(format!("--cluster-cidr={POD_CIDR}"))
                .arg(format!("--bind-address={NODE_IP}"))
                .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
                .arg(format!("--healthz-bind-address=127.0.0.1:{healthz}"))
                // No CAP_SYS_ADMIN over nf_conntrack sysctls here: leave them.
                .arg("--conntrack-max-per-core=0")
                .arg("--conntrack-min=0")
                .arg("--conntrack-tcp-timeout-established=0")
                .arg("--conntrack-tcp-timeout-close-wait=0"),
        );
        // Ready once it programmed the `kubernetes` Service.
        wait_until(
            "kube-proxy",
            Duration::from_secs(60),
            || {
                sh("iptables-save -t nat").status.success()
                    && String::from_utf8_lossy(&sh("iptables-save -t nat").stdout)
                        .contains("default/kubernetes:https")
            },
            || self.log_tail("kube-proxy", 30),
        );
    }

    /// Runs kubectl against the node.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .output()
            .unwrap()
    }

    /// kubectl that must succeed; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every component's log tail (for failure messages).
    pub fn diagnostics(&self) -> String {
        self.components
            .iter()
            .map(|c| format!("--- {} ---\n{}", c.name, self.log_tail(c.name, 15)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn kill_pods(&self) {
        // Pods first: every process in the kubelet's cgroups (runc puts the
        // containers there), then the shims our containerd started.
        for _ in 0..20 {
            let pids: BTreeSet<u32> = kubepods_cgroups()
                .iter()
                .flat_map(|d| {
                    std::fs::read_to_string(d.join("cgroup.procs"))
                        .unwrap_or_default()
                        .lines()
                        .filter_map(|l| l.trim().parse().ok())
                        .collect::<Vec<u32>>()
                })
                .collect();
            let shims = processes_mentioning(&self.socket.display().to_string());
            if pids.is_empty() && shims.is_empty() {
                return;
            }
            for pid in pids.iter().chain(&shims) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// PIDs whose command line contains `needle` (the shims name our socket).
fn processes_mentioning(needle: &str) -> BTreeSet<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            (pid != me && String::from_utf8_lossy(&cmd).contains(needle)).then_some(pid)
        })
        .collect()
}

/// The hosts file of every Service (`name.ns.svc` and `.cluster.local`).
fn service_hosts(kubeconfig: &Path) -> Option<String> {
    let out = Command::new("kubectl")
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["get", "services", "-A", "-o", "json"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let mut lines = Vec::new();
    for s in v["items"].as_array()? {
        let ip = s["spec"]["clusterIP"].as_str().unwrap_or_default();
        if ip.is_empty() || ip == "None" {
            continue;
        }
        let (name, ns) = (
            s["metadata"]["name"].as_str()?,
            s["metadata"]["namespace"].as_str()?,
        );
        lines.push(format!(
            "{ip} {name}.{ns}.svc {name}.{ns}.svc.cluster.local"
        ));
    }
    lines.sort();
    Some(lines.join("\n") + "\n")
}

impl Drop for Node {
    fn drop(&mut self) {
        self.dns_stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.dns_thread.take() {
            let _ = t.join();
        }
        if std::thread::panicking() {
            let keep = std::env::temp_dir().join(format!("ic-node-logs-{}", std::process::id()));
            let _ = sh(&format!("cp -r {} {}", self.p("logs"), keep.display()));
            eprintln!("node logs kept in {}", keep.display());
        }
        // Stop in reverse start order, except pods go before the kubelet
        // could restart them: kubelet, then pods, then the rest.
        let order = ["kubelet", "kube-proxy"];
        for name in order {
            for c in self.components.iter_mut().filter(|c| c.name == name) {
                let _ = c.child.kill();
                let _ = c.child.wait();
            }
        }
        self.kill_pods();
        while let Some(mut c) = self.components.pop() {
            let _ = c.child.kill();
            let _ = c.child.wait();
        }
        // kube-proxy's own cleanup of its chains (the restore below would
        // do it too; this also flushes its ipvs/conntrack leftovers).
        let _ = Command::new(&self.proxy_bin)
            .arg("--cleanup")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // Unmount everything below the scratch directory, deepest first.
        let dir = self.dir.display().to_string();
        let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
            .filter(|m| m.starts_with(&dir))
            .collect();
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for m in mounts {
            let _ = Command::new("umount").args(["-l", &m]).status();
        }
        if let Some(h) = self.host.take() {
            h.restore();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

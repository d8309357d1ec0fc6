//! `doctor --kubeconfig`: finds in a cluster what the other checks dial
//! (the server's Service, its Deployment, the operator, the custom
//! resources, the pods with an injected sidecar) and reports each finding
//! as a check of its own, with the fix when something is missing.
//!
//! Custom resources are read as `DynamicObject`s found through API
//! discovery, not as the operator's types: a doctor must still describe a
//! cluster whose CRDs are older or newer than this binary.

use super::reach::{self, Kind, Rule};
use super::report::{Check, Status};
use inferencecache_operator::crd::CACHE_DOMAIN_LABEL;
use inferencecache_operator::webhook::inject::{INJECTED_BY, SIDECAR_METRICS_PORT, SIDECAR_NAME};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Container, Pod, Service, ServiceAccount};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

/// The label config/server puts on the server's Service and Deployment.
pub const SERVER_LABEL: &str = "app.kubernetes.io/name=inference-cache-server";
/// The label config/operator puts on the operator's Deployment.
pub const OPERATOR_LABEL: &str = "app.kubernetes.io/name=inference-cache-controller";
/// The custom resources' API group.
const GROUP: &str = "inferencecache.io";
/// Kinds counted in `kube.crds` (CacheBackend first: injection needs it).
const KINDS: [&str; 3] = ["CacheBackend", "CacheTenant", "CachePolicy"];
/// Service ports of config/server/service.yaml, by name, with the numbers
/// used when a Service has unnamed ports.
const GRPC: (&str, u16) = ("grpc", 9090);
const HTTP: (&str, u16) = ("http", 8080);
const CONTROL: (&str, u16) = ("control", 8081);

/// What discovery needs from the flags.
#[derive(Debug)]
pub struct Options {
    /// Kubeconfig file; `None`: KUBECONFIG, ~/.kube/config, in-cluster.
    pub kubeconfig: Option<PathBuf>,
    /// Context to use instead of the current one.
    pub context: Option<String>,
    /// Namespace of the server and the operator.
    pub namespace: String,
    /// `--address-override` rules.
    pub overrides: Vec<Rule>,
    /// Time allowed for each API call.
    pub timeout: Duration,
    /// --server was given: a missing server Service is then only a warning
    /// (the server may run outside the cluster).
    pub server_flag_given: bool,
    /// --token or --token-file was given.
    pub have_token: bool,
    /// --kube-token: mint the controller's token with TokenRequest.
    pub mint_token: bool,
}

/// The server's addresses (HOST:PORT each).
#[derive(Debug, Clone)]
pub struct Server {
    /// gRPC.
    pub grpc: String,
    /// Public HTTP listener.
    pub http: String,
    /// Control listener.
    pub control: String,
    /// The Service's DNS name when the Deployment serves TLS (the name its
    /// certificate carries), else `None`.
    pub tls_name: Option<String>,
}

/// A sidecar found in a pod.
#[derive(Debug, Clone)]
pub struct Sidecar {
    /// `namespace/pod`, for check names.
    pub label: String,
    /// Its HTTP base URL.
    pub url: String,
    /// What to do when that URL does not answer.
    pub unreachable_fix: String,
}

/// Everything discovery found, and its checks.
#[derive(Debug, Default)]
pub struct Found {
    /// The `kube.*` checks, in order.
    pub checks: Vec<Check>,
    /// The server, when its Service was found.
    pub server: Option<Server>,
    /// Sidecars with an address.
    pub sidecars: Vec<Sidecar>,
    /// Tenant, model and hash scheme the first sidecar reports under.
    pub tenant: Option<String>,
    /// See `tenant`.
    pub model: Option<String>,
    /// See `tenant`.
    pub hash_scheme: Option<String>,
    /// A controller token minted for the control listener (--kube-token).
    pub token: Option<String>,
}

/// An error with its causes, one line (kube's top-level messages alone
/// rarely say "connection refused").
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    if let Some(kube::Error::Api(s)) = e.downcast_ref::<kube::Error>() {
        return format!("{} ({} {})", s.message, s.code, s.reason);
    }
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

async fn timed<T>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(chain(&e)),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

async fn connect(o: &Options) -> Result<(Client, String), String> {
    let options = KubeConfigOptions {
        context: o.context.clone(),
        ..Default::default()
    };
    let mut config = match &o.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| format!("{}: {}", path.display(), chain(&e)))?;
            Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| chain(&e))?
        }
        None if o.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| chain(&e))?,
        None => Config::infer().await.map_err(|e| chain(&e))?,
    };
    config.connect_timeout = Some(o.timeout);
    config.read_timeout = Some(o.timeout);
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|e| chain(&e))?;
    Ok((client, url))
}

/// Runs discovery.
pub async fn run(o: &Options) -> Found {
    let mut found = Found::default();
    let (client, url) = match connect(o).await {
        Ok(c) => c,
        Err(e) => {
            found.checks.push(Check::fail(
                "kube.cluster",
                format!("cannot load the kubeconfig: {e}"),
                "pass --kubeconfig PATH (or set KUBECONFIG) and --context NAME; inside a pod, \
                 doctor uses the pod's service account",
            ));
            return found;
        }
    };
    match timed(o.timeout, client.apiserver_version()).await {
        Ok(v) => found.checks.push(Check::ok(
            "kube.cluster",
            format!("{url} answers (Kubernetes {})", v.git_version),
        )),
        Err(e) => {
            found.checks.push(Check::fail(
                "kube.cluster",
                format!("{url}: {e}"),
                "the API server is not reachable with this kubeconfig: check --kubeconfig and \
                 --context (`kubectl config get-contexts`) and that `kubectl version` works",
            ));
            return found;
        }
    }
    server(o, &client, &mut found).await;
    operator(o, &client, &mut found).await;
    let backends = custom_resources(o, &client, &mut found).await;
    sidecars(o, &client, backends.as_ref(), &mut found).await;
    found
}

/// Brackets an IPv6 address for HOST:PORT.
fn host(ip: &str) -> String {
    if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    }
}

fn args_of(c: &Container) -> impl Iterator<Item = &str> {
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .map(String::as_str)
}

/// The value of `--flag=V` / `--flag V` (or Go-style `-flag`) in `c`.
fn flag(c: &Container, name: &str) -> Option<String> {
    let words: Vec<&str> = args_of(c).collect();
    words.iter().enumerate().find_map(|(i, w)| {
        let w = w.strip_prefix("--").or_else(|| w.strip_prefix('-'))?;
        match w.split_once('=') {
            Some((n, v)) if n == name => Some(v.to_owned()),
            None if w == name => words.get(i + 1).map(|v| (*v).to_owned()),
            _ => None,
        }
    })
}

/// `kube.server` and `kube.server.deployment`.
async fn server(o: &Options, client: &Client, found: &mut Found) {
    let ns = &o.namespace;
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let list = timed(
        o.timeout,
        services.list(&ListParams::default().labels(SERVER_LABEL)),
    )
    .await;
    let mut services = match list {
        Ok(l) => l.items,
        Err(e) => {
            found.checks.push(Check::fail(
                "kube.server",
                format!("cannot list Services in {ns}: {e}"),
                "your kubeconfig user needs `list services` in this namespace; or pass --server",
            ));
            return;
        }
    };
    services.sort_by_key(ResourceExt::name_any);
    let Some(svc) = services.first() else {
        let status = if o.server_flag_given {
            Status::Warn
        } else {
            Status::Fail
        };
        found.checks.push(Check::new(
            "kube.server",
            status,
            format!("no Service labelled {SERVER_LABEL} in namespace {ns}"),
            "install the server (`kubectl apply -k config/default`, which applies \
             config/server/service.yaml), pass --namespace where it runs, or pass --server \
             HOST:PORT",
        ));
        return;
    };
    let name = svc.name_any();
    let spec = svc.spec.clone().unwrap_or_default();
    let ports = spec.ports.unwrap_or_default();
    let port = |(want, default): (&str, u16)| {
        ports
            .iter()
            .find(|p| p.name.as_deref() == Some(want))
            .and_then(|p| u16::try_from(p.port).ok())
            .unwrap_or(default)
    };
    let cluster_host = spec
        .cluster_ip
        .filter(|ip| !ip.is_empty() && ip != "None")
        .map_or_else(|| format!("{name}.{ns}.svc"), |ip| host(&ip));
    let addr = |p: u16| {
        reach::lookup(&o.overrides, Kind::Service, ns, &name, p)
            .unwrap_or_else(|| format!("{cluster_host}:{p}"))
    };
    let (grpc, http, control) = (addr(port(GRPC)), addr(port(HTTP)), addr(port(CONTROL)));
    let via = if reach::names(&o.overrides, Kind::Service, ns, &name) {
        " (via --address-override)"
    } else {
        ""
    };
    let mut detail =
        format!("svc/{name} in {ns}: grpc {grpc}, http {http}, control {control}{via}");
    if services.len() > 1 {
        detail.push_str(&format!(
            "; {} more Service(s) carry the label",
            services.len() - 1
        ));
    }
    found.checks.push(Check::ok("kube.server", detail));
    let serve = deployment(o, client, found).await;
    found.server = Some(Server {
        grpc,
        http,
        control,
        tls_name: serve.tls.then(|| format!("{name}.{ns}.svc")),
    });
    if let Some(sa) = serve.controller_sa {
        token(o, client, &sa, &serve.audience, found).await;
    }
}

/// What the server Deployment's container flags say.
#[derive(Debug, Default)]
struct Serve {
    /// `--tls-cert-file` is set.
    tls: bool,
    /// `--allowed-controller-sa`: the control listener wants its token.
    controller_sa: Option<String>,
    /// `--controller-audience`.
    audience: String,
}

/// `kube.token`: the control listener wants a token of `sa`; mint one
/// (--kube-token) or say how to get one.
async fn token(o: &Options, client: &Client, sa: &str, audience: &str, found: &mut Found) {
    const NAME: &str = "kube.token";
    if o.have_token {
        return;
    }
    let Some((sa_ns, sa_name)) = sa
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    else {
        found.checks.push(Check::warn(
            NAME,
            format!("the control listener admits {sa}, which is not a service account"),
            "pass --token or --token-file with a token of that user",
        ));
        return;
    };
    let by_hand = format!(
        "`kubectl -n {sa_ns} create token {sa_name} --audience {audience}` into --token-file"
    );
    if !o.mint_token {
        found.checks.push(Check::warn(
            NAME,
            format!("the control listener wants a token of {sa}; none given, so /probe and the policy checks will be refused"),
            format!("pass --kube-token (doctor mints a 10-minute one with TokenRequest), or {by_hand}"),
        ));
        return;
    }
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), sa_ns);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_owned()],
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    };
    let minted = timed(
        o.timeout,
        api.create_token_request(sa_name, &PostParams::default(), &request),
    )
    .await;
    match minted.map(|r| r.status.map(|s| s.token).unwrap_or_default()) {
        Ok(t) if !t.is_empty() => {
            found.checks.push(Check::ok(
                NAME,
                format!("minted a 10-minute token of {sa} (audience {audience})"),
            ));
            found.token = Some(t);
        }
        Ok(_) => found.checks.push(Check::fail(
            NAME,
            format!("TokenRequest for {sa} returned no token"),
            format!("pass {by_hand}"),
        )),
        Err(e) => found.checks.push(Check::fail(
            NAME,
            format!("cannot mint a token of {sa}: {e}"),
            format!(
                "your kubeconfig user needs `create serviceaccounts/token` in {sa_ns} (and the \
                 service account must exist, config/rbac); or {by_hand}"
            ),
        )),
    }
}

fn readiness(d: &Deployment) -> (i32, i32) {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let ready = d
        .status
        .as_ref()
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    (ready, want)
}

/// Deployments labelled `label` in the namespace, by name.
async fn deployments(o: &Options, client: &Client, label: &str) -> Result<Vec<Deployment>, String> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), &o.namespace);
    let mut items = timed(o.timeout, api.list(&ListParams::default().labels(label)))
        .await?
        .items;
    items.sort_by_key(ResourceExt::name_any);
    Ok(items)
}

/// `kube.server.deployment`, and what its server container's flags say.
async fn deployment(o: &Options, client: &Client, found: &mut Found) -> Serve {
    const NAME: &str = "kube.server.deployment";
    let ns = &o.namespace;
    let d = match deployments(o, client, SERVER_LABEL).await {
        Ok(items) => match items.into_iter().next() {
            Some(d) => d,
            None => {
                found.checks.push(Check::warn(
                    NAME,
                    format!("the Service exists but no Deployment labelled {SERVER_LABEL} in {ns}"),
                    "the Service has nothing behind it unless the server runs some other way: \
                     apply config/server/deployment.yaml (`kubectl apply -k config/default`)",
                ));
                return Serve::default();
            }
        },
        Err(e) => {
            found.checks.push(Check::warn(
                NAME,
                format!("cannot list Deployments in {ns}: {e}"),
                "your kubeconfig user needs `list deployments` to check the server's rollout",
            ));
            return Serve::default();
        }
    };
    let name = d.name_any();
    let server = d
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .and_then(|s| s.containers.first().cloned());
    let setting = |name: &str, env: &str| {
        server.as_ref().and_then(|c| {
            flag(c, name).or_else(|| {
                c.env
                    .iter()
                    .flatten()
                    .find(|e| e.name == env)
                    .and_then(|e| e.value.clone())
            })
        })
    };
    let tls =
        setting("tls-cert-file", "INFERENCECACHE_TLS_CERT_FILE").is_some_and(|v| !v.is_empty());
    let controller_sa = setting(
        "allowed-controller-sa",
        "INFERENCECACHE_ALLOWED_CONTROLLER_SA",
    )
    .filter(|v| !v.is_empty());
    let audience = setting("controller-audience", "INFERENCECACHE_CONTROLLER_AUDIENCE")
        .unwrap_or_else(|| inferencecache_server::config::DEFAULT_CONTROLLER_AUDIENCE.to_owned());
    let (ready, want) = readiness(&d);
    let mode = if tls { "TLS" } else { "plaintext gRPC" };
    if ready == 0 && want > 0 {
        found.checks.push(Check::fail(
            NAME,
            format!("deploy/{name}: 0/{want} replicas ready"),
            format!(
                "the server's pods do not become ready: `kubectl -n {ns} describe deploy/{name}` \
                 and `kubectl -n {ns} logs deploy/{name}` say why (image, readiness on /readyz)"
            ),
        ));
    } else {
        found.checks.push(Check::ok(
            NAME,
            format!("deploy/{name}: {ready}/{want} replicas ready, {mode}"),
        ));
    }
    Serve {
        tls,
        controller_sa,
        audience,
    }
}

/// `kube.operator`.
async fn operator(o: &Options, client: &Client, found: &mut Found) {
    const NAME: &str = "kube.operator";
    let ns = &o.namespace;
    match deployments(o, client, OPERATOR_LABEL).await {
        Err(e) => found.checks.push(Check::warn(
            NAME,
            format!("cannot list Deployments in {ns}: {e}"),
            "your kubeconfig user needs `list deployments` to check the operator",
        )),
        Ok(items) => match items.first() {
            None => found.checks.push(Check::warn(
                NAME,
                format!("no Deployment labelled {OPERATOR_LABEL} in {ns}"),
                "without the operator no CachePolicy reaches the server and no sidecar is \
                 injected: apply config/operator (`kubectl apply -k config/default`)",
            )),
            Some(d) => {
                let (ready, want) = readiness(d);
                let name = d.name_any();
                if ready == 0 && want > 0 {
                    found.checks.push(Check::fail(
                        NAME,
                        format!("deploy/{name}: 0/{want} replicas ready"),
                        format!(
                            "the operator does not become ready: `kubectl -n {ns} logs \
                             deploy/{name}` (its webhook certificate comes from cert-manager; \
                             its RBAC from config/rbac)"
                        ),
                    ));
                } else {
                    found.checks.push(Check::ok(
                        NAME,
                        format!("deploy/{name}: {ready}/{want} replicas ready"),
                    ));
                }
            }
        },
    }
}

/// `kube.crds`; the CacheBackends' `namespace/name`s when they could be
/// listed.
async fn custom_resources(
    o: &Options,
    client: &Client,
    found: &mut Found,
) -> Option<BTreeSet<String>> {
    const NAME: &str = "kube.crds";
    let group = match timed(o.timeout, kube::discovery::group(client, GROUP)).await {
        Ok(g) => g,
        Err(e) => {
            found.checks.push(Check::warn(
                NAME,
                format!("the {GROUP} API group is not served ({e})"),
                "install the CRDs: `inferencecache crds | kubectl apply -f -` (or \
                 `kubectl apply -k config/default`)",
            ));
            return None;
        }
    };
    let mut counts = Vec::new();
    let mut missing = Vec::new();
    let mut backends = None;
    for kind in KINDS {
        let Some((resource, _)) = group.recommended_kind(kind) else {
            missing.push(kind);
            continue;
        };
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        match timed(o.timeout, api.list(&ListParams::default())).await {
            Ok(list) => {
                counts.push(format!("{} {kind}", list.items.len()));
                if kind == "CacheBackend" {
                    backends = Some(
                        list.items
                            .iter()
                            .map(|b| {
                                format!("{}/{}", b.namespace().unwrap_or_default(), b.name_any())
                            })
                            .collect::<BTreeSet<_>>(),
                    );
                }
            }
            Err(e) => counts.push(format!("{kind}: cannot list ({e})")),
        }
    }
    if !missing.is_empty() {
        found.checks.push(Check::warn(
            NAME,
            format!(
                "{GROUP} lacks {}; {}",
                missing.join(", "),
                counts.join(", ")
            ),
            "the CRDs are older than this binary: `inferencecache crds | kubectl apply -f -`",
        ));
    } else if backends.as_ref().is_some_and(BTreeSet::is_empty) {
        found.checks.push(Check::warn(
            NAME,
            format!("CRDs installed; {}", counts.join(", ")),
            "no CacheBackend, so no engine pod gets a sidecar: apply one selecting your \
             engines (config/samples/cachebackend.yaml)",
        ));
    } else {
        found.checks.push(Check::ok(
            NAME,
            format!("CRDs installed; {}", counts.join(", ")),
        ));
    }
    backends
}

/// `kube.sidecars` and, per sidecar pod without an address,
/// `kube.sidecar NS/POD`.
async fn sidecars(
    o: &Options,
    client: &Client,
    backends: Option<&BTreeSet<String>>,
    found: &mut Found,
) {
    const NAME: &str = "kube.sidecars";
    let pods: Api<Pod> = Api::all(client.clone());
    let list = timed(
        o.timeout,
        pods.list(&ListParams::default().labels(CACHE_DOMAIN_LABEL)),
    )
    .await;
    let mut pods = match list {
        Ok(l) => l.items,
        Err(e) => {
            found.checks.push(Check::warn(
                NAME,
                format!("cannot list pods labelled {CACHE_DOMAIN_LABEL}: {e}"),
                "your kubeconfig user needs `list pods` in all namespaces to find sidecars; \
                 or pass --sidecar for each",
            ));
            return;
        }
    };
    pods.sort_by_key(|p| (p.namespace().unwrap_or_default(), p.name_any()));
    let mut injected = Vec::new();
    let mut bare = Vec::new();
    let mut orphans = Vec::new();
    for pod in &pods {
        let ns = pod.namespace().unwrap_or_default();
        let label = format!("{ns}/{}", pod.name_any());
        let sidecar = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().find(|c| c.name == SIDECAR_NAME));
        let Some(sidecar) = sidecar else {
            bare.push(label);
            continue;
        };
        if let (Some(known), Some(by)) = (backends, pod.annotations().get(INJECTED_BY)) {
            if !known.contains(by) {
                orphans.push(format!("{label} (injected by {by})"));
            }
        }
        injected.push(label.clone());
        let port = sidecar
            .ports
            .iter()
            .flatten()
            .find_map(|p| u16::try_from(p.container_port).ok())
            .or_else(|| u16::try_from(SIDECAR_METRICS_PORT).ok())
            .unwrap_or(8090);
        let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
        let addr = reach::lookup(&o.overrides, Kind::Pod, &ns, &pod.name_any(), port)
            .or_else(|| ip.map(|ip| format!("{}:{port}", host(&ip))));
        let Some(addr) = addr else {
            let phase = pod
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_else(|| "unknown".into());
            found.checks.push(Check::warn(
                format!("kube.sidecar {label}"),
                format!("no pod IP yet (phase {phase}): its sidecar is not checked"),
                format!(
                    "wait for the pod to run, or port-forward the sidecar \
                     (`kubectl -n {ns} port-forward pod/{} {port}`) and pass \
                     --address-override pod/{label}=127.0.0.1",
                    pod.name_any()
                ),
            ));
            continue;
        };
        if found.tenant.is_none() {
            found.tenant = Some(
                flag(sidecar, "tenant-id")
                    .filter(|t| !t.starts_with("$("))
                    .unwrap_or_else(|| ns.clone()),
            );
            found.model = flag(sidecar, "model-id");
            found.hash_scheme = flag(sidecar, "hash-scheme");
        }
        let pod_name = pod.name_any();
        let unreachable_fix = format!(
            "the sidecar does not answer at {addr}: see `kubectl -n {ns} logs {pod_name} -c \
             {SIDECAR_NAME}` (its --http-bind-address must be :{port}); a pod IP answers only \
             inside the cluster, so from outside `kubectl -n {ns} port-forward pod/{pod_name} \
             18090:{port}` and pass --address-override pod/{label}:{port}=127.0.0.1:18090"
        );
        found.sidecars.push(Sidecar {
            label,
            url: format!("http://{addr}"),
            unreachable_fix,
        });
    }
    let summary = format!(
        "{} pod(s) with an injected {SIDECAR_NAME}{}",
        injected.len(),
        if injected.is_empty() {
            String::new()
        } else {
            format!(": {}", injected.join(", "))
        }
    );
    if injected.is_empty() {
        found.checks.push(Check::warn(
            NAME,
            summary,
            format!(
                "label the engine pods {CACHE_DOMAIN_LABEL}=DOMAIN matching a CacheBackend's \
                 engineSelector in their namespace (config/samples/vllm-deployment.yaml), give \
                 the CacheBackend spec.observation.modelID and the operator \
                 --kvevent-subscriber-image; pods created before that need a restart"
            ),
        ));
    } else if !bare.is_empty() {
        found.checks.push(Check::warn(
            NAME,
            format!("{summary}; without one: {}", bare.join(", ")),
            "these pods carry the cache-domain label but no sidecar: they started before their \
             CacheBackend (or the webhook skipped them; the operator logs why): \
             `kubectl rollout restart` their Deployment",
        ));
    } else if !orphans.is_empty() {
        found.checks.push(Check::warn(
            NAME,
            format!(
                "{summary}; injected by a CacheBackend that is gone: {}",
                orphans.join(", ")
            ),
            "the sidecar keeps its old settings: restart these pods, or recreate the CacheBackend",
        ));
    } else {
        found.checks.push(Check::ok(NAME, summary));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_of_a_container_in_every_spelling() {
        let c = Container {
            command: Some(vec!["/inferencecache".into()]),
            args: Some(vec![
                "subscribe".into(),
                "--model-id=Qwen/Qwen3-0.6B".into(),
                "--tenant-id".into(),
                "team-a".into(),
                "-tls-cert-file=/tls/tls.crt".into(),
            ]),
            ..Default::default()
        };
        assert_eq!(flag(&c, "model-id").as_deref(), Some("Qwen/Qwen3-0.6B"));
        assert_eq!(flag(&c, "tenant-id").as_deref(), Some("team-a"));
        assert_eq!(flag(&c, "tls-cert-file").as_deref(), Some("/tls/tls.crt"));
        assert_eq!(flag(&c, "hash-scheme"), None);
        assert_eq!(host("10.0.0.1"), "10.0.0.1");
        assert_eq!(host("fd00::1"), "[fd00::1]");
    }
}

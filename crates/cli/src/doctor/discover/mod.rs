//! `doctor --kubeconfig`: finds in a cluster what the other checks dial
//! (the server's Service, its Deployment, the operator, the custom
//! resources, the pods with an injected sidecar) and reports each finding
//! as a check of its own, with the fix when something is missing.
//!
//! Custom resources are read as `DynamicObject`s found through API
//! discovery, not as the operator's types: a doctor must still describe a
//! cluster whose CRDs are older or newer than this binary.
//!
//! `server.rs` finds the server (`kube.server`, `kube.server.deployment`,
//! `kube.token`), `operator.rs` the operator and its custom resources
//! (`kube.operator`, `kube.crds`), `sidecars.rs` the engine pods
//! (`kube.sidecars`, `kube.sidecar NS/POD`).

mod operator;
mod server;
mod sidecars;

use super::reach::Rule;
use super::report::Check;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use std::path::PathBuf;
use std::time::Duration;

/// The label config/server puts on the server's Service and Deployment.
pub(super) const SERVER_LABEL: &str = "app.kubernetes.io/name=inference-cache-server";
/// The label config/operator puts on the operator's Deployment.
pub(super) const OPERATOR_LABEL: &str = "app.kubernetes.io/name=inference-cache-controller";

/// What discovery needs from the flags.
#[derive(Debug)]
pub(super) struct Options {
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
pub(super) struct Server {
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
pub(super) struct Sidecar {
    /// `namespace/pod`, for check names.
    pub label: String,
    /// Its HTTP base URL.
    pub url: String,
    /// What to do when that URL does not answer.
    pub unreachable_fix: String,
}

/// Everything discovery found, and its checks.
#[derive(Debug, Default)]
pub(super) struct Found {
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
pub(super) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
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

pub(super) async fn timed<T>(
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
pub(super) async fn run(o: &Options) -> Found {
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
    server::check(o, &client, &mut found).await;
    operator::check(o, &client, &mut found).await;
    let backends = operator::custom_resources(o, &client, &mut found).await;
    sidecars::check(o, &client, backends.as_ref(), &mut found).await;
    found
}

/// Brackets an IPv6 address for HOST:PORT.
pub(super) fn host(ip: &str) -> String {
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
pub(super) fn flag(c: &Container, name: &str) -> Option<String> {
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
pub(super) async fn deployments(
    o: &Options,
    client: &Client,
    label: &str,
) -> Result<Vec<Deployment>, String> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), &o.namespace);
    let mut items = timed(o.timeout, api.list(&ListParams::default().labels(label)))
        .await?
        .items;
    items.sort_by_key(ResourceExt::name_any);
    Ok(items)
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

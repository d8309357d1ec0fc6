//! Engine pods (labelled with the cache domain every engineSelector uses)
//! and the kvevent-subscriber sidecars injected into them.

use super::{Found, Options, Sidecar, flag, host, timed};
use crate::doctor::reach::{self, Kind};
use crate::doctor::report::Check;
use inferencecache_operator::crd::CACHE_DOMAIN_LABEL;
use inferencecache_operator::webhook::inject::{INJECTED_BY, SIDECAR_METRICS_PORT, SIDECAR_NAME};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeSet;

/// `kube.sidecars` and, per sidecar pod without an address,
/// `kube.sidecar NS/POD`.
pub(super) async fn check(
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

//! The operator's Deployment and the custom resources it works on, read as
//! `DynamicObject`s through API discovery (not the operator's types: a
//! doctor must describe a cluster whose CRDs are older or newer than it).

use super::{Found, OPERATOR_LABEL, Options, deployments, readiness, timed};
use crate::doctor::report::Check;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeSet;

/// The custom resources' API group.
const GROUP: &str = "inferencecache.io";
/// Kinds counted in `kube.crds` (CacheBackend first: injection needs it).
const KINDS: [&str; 3] = ["CacheBackend", "CacheTenant", "CachePolicy"];

/// `kube.operator`.
pub(super) async fn check(o: &Options, client: &Client, found: &mut Found) {
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
pub(super) async fn custom_resources(
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

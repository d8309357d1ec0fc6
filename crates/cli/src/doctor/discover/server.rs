//! The server in the cluster: its Service (addresses), its Deployment
//! (readiness, TLS, who may use the control listener) and, when asked, a
//! token for that listener.

use super::{Found, Options, SERVER_LABEL, Server, deployments, flag, host, readiness, timed};
use crate::doctor::reach::{self, Kind};
use crate::doctor::report::{Check, Status};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};

/// Service ports of config/server/service.yaml, by name, with the numbers
/// used when a Service has unnamed ports.
const GRPC: (&str, u16) = ("grpc", 9090);
const HTTP: (&str, u16) = ("http", 8080);
const CONTROL: (&str, u16) = ("control", 8081);

/// `kube.server`, `kube.server.deployment` and `kube.token`.
pub(super) async fn check(o: &Options, client: &Client, found: &mut Found) {
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
            flag(c, name)
                .or_else(|| {
                    c.env
                        .iter()
                        .flatten()
                        .find(|e| e.name == env)
                        .and_then(|e| e.value.clone())
                })
                .map(|v| expand_env_refs(&v, c, ns))
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

/// Expands `$(VAR)` in a container argument the way the kubelet does, from
/// the container's literal env values and the downward API's namespace
/// (`config/default` passes `--allowed-controller-sa
/// system:serviceaccount:$(POD_NAMESPACE):...`); an unknown reference stays
/// as written, as in Kubernetes.
fn expand_env_refs(value: &str, c: &k8s_openapi::api::core::v1::Container, ns: &str) -> String {
    let resolve = |var: &str| -> Option<String> {
        let e = c.env.iter().flatten().find(|e| e.name == var)?;
        if let Some(v) = &e.value {
            return Some(v.clone());
        }
        let field = e.value_from.as_ref()?.field_ref.as_ref()?;
        (field.field_path == "metadata.namespace").then(|| ns.to_owned())
    };
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("$(") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        match after.find(')') {
            Some(end) => {
                let var = &after[..end];
                match resolve(var) {
                    Some(v) => out.push_str(&v),
                    None => {
                        out.push_str("$(");
                        out.push_str(var);
                        out.push(')');
                    }
                }
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod expand_tests {
    use super::expand_env_refs;
    use k8s_openapi::api::core::v1::{Container, EnvVar, EnvVarSource, ObjectFieldSelector};

    #[test]
    fn pod_namespace_from_the_downward_api_and_literal_values() {
        let c = Container {
            env: Some(vec![
                EnvVar {
                    name: "POD_NAMESPACE".into(),
                    value_from: Some(EnvVarSource {
                        field_ref: Some(ObjectFieldSelector {
                            field_path: "metadata.namespace".into(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                EnvVar {
                    name: "SA".into(),
                    value: Some("ctl".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        assert_eq!(
            expand_env_refs("system:serviceaccount:$(POD_NAMESPACE):$(SA)", &c, "ic"),
            "system:serviceaccount:ic:ctl"
        );
        assert_eq!(expand_env_refs("a$(NOPE)b$(", &c, "ic"), "a$(NOPE)b$(");
    }
}

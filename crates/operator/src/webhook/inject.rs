//! The pod mutating webhook's decision (A.10): append the kvevent-subscriber
//! sidecar to an engine pod that a CacheBackend selects, and turn on the
//! engine's KV-event publisher (`--kv-events-config`, which the reference's
//! adapters never inject) so the sidecar has something to read.
//!
//! Pure: the handler lists the namespace's CacheBackends and turns the
//! result into a JSON patch. Errors fail open (the webhook is
//! `failurePolicy: Ignore`), except the one case the reference denies: more
//! than one CacheBackend selects the pod.

use crate::crd::{CacheBackend, IntegrationMode, Runtime};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, Pod, Probe, ResourceRequirements, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// The sidecar's container name (injection is idempotent by it).
pub const SIDECAR_NAME: &str = "kvevent-subscriber";
/// Opt-out annotation.
pub const SKIP_ANNOTATION: &str = "inferencecache.io/skip-inject";
/// Stamp: `namespace/name` of the injecting CacheBackend.
pub const INJECTED_BY: &str = "inferencecache.io/injected-by";
/// Stamp: its uid.
pub const INJECTED_BY_UID: &str = "inferencecache.io/injected-by-uid";
/// Stamp: its generation.
pub const INJECTED_GENERATION: &str = "inferencecache.io/injected-generation";
/// Where the engine publishes KV events (inside the pod).
pub const ENGINE_EVENTS_ENDPOINT: &str = "tcp://127.0.0.1:5557";
/// The subscriber's own metrics/health port.
pub const SIDECAR_METRICS_PORT: i32 = 8090;
/// That port's name in the sidecar container.
pub const SIDECAR_PORT_NAME: &str = "sub-metrics";

/// Webhook settings (controller flags).
#[derive(Debug, Clone)]
pub struct InjectConfig {
    /// `--kvevent-subscriber-image`; empty disables injection (the
    /// reference's default).
    pub image: String,
    /// `--policy-server-grpc-address`, the sidecar's `--server`.
    pub server_grpc: String,
}

/// What to do with a pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Admit unchanged, with the reason (logged, and stamped nowhere).
    Skip(&'static str),
    /// Reject (more than one CacheBackend selects it).
    Deny(String),
    /// Admit this mutated pod.
    Mutate(Box<Pod>),
}

/// Whether the opt-out annotation's value opts out: any value but an
/// explicit false-like one does (unrecognised values err on the side of
/// not touching the pod).
pub fn opted_out(pod: &Pod) -> bool {
    pod.annotations().get(SKIP_ANNOTATION).is_some_and(|v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "false" | "no" | "off" | "disable" | "disabled"
        )
    })
}

/// The engine's HTTP port: the last valid `--port N` / `--port=N` in
/// command + args (a `$(VAR)` resolved from a literal env value), else the
/// runtime's default.
pub fn engine_port(engine: &Container, runtime: Runtime) -> u16 {
    let words: Vec<&str> = engine
        .command
        .iter()
        .flatten()
        .chain(engine.args.iter().flatten())
        .map(String::as_str)
        .collect();
    let env: BTreeMap<&str, &str> = engine
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.as_str(), e.value.as_deref()?)))
        .collect();
    let resolve = |v: &str| -> Option<u16> {
        let v = match v.strip_prefix("$(").and_then(|r| r.strip_suffix(')')) {
            Some(var) => *env.get(var)?,
            None => v,
        };
        v.parse::<u16>().ok().filter(|p| *p > 0)
    };
    let mut port = None;
    for (i, w) in words.iter().enumerate() {
        let value = if *w == "--port" {
            words.get(i + 1).copied()
        } else {
            w.strip_prefix("--port=")
        };
        if let Some(p) = value.and_then(resolve) {
            port = Some(p);
        }
    }
    port.unwrap_or_else(|| runtime.default_port())
}

fn has_flag(c: &Container, flag: &str) -> bool {
    let eq = format!("{flag}=");
    c.command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .any(|w| w == flag || w.starts_with(&eq))
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A probe of the sidecar's own HTTP listener.
///
/// Both probes use `/healthz` (the process serves), not `/readyz` (engine
/// stream and server both up): a pod is ready only when every container
/// is, so probing `/readyz` would take the engine out of its Service
/// whenever the inference-cache server is down, and the cache must fail
/// open. `/readyz` stays for people and monitoring.
fn sidecar_probe(period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/healthz".into()),
            port: IntOrString::String(SIDECAR_PORT_NAME.into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        timeout_seconds: Some(2),
        failure_threshold: Some(failures),
        ..Default::default()
    }
}

fn quantities(cpu: &str, mem: &str) -> BTreeMap<String, Quantity> {
    BTreeMap::from([
        ("cpu".to_owned(), Quantity(cpu.into())),
        ("memory".to_owned(), Quantity(mem.into())),
    ])
}

/// The sidecar container for `backend` next to an engine on `port`.
pub fn sidecar(cfg: &InjectConfig, backend: &CacheBackend, model: &str, port: u16) -> Container {
    let spec = &backend.spec;
    let mut args = vec![
        "subscribe".to_owned(),
        format!("--engine-endpoint={ENGINE_EVENTS_ENDPOINT}"),
        format!("--server={}", cfg.server_grpc),
        "--replica-id=$(POD_NAME)".to_owned(),
        "--tenant-id=$(POD_NAMESPACE)".to_owned(),
        format!("--model-id={model}"),
        format!("--hash-scheme={}", spec.runtime.hash_scheme()),
        format!("--engine-metrics-url=http://127.0.0.1:{port}/metrics"),
        format!("--http-bind-address=:{SIDECAR_METRICS_PORT}"),
    ];
    let events_only = spec
        .integration
        .is_some_and(|i| i.mode == IntegrationMode::EventsOnly);
    if !events_only {
        // Offload: the engine drops blocks that live on in the T2 tier, so
        // removals must not evict them from the index.
        args.push("--ignore-block-removed".to_owned());
    }
    Container {
        name: SIDECAR_NAME.into(),
        image: Some(cfg.image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(args),
        env: Some(vec![
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some(SIDECAR_PORT_NAME.into()),
            container_port: SIDECAR_METRICS_PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        readiness_probe: Some(sidecar_probe(5, 3)),
        liveness_probe: Some(sidecar_probe(10, 6)),
        resources: Some(ResourceRequirements {
            requests: Some(quantities("10m", "64Mi")),
            limits: Some(quantities("200m", "128Mi")),
            ..Default::default()
        }),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(65532),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The `--kv-events-config` the engine gets when it has none.
pub fn kv_events_config() -> String {
    serde_json::json!({
        "enable_kv_cache_events": true,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "topic": "kv-events",
    })
    .to_string()
}

/// Decides what to do with `pod`, given its namespace's CacheBackends.
pub fn decide(cfg: &InjectConfig, pod: &Pod, backends: &[CacheBackend]) -> Decision {
    if opted_out(pod) {
        return Decision::Skip("opted out by annotation");
    }
    let labels = pod.labels();
    let mut matching: Vec<&CacheBackend> = backends
        .iter()
        .filter(|b| {
            b.spec
                .engine_selector
                .as_ref()
                .is_some_and(|s| s.selects(labels))
        })
        .collect();
    matching.sort_by_key(|b| b.name_any());
    let backend = match matching.as_slice() {
        [] => return Decision::Skip("no CacheBackend selects the pod"),
        [one] => *one,
        many => {
            let names: Vec<String> = many.iter().map(|b| b.name_any()).collect();
            return Decision::Deny(format!(
                "pod is selected by more than one CacheBackend ({}); make their engineSelector cache domains distinct",
                names.join(", ")
            ));
        }
    };
    if cfg.image.is_empty() {
        return Decision::Skip("no --kvevent-subscriber-image configured");
    }
    let Some(model) = backend
        .spec
        .observation
        .as_ref()
        .and_then(|o| o.model_id.clone())
        .filter(|m| !m.is_empty())
    else {
        return Decision::Skip("the CacheBackend has no spec.observation.modelID");
    };
    let mut pod = pod.clone();
    let Some(spec) = pod.spec.as_mut() else {
        return Decision::Skip("pod has no spec");
    };
    if spec.containers.iter().any(|c| c.name == SIDECAR_NAME) {
        return Decision::Skip("already injected");
    }
    let Some(engine) = spec.containers.first_mut() else {
        return Decision::Skip("pod has no containers");
    };
    let port = engine_port(engine, backend.spec.runtime);
    if !has_flag(engine, "--kv-events-config") {
        let args = engine.args.get_or_insert_with(Vec::new);
        args.push("--kv-events-config".into());
        args.push(kv_events_config());
    }
    spec.containers.push(sidecar(cfg, backend, &model, port));
    let ann = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    ann.insert(
        INJECTED_BY.into(),
        format!(
            "{}/{}",
            backend.namespace().unwrap_or_default(),
            backend.name_any()
        ),
    );
    if let Some(uid) = backend.uid() {
        ann.insert(INJECTED_BY_UID.into(), uid);
    }
    if let Some(g) = backend.metadata.generation {
        ann.insert(INJECTED_GENERATION.into(), g.to_string());
    }
    Decision::Mutate(Box::new(pod))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{CacheBackendSpec, EngineSelector, Observation};
    use k8s_openapi::api::core::v1::PodSpec;

    fn cfg() -> InjectConfig {
        InjectConfig {
            image: "inferencecache:dev".into(),
            server_grpc: "srv:9090".into(),
        }
    }

    fn backend(name: &str, domain: &str) -> CacheBackend {
        let mut b = CacheBackend::new(
            name,
            CacheBackendSpec {
                engine_selector: Some(EngineSelector {
                    match_labels: BTreeMap::from([(
                        "inferencecache.io/cache-domain".into(),
                        domain.into(),
                    )]),
                }),
                observation: Some(Observation {
                    model_id: Some("qwen".into()),
                    first_event_timeout: None,
                }),
                ..Default::default()
            },
        );
        b.metadata.namespace = Some("team".into());
        b
    }

    fn pod(domain: &str, args: &[&str]) -> Pod {
        let mut p = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "vllm".into(),
                    args: Some(args.iter().map(|s| (*s).to_owned()).collect()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        p.metadata.labels = Some(BTreeMap::from([(
            "inferencecache.io/cache-domain".into(),
            domain.into(),
        )]));
        p
    }

    #[test]
    fn a_selected_pod_gets_the_sidecar_and_the_engine_publisher() {
        let Decision::Mutate(p) =
            decide(&cfg(), &pod("a", &["--port", "8100"]), &[backend("b", "a")])
        else {
            panic!("not injected");
        };
        let spec = p.spec.unwrap();
        let engine_args = spec.containers[0].args.clone().unwrap();
        assert_eq!(engine_args[2], "--kv-events-config");
        let side = &spec.containers[1];
        assert_eq!(side.name, SIDECAR_NAME);
        let args = side.args.clone().unwrap();
        for want in [
            "--replica-id=$(POD_NAME)",
            "--tenant-id=$(POD_NAMESPACE)",
            "--model-id=qwen",
            "--hash-scheme=vllm",
            "--server=srv:9090",
            "--engine-metrics-url=http://127.0.0.1:8100/metrics",
            "--ignore-block-removed",
        ] {
            assert!(args.iter().any(|a| a == want), "{want} missing: {args:?}");
        }
        let sc = side.security_context.clone().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert!(
            args.iter().any(|a| a == "--http-bind-address=:8090"),
            "{args:?}"
        );
        // Probed on the port it serves, on /healthz (failing open: the
        // server being down must not make the engine pod unready).
        for probe in [&side.readiness_probe, &side.liveness_probe] {
            let get = probe.clone().and_then(|p| p.http_get).expect("http probe");
            assert_eq!(get.path.as_deref(), Some("/healthz"));
            assert_eq!(get.port, IntOrString::String(SIDECAR_PORT_NAME.into()));
        }
        assert_eq!(
            side.ports.clone().unwrap()[0].name.as_deref(),
            Some(SIDECAR_PORT_NAME)
        );
        assert_eq!(p.metadata.annotations.unwrap()[INJECTED_BY], "team/b");
    }

    #[test]
    fn opt_out_unselected_unconfigured_and_already_injected_pods_are_left_alone() {
        let b = [backend("b", "a")];
        let mut opted = pod("a", &[]);
        opted.metadata.annotations =
            Some(BTreeMap::from([(SKIP_ANNOTATION.into(), "true".into())]));
        assert!(matches!(decide(&cfg(), &opted, &b), Decision::Skip(_)));
        opted.metadata.annotations = Some(BTreeMap::from([(SKIP_ANNOTATION.into(), "off".into())]));
        assert!(matches!(decide(&cfg(), &opted, &b), Decision::Mutate(_)));
        assert!(matches!(
            decide(&cfg(), &pod("other", &[]), &b),
            Decision::Skip(_)
        ));
        let no_image = InjectConfig {
            image: String::new(),
            ..cfg()
        };
        assert!(matches!(
            decide(&no_image, &pod("a", &[]), &b),
            Decision::Skip(_)
        ));
        let Decision::Mutate(once) = decide(&cfg(), &pod("a", &[]), &b) else {
            panic!()
        };
        assert_eq!(
            decide(&cfg(), &once, &b),
            Decision::Skip("already injected")
        );
    }

    #[test]
    fn two_selecting_backends_deny_the_pod() {
        let d = decide(
            &cfg(),
            &pod("a", &[]),
            &[backend("x", "a"), backend("y", "a")],
        );
        assert!(matches!(d, Decision::Deny(m) if m.contains("x, y")));
    }

    #[test]
    fn the_engine_port_is_the_last_valid_port_flag() {
        let mut c = Container {
            args: Some(vec!["--port=7000".into(), "--port".into(), "$(P)".into()]),
            env: Some(vec![EnvVar {
                name: "P".into(),
                value: Some("9000".into()),
                ..Default::default()
            }]),
            ..Default::default()
        };
        assert_eq!(engine_port(&c, Runtime::Vllm), 9000);
        c.env = None;
        assert_eq!(engine_port(&c, Runtime::Vllm), 7000);
        c.args = None;
        assert_eq!(engine_port(&c, Runtime::SgLang), 30000);
    }
}

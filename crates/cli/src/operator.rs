//! `inferencecache operator`: the Kubernetes controller (policy push,
//! CacheIndex poller, leader election, admission webhooks), and
//! `inferencecache crds`: the CRDs as YAML for `kubectl apply -f -`.
//! Flag names and defaults are the reference controller's.

use crate::args::parse_duration;
use clap::Args;
use inferencecache_operator::leader::{DEFAULT_LEASE_NAME, LeaderConfig};
use inferencecache_operator::webhook::inject::InjectConfig;
use inferencecache_operator::webhook::provision::SelfSignedConfig;
use inferencecache_operator::webhook::selfsigned::Lifetimes;
use inferencecache_operator::{Operator, OperatorConfig};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The server Service's name in the operator's namespace.
const SERVER_SERVICE: &str = "inference-cache-server";

/// Flags of `operator`.
#[derive(Debug, Args)]
pub(crate) struct OperatorArgs {
    /// Kubeconfig file; default: in-cluster, then $KUBECONFIG.
    #[arg(long, env = "INFERENCECACHE_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// The operator's namespace: where the server Service, the webhook
    /// Service and the webhook certificate Secret live (the manifests pass
    /// the pod's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "inference-cache-system")]
    pub namespace: String,

    /// Listen address of /metrics.
    #[arg(
        long,
        env = "INFERENCECACHE_METRICS_BIND_ADDRESS",
        default_value = ":8080"
    )]
    pub metrics_bind_address: String,

    /// Listen address of /healthz and /readyz.
    #[arg(
        long,
        env = "INFERENCECACHE_HEALTH_PROBE_BIND_ADDRESS",
        default_value = ":8081"
    )]
    pub health_probe_bind_address: String,

    /// Elect a leader (needed with more than one replica).
    #[arg(long, env = "INFERENCECACHE_LEADER_ELECT")]
    pub leader_elect: bool,

    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "inference-cache-system")]
    pub leader_elect_namespace: String,

    /// Name of the leader Lease.
    #[arg(long, default_value = DEFAULT_LEASE_NAME)]
    pub leader_elect_lease_name: String,

    /// This replica's identity in the Lease (default: $POD_NAME or the host name, plus the pid).
    #[arg(long, default_value = "")]
    pub leader_elect_id: String,

    /// How long a silent leader keeps the Lease.
    #[arg(long, default_value = "15s", value_parser = parse_duration)]
    pub leader_elect_lease_duration: Duration,

    /// How often the leader renews and standbys retry.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub leader_elect_retry_period: Duration,

    /// The server's /policy URL [default: http://inference-cache-server.<--namespace>.svc:8081/policy].
    #[arg(long, env = "INFERENCECACHE_SERVER_POLICY_URL")]
    pub server_policy_url: Option<String>,

    /// The server's /snapshot URL [default: http://inference-cache-server.<--namespace>.svc:8081/snapshot].
    #[arg(long, env = "INFERENCECACHE_SERVER_SNAPSHOT_URL")]
    pub server_snapshot_url: Option<String>,

    /// The server's /templates URL ("" disables PromptTemplate pushes) [default: the /policy URL's server].
    #[arg(long, env = "INFERENCECACHE_SERVER_TEMPLATES_URL")]
    pub server_templates_url: Option<String>,

    /// The server's /pd-topologies URL ("" disables PDTopology pushes) [default: the /policy URL's server].
    #[arg(long, env = "INFERENCECACHE_SERVER_PD_TOPOLOGIES_URL")]
    pub server_pd_topologies_url: Option<String>,

    /// Bearer token for pushes (projected, audience inferencecache.io/policy); re-read every push; missing = none.
    #[arg(
        long,
        default_value = "/var/run/secrets/inferencecache.io/policy-token/token"
    )]
    pub policy_token_file: PathBuf,

    /// Bearer token for /snapshot (audience inferencecache.io/controller).
    #[arg(
        long,
        default_value = "/var/run/secrets/inferencecache.io/controller-token/token"
    )]
    pub controller_token_file: PathBuf,

    /// Full policy push period (on top of pushes on every change).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub cachepolicy_push_interval: Duration,

    /// /snapshot → status refresh period.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub cacheindex_refresh_interval: Duration,

    /// Listen address of the admission webhooks (HTTPS); "" serves none.
    #[arg(
        long,
        env = "INFERENCECACHE_WEBHOOK_BIND_ADDRESS",
        default_value = ":9443"
    )]
    pub webhook_bind_address: String,

    /// Directory holding the webhook's tls.crt and tls.key (reloaded on change).
    #[arg(long, default_value = "/tmp/k8s-webhook-server/serving-certs")]
    pub webhook_cert_dir: PathBuf,

    /// Secret (in --namespace) where the operator keeps its own webhook CA
    /// and serving certificate: created, rotated before expiry, written to
    /// --webhook-cert-dir and its CA injected into the webhook
    /// configurations. "" turns this off and serves whatever is mounted in
    /// --webhook-cert-dir (cert-manager).
    #[arg(
        long,
        env = "INFERENCECACHE_WEBHOOK_CERT_SECRET",
        default_value = "inference-cache-webhook-cert"
    )]
    pub webhook_cert_secret: String,

    /// The webhook Service the certificate names (<name>.<--namespace>.svc).
    #[arg(long, default_value = "inference-cache-webhook-service")]
    pub webhook_service_name: String,

    /// ValidatingWebhookConfiguration whose caBundle the operator fills ("" = none).
    #[arg(
        long,
        default_value = "inference-cache-validating-webhook-configuration"
    )]
    pub validating_webhook_configuration: String,

    /// MutatingWebhookConfiguration whose caBundle the operator fills ("" = none).
    #[arg(long, default_value = "inference-cache-mutating-webhook-configuration")]
    pub mutating_webhook_configuration: String,

    /// How often the webhook certificate is checked for rotation.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub webhook_cert_check_interval: Duration,

    /// Image of the injected kvevent-subscriber sidecar; "" disables injection.
    #[arg(
        long,
        env = "INFERENCECACHE_KVEVENT_SUBSCRIBER_IMAGE",
        default_value = ""
    )]
    pub kvevent_subscriber_image: String,

    /// The server's gRPC address, as the sidecar reaches it [default: inference-cache-server.<--namespace>.svc.cluster.local:9090].
    #[arg(long)]
    pub policy_server_grpc_address: Option<String>,
}

fn identity(flag: &str) -> String {
    if !flag.is_empty() {
        return flag.to_owned();
    }
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "operator".into());
    format!("{host}_{}", std::process::id())
}

fn config(a: OperatorArgs) -> OperatorConfig {
    // Defaults follow the namespace, so an install into any namespace
    // reaches its own server.
    let server = format!("http://{SERVER_SERVICE}.{}.svc:8081", a.namespace);
    let url = |flag: Option<String>, path: &str| flag.unwrap_or_else(|| format!("{server}/{path}"));
    let webhook_certs = (!a.webhook_cert_secret.is_empty()).then(|| SelfSignedConfig {
        namespace: a.namespace.clone(),
        secret: a.webhook_cert_secret.clone(),
        service: a.webhook_service_name.clone(),
        validating: a.validating_webhook_configuration.clone(),
        mutating: a.mutating_webhook_configuration.clone(),
        check_interval: a.webhook_cert_check_interval,
        lifetimes: Lifetimes::default(),
    });
    let server_grpc = a
        .policy_server_grpc_address
        .unwrap_or_else(|| format!("{SERVER_SERVICE}.{}.svc.cluster.local:9090", a.namespace));
    OperatorConfig {
        kubeconfig: a.kubeconfig,
        metrics_addr: a.metrics_bind_address,
        health_addr: a.health_probe_bind_address,
        policy_url: url(a.server_policy_url, "policy"),
        snapshot_url: url(a.server_snapshot_url, "snapshot"),
        templates_url: url(a.server_templates_url, "templates"),
        pd_url: url(a.server_pd_topologies_url, "pd-topologies"),
        policy_token_file: a.policy_token_file,
        controller_token_file: a.controller_token_file,
        push_interval: a.cachepolicy_push_interval,
        refresh_interval: a.cacheindex_refresh_interval,
        leader: a.leader_elect.then(|| LeaderConfig {
            namespace: a.leader_elect_namespace,
            name: a.leader_elect_lease_name,
            identity: identity(&a.leader_elect_id),
            lease_duration: a.leader_elect_lease_duration,
            renew_period: a.leader_elect_retry_period,
        }),
        webhook: (!a.webhook_bind_address.is_empty())
            .then_some((a.webhook_bind_address, a.webhook_cert_dir)),
        webhook_certs,
        inject: InjectConfig {
            image: a.kvevent_subscriber_image,
            server_grpc,
        },
    }
}

/// Runs the operator until SIGINT/SIGTERM.
pub(crate) fn run(args: OperatorArgs) -> ExitCode {
    let runtime = match crate::runtime::multi_thread("operator", None) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    runtime.block_on(async move {
        // Before "listening", so an early signal still shuts down cleanly.
        let stop = match crate::signals::Stop::install() {
            Ok(stop) => stop,
            Err(e) => {
                eprintln!("inferencecache operator: cannot handle SIGINT/SIGTERM: {e}");
                return ExitCode::from(1);
            }
        };
        let op = match Operator::bind(config(args)).await {
            Ok(op) => op,
            Err(e) => {
                tracing::error!(error = %e, "operator_error");
                eprintln!("inferencecache operator: {e}");
                return ExitCode::from(1);
            }
        };
        let addr = |a: Option<std::net::SocketAddr>| a.map(|a| a.to_string()).unwrap_or_default();
        tracing::info!(
            metrics_addr = %addr(op.metrics_addr()),
            health_addr = %addr(op.health_addr()),
            webhook_addr = %addr(op.webhook_addr()),
            "listening"
        );
        let shutdown = CancellationToken::new();
        tokio::spawn(stop.forward(shutdown.clone()));
        op.run(shutdown).await;
        ExitCode::SUCCESS
    })
}

/// Flags of `crds`.
#[derive(Debug, Args)]
pub(crate) struct CrdsArgs {
    /// Write one `<group>_<plural>.yaml` per CRD into this directory
    /// (`config/crd/bases`) instead of printing one stream.
    #[arg(long, value_name = "DIR")]
    pub output_dir: Option<PathBuf>,
}

/// `inferencecache crds`: every CRD as YAML.
pub(crate) fn crds(args: CrdsArgs) -> ExitCode {
    use inferencecache_operator::crd;
    let result = match args.output_dir {
        None => crd::all_yaml().map(|yaml| print!("{yaml}")),
        Some(dir) => crd::all().iter().try_for_each(|c| {
            let yaml = crd::to_yaml(c)?;
            let path = dir.join(crd::file_name(c));
            std::fs::write(&path, yaml)
                .map_err(|e| crd::RenderError::new(format!("write {}: {e}", path.display())))
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inferencecache crds: {e}");
            ExitCode::from(1)
        }
    }
}

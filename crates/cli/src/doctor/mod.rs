//! `inferencecache doctor`: checks a deployment end to end (server reachable
//! with the right TLS mode, health and readiness, metrics, a `/probe` round
//! trip, policy for the tenant, each sidecar's engine stream and server
//! link, one real LookupRoute) and prints every step with a remediation
//! line. Exit 0 when nothing failed, 1 otherwise, 2 for unusable flags.
//! With `--kubeconfig` it first finds the server, the operator and the
//! sidecars in a cluster (`discover`) and checks what it found.

mod checks;
mod discover;
mod http;
mod reach;
mod report;
mod sniff;

use crate::tools::server::{BAD_FLAGS, ServerArgs};
use clap::Args;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Shown after `--help`.
const LONG_HELP: &str = "\
Walks the path a routing hint takes and says what is broken and how to fix it:\n\
  server.grpc     the gRPC port answers, in the TLS mode you dialled\n\
  server.health   /healthz and /readyz on the public listener\n\
  server.metrics  /metrics serves and says the server is up\n\
  server.probe    a /probe round trip on the control listener (ingest + routing)\n\
  policy.tenant   a CachePolicy is in force for --tenant\n\
  tenant.replicas replicas report under --tenant, and how fresh\n\
  sidecar.*       each --sidecar: engine KV-event stream, server link, events flowing\n\
  lookup          one real LookupRoute for --tenant/--model\n\n\
With --kubeconfig it first looks in the cluster and checks what it finds:\n\
  kube.cluster    the API server answers with this kubeconfig/--context\n\
  kube.server     a Service labelled app.kubernetes.io/name=inference-cache-server in\n\
                  --namespace (its grpc/http/control ports become --server/--http/--control)\n\
  kube.server.deployment  its Deployment has ready replicas (and TLS or not)\n\
  kube.operator   the inference-cache-controller Deployment has ready replicas\n\
  kube.crds       the inferencecache.io CRDs are served; CacheBackend/CacheTenant/CachePolicy counts\n\
  kube.sidecars   pods labelled inferencecache.io/cache-domain carry an injected\n\
                  kvevent-subscriber; each one's pod IP and port become a --sidecar, and the\n\
                  first one's tenant/model/hash scheme the defaults of --tenant/--model\n\
Flags given on the command line win over what was found. Cluster IPs and pod IPs are only\n\
reachable from inside the cluster's network; from a laptop, port-forward and say where:\n  \
kubectl -n inference-cache-system port-forward svc/inference-cache-server 9090 8080 8081 &\n  \
kubectl -n team-a port-forward pod/vllm-0 18090:8090 &\n  \
inferencecache doctor --kubeconfig --address-override svc/inference-cache-server=127.0.0.1 \\\n      \
--address-override pod/team-a/vllm-0:8090=127.0.0.1:18090\n\n\
Exit status: 0 when no check failed (warnings allowed), 1 when one did, 2 for bad flags.\n\n\
Examples:\n  \
inferencecache doctor\n  \
inferencecache doctor --server http://10.0.0.5:9090 --sidecar http://10.0.0.7:9400 --tenant team-a --model llama-3-8b\n  \
inferencecache doctor --server https://ic.example:9090 --tls-ca-file ca.pem --json | jq '.checks[] | select(.status==\"fail\")'\n  \
inferencecache doctor --kubeconfig ~/.kube/config --context prod --namespace inference-cache-system";

/// Flags of `doctor`.
#[derive(Debug, Args)]
#[command(after_long_help = LONG_HELP)]
pub struct DoctorArgs {
    #[command(flatten)]
    server: ServerArgs,

    /// The server's public HTTP listener (/healthz, /readyz, /metrics);
    /// default: the --server host on port 8080.
    #[arg(long, value_name = "URL")]
    http: Option<String>,

    /// The server's control listener (/probe, /ui/state); default: the
    /// --server host on port 8081.
    #[arg(long, value_name = "URL")]
    control: Option<String>,

    #[command(flatten)]
    token: crate::tools::token::TokenArgs,

    /// A sidecar's HTTP address (its /metrics and /readyz); repeat for more.
    #[arg(long, value_name = "URL")]
    sidecar: Vec<String>,

    /// Tenant to check policy, replicas and the lookup for [default: the
    /// first discovered sidecar's, else "default"].
    #[arg(long)]
    tenant: Option<String>,

    /// Model for the lookup and the probe [default: the first discovered
    /// sidecar's, else "default"].
    #[arg(long)]
    model: Option<String>,

    /// Hash scheme of the lookup [default: the first discovered sidecar's,
    /// else the client's default].
    #[arg(long)]
    hash_scheme: Option<String>,

    /// Discover the server, operator and sidecars in a Kubernetes cluster
    /// first. PATH, or without one: KUBECONFIG, ~/.kube/config, or the
    /// pod's service account when run in a cluster.
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = "")]
    kubeconfig: Option<PathBuf>,

    /// Kubeconfig context to use (default: the current one).
    #[arg(long, value_name = "NAME", requires = "kubeconfig")]
    context: Option<String>,

    /// Namespace of the server and the operator (with --kubeconfig).
    #[arg(long, value_name = "NAME", default_value = "inference-cache-system")]
    namespace: String,

    /// Where to reach a discovered object whose cluster address is not
    /// routable from here, as after `kubectl port-forward`:
    /// svc/NAME=HOST (same ports), svc/NAME:PORT=HOST:PORT,
    /// pod/NAMESPACE/NAME:PORT=HOST:PORT; repeat for more.
    #[arg(long, value_name = "OBJECT=ADDR", value_parser = reach::parse, requires = "kubeconfig")]
    address_override: Vec<reach::Rule>,

    /// Time allowed for each step.
    #[arg(long, default_value = "3s", value_parser = crate::args::parse_duration)]
    timeout: Duration,

    /// Print one JSON document ({"healthy": bool, "checks": [...]}).
    #[arg(long)]
    json: bool,
}

/// Runs `doctor`; returns the process exit code. `server_flag_given`:
/// --server was on the command line (it then wins over discovery).
pub fn run(args: DoctorArgs, server_flag_given: bool) -> ExitCode {
    let token = match args.token.resolve() {
        Ok(t) => t,
        Err(message) => {
            eprintln!("inferencecache doctor: {message}");
            return ExitCode::from(BAD_FLAGS);
        }
    };
    // Flags are checked before the cluster is asked anything.
    if let Err(message) = checks::Target::new(&args, token.clone(), None, server_flag_given) {
        eprintln!("inferencecache doctor: {message}");
        return ExitCode::from(BAD_FLAGS);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("inferencecache doctor: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let discovered = args.kubeconfig.as_ref().map(|path| {
        runtime.block_on(discover::run(&discover::Options {
            kubeconfig: Some(path.clone()).filter(|p| !p.as_os_str().is_empty()),
            context: args.context.clone(),
            namespace: args.namespace.clone(),
            overrides: args.address_override.clone(),
            timeout: args.timeout,
            server_flag_given,
        }))
    });
    let target = match checks::Target::new(&args, token, discovered.as_ref(), server_flag_given) {
        Ok(t) => t,
        Err(message) => {
            eprintln!("inferencecache doctor: {message}");
            return ExitCode::from(BAD_FLAGS);
        }
    };
    let mut found = discovered.map(|d| d.checks).unwrap_or_default();
    found.extend(runtime.block_on(checks::run(&target)));
    if args.json {
        println!("{}", report::json(&found));
    } else {
        print!("{}", report::text(&found));
    }
    if report::healthy(&found) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

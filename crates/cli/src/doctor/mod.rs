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
const LONG_HELP: &str = r#"Walks the path a routing hint takes and says what is broken and how to fix it:
  server.grpc      the gRPC port answers, in the TLS mode you dialled
  server.health    /healthz and /readyz on the public listener
  server.metrics   /metrics serves and says the server is up
  server.block_size the engines' block size (as sidecars report it) is --engine-block-size
  server.probe     a /probe round trip on the control listener (ingest + routing)
  policy.tenant    a CachePolicy is in force for --tenant
  tenant.replicas  replicas report under --tenant, and how fresh
  sidecar.*        each --sidecar: engine KV-event stream, server link, events flowing
  lookup           one real LookupRoute for --tenant/--model

With --kubeconfig it first looks in the cluster and checks what it finds:
  kube.cluster     the API server answers with this kubeconfig and --context
  kube.server      a Service labelled app.kubernetes.io/name=inference-cache-server
                   in --namespace; its grpc/http/control ports are dialled
  kube.server.deployment
                   its Deployment has ready replicas (and serves TLS or not)
  kube.token       its control listener wants the controller's token: --kube-token
                   mints one (TokenRequest), else pass --token/--token-file
  kube.operator    the inference-cache-controller Deployment has ready replicas
  kube.crds        the inferencecache.io CRDs are served, and how many objects
  kube.sidecars    pods labelled inferencecache.io/cache-domain carry the injected
                   kvevent-subscriber; each is checked as a --sidecar, and the first
                   one's tenant/model/hash scheme become the defaults
Flags typed on the command line win over what was found. Cluster and pod IPs
answer only inside the cluster's network; from a laptop, port-forward and say where:
  kubectl -n inference-cache-system port-forward svc/inference-cache-server 9090 8080 8081 &
  kubectl -n team-a port-forward pod/vllm-0 18090:8090 &
  inferencecache doctor --kubeconfig \
      --address-override svc/inference-cache-server=127.0.0.1 \
      --address-override pod/team-a/vllm-0:8090=127.0.0.1:18090

Exit status: 0 when no check failed (warnings allowed), 1 when one did, 2 for bad flags.

Examples:
  inferencecache doctor
  inferencecache doctor --server http://10.0.0.5:9090 --sidecar http://10.0.0.7:9400 --tenant team-a --model llama-3-8b
  inferencecache doctor --server https://ic.example:9090 --tls-ca-file ca.pem --json | jq '.checks[] | select(.status=="fail")'
  inferencecache doctor --kubeconfig ~/.kube/config --context prod --namespace inference-cache-system"#;

/// Flags of `doctor`.
#[derive(Debug, Args)]
#[command(after_long_help = LONG_HELP)]
pub(crate) struct DoctorArgs {
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
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<Option<PathBuf>>,

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

    /// When the server admits only the controller's service account
    /// (serve --allowed-controller-sa) and no --token is given, mint a
    /// 10-minute token of it with TokenRequest, as `kubectl create token`
    /// does (needs `create serviceaccounts/token`).
    #[arg(long, requires = "kubeconfig")]
    kube_token: bool,

    /// Time allowed for each step.
    #[arg(long, default_value = "3s", value_parser = crate::args::parse_duration)]
    timeout: Duration,

    /// Print one JSON document ({"healthy": bool, "checks": [...]}).
    #[arg(long)]
    json: bool,
}

/// Runs `doctor`; returns the process exit code. `server_flag_given`:
/// --server was on the command line (it then wins over discovery).
pub(crate) fn run(args: DoctorArgs, server_flag_given: bool) -> ExitCode {
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
            kubeconfig: path.clone(),
            context: args.context.clone(),
            namespace: args.namespace.clone(),
            overrides: args.address_override.clone(),
            timeout: args.timeout,
            server_flag_given,
            have_token: token.is_some(),
            mint_token: args.kube_token,
        }))
    });
    let token = token.or_else(|| discovered.as_ref().and_then(|d| d.token.clone()));
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

//! `inferencecache doctor`: checks a deployment end to end (server reachable
//! with the right TLS mode, health and readiness, metrics, a `/probe` round
//! trip, policy for the tenant, each sidecar's engine stream and server
//! link, one real LookupRoute) and prints every step with a remediation
//! line. Exit 0 when nothing failed, 1 otherwise, 2 for unusable flags.

mod checks;
mod http;
mod report;
mod sniff;

use crate::tools::server::{BAD_FLAGS, ServerArgs};
use clap::Args;
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
Exit status: 0 when no check failed (warnings allowed), 1 when one did, 2 for bad flags.\n\n\
Examples:\n  \
inferencecache doctor\n  \
inferencecache doctor --server http://10.0.0.5:9090 --sidecar http://10.0.0.7:9400 --tenant team-a --model llama-3-8b\n  \
inferencecache doctor --server https://ic.example:9090 --tls-ca-file ca.pem --json | jq '.checks[] | select(.status==\"fail\")'";

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

    /// Tenant to check policy, replicas and the lookup for.
    #[arg(long, default_value = "default")]
    tenant: String,

    /// Model for the lookup and the probe.
    #[arg(long, default_value = "default")]
    model: String,

    /// Hash scheme of the lookup.
    #[arg(long, default_value = inferencecache_client::DEFAULT_HASH_SCHEME)]
    hash_scheme: String,

    /// Time allowed for each step.
    #[arg(long, default_value = "3s", value_parser = crate::args::parse_duration)]
    timeout: Duration,

    /// Print one JSON document ({"healthy": bool, "checks": [...]}).
    #[arg(long)]
    json: bool,
}

/// Runs `doctor`; returns the process exit code.
pub fn run(args: DoctorArgs) -> ExitCode {
    let token = match args.token.resolve() {
        Ok(t) => t,
        Err(message) => {
            eprintln!("inferencecache doctor: {message}");
            return ExitCode::from(BAD_FLAGS);
        }
    };
    let target = match checks::Target::new(&args, token) {
        Ok(t) => t,
        Err(message) => {
            eprintln!("inferencecache doctor: {message}");
            return ExitCode::from(BAD_FLAGS);
        }
    };
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
    let found = runtime.block_on(checks::run(&target));
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

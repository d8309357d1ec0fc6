//! `inferencecache state`: GetCacheState for a tenant/model.

use super::output::{bytes, f32_json, table};
use super::server::{OK, ServerArgs, block_on};
use clap::Args;
use inferencecache_client::GetCacheStateResponse;
use serde_json::json;
use std::process::ExitCode;

/// Shown after `-h`.
const EXAMPLES: &str = "Examples:\n  \
inferencecache state --tenant team-a --model llama-3-8b\n  \
inferencecache state --tenant team-a --model llama-3-8b --json | jq '.replicas[].pressure'";

/// Shown after `--help`: what the tool does, then the examples. (The
/// subcommand's one-line about comes from its variant in `args.rs`.)
const LONG_HELP: &str = concat!(
    "Shows what the index knows about one tenant/model: every replica that \
reported stats (cache memory, hit rate, pressure, tier-2 counters, client version) and the \
number of indexed and hot prefixes. An empty answer means no replica reports under that exact \
tenant/model pair; `inferencecache snapshot` lists what is there.",
    "\n\n",
    "Examples:\n  \
inferencecache state --tenant team-a --model llama-3-8b\n  \
inferencecache state --tenant team-a --model llama-3-8b --json | jq '.replicas[].pressure'"
);

/// Flags of `state`.
#[derive(Debug, Args)]
#[command(after_help = EXAMPLES, after_long_help = LONG_HELP)]
pub(crate) struct StateArgs {
    #[command(flatten)]
    server: ServerArgs,

    /// Tenant to show.
    #[arg(long)]
    tenant: String,

    /// Model to show.
    #[arg(long)]
    model: String,

    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

/// Runs `state`; returns the process exit code.
pub(crate) fn run(args: StateArgs) -> ExitCode {
    block_on("state", async move {
        let client = args.server.connect(args.server.config()).await?;
        let state = client
            .get_cache_state(&args.tenant, &args.model)
            .await
            .map_err(|e| super::server::Failure::from_client(&e, &args.server.server))?;
        if args.json {
            println!("{}", to_json(&state));
        } else {
            print!("{}", readable(&state, &args));
        }
        Ok(OK)
    })
}

fn to_json(state: &GetCacheStateResponse) -> serde_json::Value {
    let summary = state.summary.unwrap_or_default();
    let replicas: Vec<serde_json::Value> = state
        .replicas
        .iter()
        .map(|r| {
            json!({
                "replica_id": r.replica_id,
                "cache_memory_bytes": r.cache_memory_bytes,
                "hit_rate": f32_json(r.hit_rate),
                "pressure": f32_json(r.pressure),
                "client_version": r.client_version,
                "t2_hit_tokens": r.t2_hit_tokens,
                "t2_query_tokens": r.t2_query_tokens,
            })
        })
        .collect();
    json!({
        "replicas": replicas,
        "summary": {
            "total_prefixes": summary.total_prefixes,
            "hot_prefixes": summary.hot_prefixes,
        },
    })
}

fn readable(state: &GetCacheStateResponse, args: &StateArgs) -> String {
    let summary = state.summary.unwrap_or_default();
    let mut out = format!(
        "{}/{}: {} prefixes indexed, {} hot, {} replicas reporting stats\n",
        args.tenant,
        args.model,
        summary.total_prefixes,
        summary.hot_prefixes,
        state.replicas.len()
    );
    if state.replicas.is_empty() {
        if summary.total_prefixes == 0 {
            out.push_str(
                "  nothing indexed for this tenant/model: check --tenant/--model against \
                 `inferencecache snapshot`\n",
            );
        }
        return out;
    }
    let rows: Vec<Vec<String>> = state
        .replicas
        .iter()
        .map(|r| {
            let t2 = if r.t2_query_tokens > 0 {
                format!("{}/{}", r.t2_hit_tokens, r.t2_query_tokens)
            } else {
                "-".into()
            };
            vec![
                r.replica_id.clone(),
                bytes(r.cache_memory_bytes),
                format!("{:.2}", r.hit_rate),
                format!("{:.2}", r.pressure),
                t2,
                if r.client_version.is_empty() {
                    "-".into()
                } else {
                    r.client_version.clone()
                },
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "REPLICA",
            "MEMORY",
            "HIT_RATE",
            "PRESSURE",
            "T2_HIT/QUERY",
            "CLIENT",
        ],
        &rows,
    ));
    out
}

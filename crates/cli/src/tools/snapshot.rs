//! `inferencecache snapshot`: the control /snapshot, summarized or as JSON.

use super::output::{bytes, table};
use super::server::{Failure, OK, block_on};
use clap::Args;
use serde_json::Value;
use std::process::ExitCode;
use std::time::Duration;

/// Shown after `-h`.
const EXAMPLES: &str = "Examples:\n  \
inferencecache snapshot\n  \
inferencecache snapshot --json | jq '.tenants'\n  \
kubectl -n inference-cache-system port-forward deploy/inference-cache 8081 &\n  \
inferencecache snapshot --token-file /var/run/secrets/tokens/controller";

/// Shown after `--help`: what the tool does, then the examples. (The
/// subcommand's one-line about comes from its variant in `args.rs`.)
const LONG_HELP: &str = concat!(
    "Fetches the control endpoint /snapshot (what the Kubernetes controller reads) \
and prints every tenant and replica the index knows, with totals. --json prints the document \
itself, pretty-printed.\n\n\
The control listener (serve --snapshot-bind-address, default :8081) is loopback-only and \
unauthenticated unless serve runs with --allowed-controller-sa; then pass a bearer token the \
TokenReview accepts with --token or --token-file.",
    "\n\n",
    "Examples:\n  \
inferencecache snapshot\n  \
inferencecache snapshot --json | jq '.tenants'\n  \
kubectl -n inference-cache-system port-forward deploy/inference-cache 8081 &\n  \
inferencecache snapshot --token-file /var/run/secrets/tokens/controller"
);

/// Flags of `snapshot`.
#[derive(Debug, Args)]
#[command(after_help = EXAMPLES, after_long_help = LONG_HELP)]
pub(crate) struct SnapshotArgs {
    /// URL of /snapshot; a bare http://HOST:PORT gets /snapshot appended.
    #[arg(
        long,
        env = "INFERENCECACHE_SNAPSHOT_URL",
        default_value = "http://127.0.0.1:8081/snapshot"
    )]
    url: String,

    #[command(flatten)]
    token: super::token::TokenArgs,

    /// Print the /snapshot JSON (pretty) instead of the summary.
    #[arg(long)]
    json: bool,

    /// Give up after this long.
    #[arg(long, default_value = "10s", value_parser = crate::args::parse_duration)]
    timeout: Duration,
}

/// Runs `snapshot`; returns the process exit code.
pub(crate) fn run(args: SnapshotArgs) -> ExitCode {
    let url = snapshot_url(&args.url);
    let token = match args.token.resolve() {
        Ok(t) => t,
        Err(message) => return Failure::flags(message).report("snapshot"),
    };
    block_on("snapshot", async move {
        let body = fetch(&url, token.as_deref(), args.timeout).await?;
        let doc: Value = serde_json::from_str(&body).map_err(|e| {
            Failure::runtime(format!(
                "{url} did not return JSON ({e}); is --url the control listener's /snapshot?"
            ))
        })?;
        if args.json {
            let pretty = serde_json::to_string_pretty(&doc)
                .map_err(|e| Failure::runtime(format!("cannot print the snapshot: {e}")))?;
            println!("{pretty}");
        } else {
            print!("{}", summary(&doc));
        }
        Ok(OK)
    })
}

fn snapshot_url(url: &str) -> String {
    let url = url.trim().trim_end_matches('/');
    let url = if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    };
    // Only a bare origin gets the path: an explicit path is taken as given.
    let after_scheme = url.split_once("://").map_or("", |(_, rest)| rest);
    if after_scheme.contains('/') {
        url
    } else {
        format!("{url}/snapshot")
    }
}

async fn fetch(url: &str, token: Option<&str>, timeout: Duration) -> Result<String, Failure> {
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| Failure::runtime(format!("cannot build the HTTP client: {e}")))?;
    let mut request = client.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.map_err(|e| {
        if e.is_builder() {
            Failure::flags(format!("--url {url:?} is not a usable URL: {e}"))
        } else if e.is_timeout() {
            Failure::runtime(format!("{url} did not answer within {timeout:?}"))
        } else {
            Failure::runtime(format!(
                "could not connect to {url} — is `inferencecache serve` running? Its control \
                 listener is --snapshot-bind-address (default :8081, loopback only); pass --url ({})",
                error_chain(&e)
            ))
        }
    })?;
    let status = response.status();
    let body = response
        .text()
        .await
        .map_err(|e| Failure::runtime(format!("reading {url}: {e}")))?;
    match status.as_u16() {
        200 => Ok(body),
        401 | 403 => Err(Failure::runtime(format!(
            "{url} refused the request ({status}): pass --token or --token-file with a token \
             of the controller service account (serve --allowed-controller-sa){}",
            detail(&body)
        ))),
        _ => Err(Failure::runtime(format!(
            "{url} answered {status}{}",
            detail(&body)
        ))),
    }
}

fn detail(body: &str) -> String {
    let body = body.trim();
    if body.is_empty() {
        String::new()
    } else {
        format!(": {}", body.chars().take(200).collect::<String>())
    }
}

/// An error and its sources, `: `-joined (reqwest hides the cause otherwise).
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn summary(doc: &Value) -> String {
    let text = |v: &Value, k: &str| match &v[k] {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    let empty = Vec::new();
    let tenants = doc["tenants"].as_array().unwrap_or(&empty);
    let replicas = doc["replicas"].as_array().unwrap_or(&empty);
    let mut out = format!(
        "{} prefixes indexed, {} hot; {} tenants, {} replicas\n",
        text(doc, "totalPrefixes"),
        text(doc, "hotPrefixes"),
        tenants.len(),
        replicas.len()
    );
    if !tenants.is_empty() {
        out.push_str("\ntenants:\n");
        let rows: Vec<Vec<String>> = tenants
            .iter()
            .map(|t| {
                vec![
                    text(t, "tenantId"),
                    text(t, "indexEntries"),
                    if t["hitRateReported"].as_bool() == Some(true) {
                        text(t, "hitRate")
                    } else {
                        "-".into()
                    },
                    bytes(t["memoryUsed"].as_i64().unwrap_or(0)),
                ]
            })
            .collect();
        out.push_str(&table(&["TENANT", "ENTRIES", "HIT_RATE", "MEMORY"], &rows));
    }
    if !replicas.is_empty() {
        out.push_str("\nreplicas:\n");
        let rows: Vec<Vec<String>> = replicas
            .iter()
            .map(|r| {
                vec![
                    text(r, "replicaId"),
                    text(r, "tenant"),
                    text(r, "prefixCount"),
                    bytes(r["cacheMemoryBytes"].as_i64().unwrap_or(0)),
                    text(r, "hitRate"),
                    text(r, "pressure"),
                    // Go's zero time means "never reported stats".
                    match text(r, "lastUpdate") {
                        t if t == inferencecache_server::snapshot::ZERO_TIME => "-".into(),
                        t => t,
                    },
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "REPLICA",
                "TENANT",
                "PREFIXES",
                "MEMORY",
                "HIT_RATE",
                "PRESSURE",
                "LAST_UPDATE",
            ],
            &rows,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_origins_get_the_snapshot_path() {
        assert_eq!(
            snapshot_url("127.0.0.1:8081"),
            "http://127.0.0.1:8081/snapshot"
        );
        assert_eq!(snapshot_url("http://h:1/"), "http://h:1/snapshot");
        assert_eq!(snapshot_url("http://h:1/snapshot"), "http://h:1/snapshot");
        assert_eq!(snapshot_url("https://h/x/snapshot"), "https://h/x/snapshot");
    }

    #[test]
    fn summary_lists_tenants_and_replicas() {
        let doc: Value = serde_json::from_str(
            r#"{"replicas":[{"replicaId":"r1","tenant":"t","cacheMemoryBytes":2048,"hitRate":0.5,
               "pressure":0,"lastUpdate":"2026-12-02T00:00:00Z","prefixCount":3,"lastEventAt":"x"}],
               "tenants":[{"tenantId":"t","indexEntries":3,"hitRate":0,"memoryUsed":0}],
               "totalPrefixes":3,"hotPrefixes":1}"#,
        )
        .unwrap();
        let s = summary(&doc);
        assert!(
            s.starts_with("3 prefixes indexed, 1 hot; 1 tenants, 1 replicas"),
            "{s}"
        );
        assert!(s.contains("r1") && s.contains("2.0 KiB"), "{s}");
    }
}

//! `inferencecache watch`: StreamCacheEvents, live and filterable.

use super::output::hex;
use super::server::{Failure, OK, RUNTIME_ERROR, ServerArgs, block_on};
use crate::signals::Stop;
use clap::{Args, ValueEnum};
use futures::StreamExt;
use inferencecache_client::proto::cache_event::Type;
use inferencecache_client::{CacheEvent, StreamEventsRequest};
use serde_json::json;
use std::process::ExitCode;
use std::time::Duration;

/// Shown after `-h`.
const EXAMPLES: &str = "Examples:\n  \
inferencecache watch\n  \
inferencecache watch --tenant team-a --type prefix-evicted --type all-cleared\n  \
inferencecache watch --replica vllm-0 --json | jq -c 'select(.type==\"PREFIX_ADDED\")'\n  \
inferencecache watch --count 1 --for 30s   # wait for the first event, at most 30 s";

/// Shown after `--help`: what the tool does, then the examples. (The
/// subcommand's one-line about comes from its variant in `args.rs`.)
const LONG_HELP: &str = concat!(
    "Prints one line per index change as it happens: prefixes added and evicted, \
replicas updated, replicas cleared. Filter by tenant, model and event type on the server, and \
by replica here. Stops on Ctrl-C, after --count events, or after --for.\n\n\
Each line is: time, event type, tenant/model, replica, prefix hash (hex), adapter. With --json, \
one JSON object per line (for jq).",
    "\n\n",
    "Examples:\n  \
inferencecache watch\n  \
inferencecache watch --tenant team-a --type prefix-evicted --type all-cleared\n  \
inferencecache watch --replica vllm-0 --json | jq -c 'select(.type==\"PREFIX_ADDED\")'\n  \
inferencecache watch --count 1 --for 30s   # wait for the first event, at most 30 s"
);

/// Flags of `watch`.
#[derive(Debug, Args)]
#[command(after_help = EXAMPLES, after_long_help = LONG_HELP)]
pub(crate) struct WatchArgs {
    #[command(flatten)]
    server: ServerArgs,

    /// Only this tenant.
    #[arg(long, default_value = "")]
    tenant: String,

    /// Only this model.
    #[arg(long, default_value = "")]
    model: String,

    /// Only this replica (filtered client-side).
    #[arg(long)]
    replica: Option<String>,

    /// Only these event types (repeat the flag for several).
    #[arg(long = "type", value_enum)]
    types: Vec<EventType>,

    /// Exit after this many events.
    #[arg(long)]
    count: Option<u64>,

    /// Exit after this long (e.g. 30s, 5m) even if nothing happened.
    #[arg(long = "for", value_name = "DURATION", value_parser = crate::args::parse_duration)]
    duration: Option<Duration>,

    /// One JSON object per line.
    #[arg(long)]
    json: bool,
}

/// Event types, as flag values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EventType {
    /// A replica started caching a prefix.
    PrefixAdded,
    /// A prefix left a replica (or expired).
    PrefixEvicted,
    /// A replica reported stats.
    ReplicaUpdated,
    /// A replica's entries were all dropped.
    AllCleared,
}

impl EventType {
    fn wire(self) -> Type {
        match self {
            Self::PrefixAdded => Type::PrefixAdded,
            Self::PrefixEvicted => Type::PrefixEvicted,
            Self::ReplicaUpdated => Type::ReplicaUpdated,
            Self::AllCleared => Type::AllCleared,
        }
    }
}

/// Runs `watch`; returns the process exit code.
pub(crate) fn run(args: WatchArgs) -> ExitCode {
    block_on("watch", async move {
        // Listen for Ctrl-C / SIGTERM before anything else, so a signal that
        // arrives while connecting still means "stop cleanly".
        let mut stop =
            Stop::install().map_err(|e| Failure::runtime(format!("cannot handle signals: {e}")))?;
        let client = args.server.connect(args.server.config()).await?;
        let request = StreamEventsRequest {
            model_id: args.model.clone(),
            tenant_id: args.tenant.clone(),
            types: args.types.iter().map(|t| t.wire() as i32).collect(),
        };
        let mut events = client
            .watch(request)
            .await
            .map_err(|e| Failure::from_client(&e, &args.server.server))?;
        // On stderr even with --json, so scripts (and tests) can tell when
        // the stream is open without polluting the JSON lines.
        eprintln!("watching {} (Ctrl-C to stop)", args.server.server);
        let stop_after = async {
            match args.duration {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(stop_after);
        let mut seen = 0u64;
        loop {
            if args.count.is_some_and(|n| seen >= n) {
                return Ok(OK);
            }
            let next = tokio::select! {
                () = stop.requested() => return Ok(OK),
                () = &mut stop_after => return Ok(OK),
                next = events.next() => next,
            };
            match next {
                Some(Ok(event)) => {
                    if args
                        .replica
                        .as_ref()
                        .is_some_and(|r| *r != event.replica_id)
                    {
                        continue;
                    }
                    seen += 1;
                    if args.json {
                        println!("{}", to_json(&event));
                    } else {
                        println!("{}", line(&event));
                    }
                }
                Some(Err(e)) => {
                    return Err(Failure::runtime(format!(
                        "the event stream failed: {e} (events are live only; run watch again)"
                    )));
                }
                None => {
                    eprintln!(
                        "inferencecache watch: the server closed the stream (shutting down?)"
                    );
                    return Ok(RUNTIME_ERROR);
                }
            }
        }
    })
}

fn type_name(event: &CacheEvent) -> String {
    Type::try_from(event.r#type).map_or_else(
        |_| format!("TYPE_{}", event.r#type),
        |t| t.as_str_name().to_owned(),
    )
}

fn time(event: &CacheEvent) -> String {
    inferencecache_server::snapshot::rfc3339_nano(
        (event.timestamp_us != 0).then(|| event.timestamp_us.saturating_mul(1000)),
    )
}

fn line(event: &CacheEvent) -> String {
    let mut out = format!(
        "{} {:<15} {}/{} replica={}",
        time(event),
        type_name(event),
        event.tenant_id,
        event.model_id,
        event.replica_id
    );
    if !event.prefix_hash.is_empty() {
        out.push_str(" prefix=");
        out.push_str(&hex(&event.prefix_hash));
    }
    if !event.adapter_id.is_empty() {
        out.push_str(" adapter=");
        out.push_str(&event.adapter_id);
    }
    out
}

fn to_json(event: &CacheEvent) -> serde_json::Value {
    json!({
        "type": type_name(event),
        "time": time(event),
        "timestamp_us": event.timestamp_us,
        "tenant_id": event.tenant_id,
        "model_id": event.model_id,
        "replica_id": event.replica_id,
        "prefix_hash": hex(&event.prefix_hash),
        "adapter_id": event.adapter_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_name_the_event_and_its_keys() {
        let e = CacheEvent {
            r#type: Type::PrefixAdded as i32,
            replica_id: "r1".into(),
            model_id: "m".into(),
            tenant_id: "t".into(),
            prefix_hash: vec![0xab, 0x01],
            timestamp_us: 1_000_000,
            adapter_id: String::new(),
        };
        assert_eq!(
            line(&e),
            "1970-01-01T00:00:01Z PREFIX_ADDED    t/m replica=r1 prefix=ab01"
        );
        assert_eq!(to_json(&e)["type"], "PREFIX_ADDED");
        let odd = CacheEvent { r#type: 42, ..e };
        assert_eq!(type_name(&odd), "TYPE_42");
    }
}

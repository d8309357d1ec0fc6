//! Command-line flags. Names and defaults follow the reference server, so
//! existing manifests work unchanged; each flag can also come from an
//! `INFERENCECACHE_*` environment variable.

use clap::{Args, Parser, Subcommand, ValueEnum};
use inferencecache_server::limits;
use std::ffi::OsString;

/// Cache-aware routing hints for LLM inference.
///
/// Engines report which prompt prefixes each replica holds; gateways ask
/// LookupRoute where to send a request so that it lands where its prefix is
/// already cached. Hints always fail open: a missing or slow hint never blocks
/// a request.
#[derive(Debug, Parser)]
#[command(name = "inferencecache", version, propagate_version = true)]
pub(crate) struct Cli {
    /// Log format: json (one object per line) or text.
    #[arg(long, global = true, env = "INFERENCECACHE_LOG_FORMAT", default_value = "json",
          value_parser = parse_log_format)]
    pub log_format: LogFormat,

    /// Log level: debug, info, warn (or warning), error. INFERENCECACHE_LOG
    /// (per-target directives, e.g. `info,inferencecache::decisions=debug`:
    /// every routing decision's estimates and the load reports behind them)
    /// replaces it when set.
    #[arg(long, global = true, env = "INFERENCECACHE_LOG_LEVEL", default_value = "info",
          value_parser = parse_log_level)]
    pub log_level: tracing::Level,

    #[command(subcommand)]
    pub command: Command,
}

/// What to run.
// Parsed once at startup: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the policy server: gRPC on :9090, health and metrics on :8080,
    /// controller endpoints on :8081.
    ///
    /// Try it: `inferencecache serve`, then
    /// `grpcurl -plaintext localhost:9090 list` and
    /// `curl localhost:8080/metrics`.
    Serve(ServeArgs),

    /// Run the kvevent-subscriber sidecar next to one engine replica: read
    /// its ZMQ KV events and report them to the server.
    Subscribe(crate::subscribe::SubscribeArgs),

    /// Ask a running server for a routing hint (LookupRoute).
    Lookup(crate::tools::lookup::LookupArgs),

    /// Show the aggregate cache state of a tenant/model (GetCacheState).
    State(crate::tools::state::StateArgs),

    /// Dump the index (the control endpoint /snapshot), pretty-printed.
    Snapshot(crate::tools::snapshot::SnapshotArgs),

    /// Follow index changes live (StreamCacheEvents).
    Watch(crate::tools::watch::WatchArgs),

    /// Replay a Mooncake-format trace through the real stack and compare
    /// routing policies (hit rate, TTFT, balance).
    Simulate(crate::simulate::SimulateArgs),

    /// Run the Kubernetes operator: push CachePolicy/CacheTenant to the
    /// server, reflect /snapshot into CacheIndex status, serve the admission
    /// webhooks.
    Operator(crate::operator::OperatorArgs),

    /// Print the CRDs as YAML: `inferencecache crds | kubectl apply -f -`.
    Crds(crate::operator::CrdsArgs),

    /// Route OpenAI traffic to vLLM/SGLang engines by where each prompt is
    /// cached: an OpenAI-compatible gateway with the index and KV-event
    /// subscribers in-process (or `--server` for a remote index).
    ///
    /// Try it: `inferencecache gateway --engine http://127.0.0.1:8001
    /// --engine http://127.0.0.1:8002`, then send OpenAI requests to :8100.
    Gateway(crate::gateway::GatewayArgs),

    /// Check a deployment end to end (server, TLS, health, probe, policy,
    /// sidecars, one lookup) and say how to fix what is broken.
    Doctor(crate::doctor::DoctorArgs),
}

/// Flags of `serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// gRPC listen address (InferenceCache, health, reflection). `:PORT` means every interface.
    #[arg(
        long,
        env = "INFERENCECACHE_GRPC_BIND_ADDRESS",
        default_value = ":9090"
    )]
    pub grpc_bind_address: String,

    /// Public HTTP listen address for /healthz, /readyz and /metrics.
    #[arg(
        long,
        env = "INFERENCECACHE_HTTP_BIND_ADDRESS",
        default_value = ":8080"
    )]
    pub http_bind_address: String,

    /// Control HTTP listen address for /snapshot, /policy and /probe. Without
    /// an auth flag it is narrowed to loopback.
    #[arg(
        long,
        env = "INFERENCECACHE_SNAPSHOT_BIND_ADDRESS",
        default_value = ":8081"
    )]
    pub snapshot_bind_address: String,

    /// Kubernetes username allowed on the control endpoints (checked with a
    /// TokenReview), e.g. system:serviceaccount:inference-cache-system:inference-cache-controller-manager.
    #[arg(long, env = "INFERENCECACHE_ALLOWED_CONTROLLER_SA", default_value = "")]
    pub allowed_controller_sa: String,

    /// Kubeconfig for the TokenReview client when running outside a cluster
    /// (default: KUBECONFIG, then in-cluster service-account config).
    #[arg(long, env = "INFERENCECACHE_KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<std::path::PathBuf>,

    /// Serve the control endpoints without authentication on any address (local development only).
    #[arg(long, env = "INFERENCECACHE_INSECURE_DISABLE_AUTH")]
    pub insecure_disable_auth: bool,

    /// TokenReview audience for /snapshot and /probe.
    #[arg(long, env = "INFERENCECACHE_CONTROLLER_AUDIENCE",
          default_value = inferencecache_server::config::DEFAULT_CONTROLLER_AUDIENCE)]
    pub controller_audience: String,

    /// TokenReview audience for /policy.
    #[arg(long, env = "INFERENCECACHE_POLICY_AUDIENCE",
          default_value = inferencecache_server::config::DEFAULT_POLICY_AUDIENCE)]
    pub policy_audience: String,

    /// PEM certificate chain for gRPC TLS (set together with --tls-key-file).
    #[arg(long, env = "INFERENCECACHE_TLS_CERT_FILE", default_value = "")]
    pub tls_cert_file: String,

    /// PEM private key for gRPC TLS (set together with --tls-cert-file).
    #[arg(long, env = "INFERENCECACHE_TLS_KEY_FILE", default_value = "")]
    pub tls_key_file: String,

    /// PEM CA bundle for mTLS: gRPC clients must present a certificate signed
    /// by it (needs --tls-cert-file and --tls-key-file).
    #[arg(long, env = "INFERENCECACHE_TLS_CLIENT_CA_FILE", default_value = "")]
    pub tls_client_ca_file: String,

    /// Directory of tokenizers for prompt_text lookups: one subdirectory per
    /// model id holding tokenizer.json and tokenizer_config.json.
    #[arg(long, env = "INFERENCECACHE_TOKENIZER_MODELS_DIR", default_value = "")]
    pub tokenizer_models_dir: String,

    /// Bytes of encoded prompt_text prefixes kept per model, so a
    /// conversation re-sent with one more turn encodes only what is new
    /// (0 disables the cache).
    #[arg(long, env = "INFERENCECACHE_TOKENIZE_PREFIX_CACHE_BYTES",
          default_value_t = inferencecache_server::tokenize_prefix::DEFAULT_BUDGET_BYTES)]
    pub tokenize_prefix_cache_bytes: usize,

    /// Tenant policies from a file (YAML or JSON, the /policy push schema),
    /// for running without the Kubernetes controller. Reloaded when it
    /// changes; a bad edit keeps the last good policy and logs why.
    #[arg(long, env = "INFERENCECACHE_POLICY_FILE", value_name = "PATH")]
    pub policy_file: Option<std::path::PathBuf>,

    /// Prompt templates for RenderTemplate from a directory: one YAML or JSON
    /// file per template ({namespace, name, revision?, body, slots}). Reloaded
    /// when it changes; a bad edit keeps the last good set and logs why.
    #[arg(long, env = "INFERENCECACHE_TEMPLATES_DIR", value_name = "DIR")]
    pub templates_dir: Option<std::path::PathBuf>,

    /// Prefill/decode topologies for LookupPDRoute from a file (YAML or JSON:
    /// a list of {namespace, name, prefillReplicas, decodeReplicas,
    /// transport}). Reloaded when it changes, like --policy-file.
    #[arg(long, env = "INFERENCECACHE_PD_TOPOLOGY_FILE", value_name = "PATH")]
    pub pd_topology_file: Option<std::path::PathBuf>,

    /// Global cap on replica x prefix entries in the index; when an ingest or
    /// sweep finds more, the least recently seen (LFU tenants: least hit)
    /// entries go first. 0 or less = unbounded.
    #[arg(
        long,
        env = "INFERENCECACHE_INDEX_MAX_ENTRIES",
        default_value_t = 1_000_000,
        allow_negative_numbers = true
    )]
    pub index_max_entries: i64,

    /// How long an index entry lives without a refresh, for tenants whose
    /// policy sets no evictionTTL (e.g. 30m, 90s, 1h30m).
    #[arg(long, env = "INFERENCECACHE_INDEX_TTL", default_value = "30m", value_parser = parse_duration)]
    pub index_ttl: std::time::Duration,

    /// How long a sidecar that heartbeats (ours: every 2 s) may say nothing
    /// before its replica stops getting hints (its blocks are withdrawn
    /// until it reconnects and re-reports). 0 never withdraws (the
    /// reference's behaviour: entries live until their TTL).
    #[arg(long, env = "INFERENCECACHE_PRODUCER_SILENCE", default_value = "10s",
          value_parser = parse_duration)]
    pub producer_silence: std::time::Duration,

    /// How often expired entries are swept and the cap re-checked (e.g. 1m).
    #[arg(long, env = "INFERENCECACHE_INDEX_SWEEP_INTERVAL", default_value = "1m",
          value_parser = parse_duration)]
    pub index_sweep_interval: std::time::Duration,

    /// Ranking of tenants whose CachePolicy does not choose one: `ttft`
    /// (estimated time to first token over every live replica, load- and
    /// tier-aware, with approximate mode) or `contract` (the reference's
    /// ranking and affinity, exactly).
    #[arg(long, env = "INFERENCECACHE_RANKING", default_value = "ttft", value_parser = parse_ranking)]
    pub ranking: inferencecache_server::core::RankingMode,

    /// Claim every block the index says a replica holds, even those the
    /// requests already hinted to it will evict before its engine schedules
    /// this one. By default (ttft ranking) the server models each replica's
    /// block pool from its producer's reports (capacity from the load
    /// report, blocks in the order the engine stored them) and the hints it
    /// delivered (the top-ranked replica taken as where the request goes),
    /// and withholds those blocks, so a hint does not promise what the
    /// engine will have dropped. `--ranking contract` never applies it.
    #[arg(long, env = "INFERENCECACHE_NO_EVICTION_FORESIGHT")]
    pub no_eviction_foresight: bool,

    /// Period of StreamMetrics samples (e.g. 1s).
    #[arg(long, env = "INFERENCECACHE_STREAM_METRICS_INTERVAL", default_value = "1s",
          value_parser = parse_duration)]
    pub stream_metrics_interval: std::time::Duration,

    /// Tokens per KV block, used to fingerprint token_ids and prompt_text
    /// for models whose sidecars do not report their engine's size (ours
    /// do: their size wins, and one that differs from this is a warning,
    /// `inferencecache_engine_block_size_mismatch` and a `doctor` finding).
    /// Values <= 0 keep the default.
    #[arg(
        long,
        env = "INFERENCECACHE_ENGINE_BLOCK_SIZE",
        default_value_t = 16,
        allow_negative_numbers = true
    )]
    pub engine_block_size: i64,

    /// Limit on distinct replica ids the index tracks; a report from a new
    /// replica past it gets RESOURCE_EXHAUSTED. Replicas holding nothing and
    /// reporting nothing are released by the sweep. 0 = unbounded.
    #[arg(long, env = "INFERENCECACHE_INDEX_MAX_REPLICAS", default_value_t = limits::DEFAULT_MAX_REPLICAS)]
    pub index_max_replicas: usize,

    /// Longest replica, tenant, model, hash-scheme, adapter id or client
    /// version a producer may send (bytes); longer gets INVALID_ARGUMENT.
    /// 0 = unlimited (the reference).
    #[arg(long, env = "INFERENCECACHE_MAX_ID_BYTES", default_value_t = limits::DEFAULT_MAX_ID_BYTES)]
    pub max_id_bytes: usize,

    /// Longest prefix or block hash a producer may send (bytes); longer gets
    /// INVALID_ARGUMENT. 0 = unlimited (the reference).
    #[arg(long, env = "INFERENCECACHE_MAX_HASH_BYTES", default_value_t = limits::DEFAULT_MAX_HASH_BYTES)]
    pub max_hash_bytes: usize,

    /// Accept reports and events with an empty replica_id, as the reference
    /// does (by default they get INVALID_ARGUMENT).
    #[arg(long, env = "INFERENCECACHE_ACCEPT_EMPTY_REPLICA_ID")]
    pub accept_empty_replica_id: bool,

    /// Largest gRPC request message (bytes); larger gets RESOURCE_EXHAUSTED.
    #[arg(long, env = "INFERENCECACHE_MAX_GRPC_MESSAGE_BYTES",
          default_value_t = inferencecache_server::grpc_limits::DEFAULT_MAX_GRPC_MESSAGE_BYTES)]
    pub max_grpc_message_bytes: usize,

    /// prompt_text tokenizations running at once; past it a lookup answers
    /// NO_HINT at once.
    #[arg(long, env = "INFERENCECACHE_TOKENIZE_CONCURRENCY", default_value_t = limits::DEFAULT_TOKENIZE_CONCURRENCY)]
    pub tokenize_concurrency: usize,

    /// Tokenizer working memory all running tokenizations may claim (bytes;
    /// each claims a fixed multiple of its prompt's size); past it a lookup
    /// answers NO_HINT at once.
    #[arg(long, env = "INFERENCECACHE_TOKENIZE_MEMORY_BUDGET_BYTES",
          default_value_t = limits::DEFAULT_TOKENIZE_MEMORY_BUDGET)]
    pub tokenize_memory_budget_bytes: usize,

    /// Time an HTTP client has to send a complete request head (also reaps
    /// idle keep-alive connections).
    #[arg(long, env = "INFERENCECACHE_HTTP_HEADER_TIMEOUT", default_value = "5s",
          value_parser = parse_duration)]
    pub http_header_timeout: std::time::Duration,

    /// Time an HTTP handler waits for a complete request body (408 past it).
    #[arg(long, env = "INFERENCECACHE_HTTP_BODY_TIMEOUT", default_value = "10s",
          value_parser = parse_duration)]
    pub http_body_timeout: std::time::Duration,

    /// /policy clamps negative numbers to 0 and reads unknown eviction
    /// strings as LRU, as the reference does, instead of answering 400 with
    /// the field's name.
    #[arg(long, env = "INFERENCECACHE_LENIENT_POLICY_VALIDATION")]
    pub lenient_policy_validation: bool,

    /// Threads that apply reports and events, off the threads serving
    /// lookups (default: half the cores, at least 1). 0 applies them inline
    /// on the async runtime (lookups then queue behind large reports).
    #[arg(long, env = "INFERENCECACHE_INGEST_LANES")]
    pub ingest_lanes: Option<usize>,

    /// Write the gRPC responses that become ready in one scheduler round
    /// with one syscall instead of one each (on by default: more lookups per
    /// core under load; an idle request pays one extra task poll).
    #[arg(long, env = "INFERENCECACHE_GRPC_WRITE_COALESCING", default_value_t = true,
          action = clap::ArgAction::Set, value_name = "BOOL")]
    pub grpc_write_coalescing: bool,
    /// Replication bus.
    #[command(flatten)]
    pub bus: crate::bus_args::BusArgs,

    /// With --nats-url: share the hints this replica delivers with the
    /// other server replicas, at most one batch per interval (the first
    /// hint after a quiet spell goes at once), so every replica's default
    /// ranking weighs the whole fleet's load. 0 (or off) shares nothing: each replica
    /// then balances on its own deliveries and the engines' load reports.
    #[arg(long, env = "INFERENCECACHE_BUS_LOAD_INTERVAL", default_value = "10ms",
          value_parser = parse_duration_or_off)]
    pub bus_load_interval: std::time::Duration,

    /// Warm restarts.
    #[command(flatten)]
    pub state: crate::bus_args::StateArgs,
    /// How producers (ReportCacheState, PublishEvent) authenticate: none
    /// (anyone reaching gRPC writes any tenant; the reference's behaviour),
    /// token (projected service-account token, TokenReview, identity = the
    /// pod's namespace) or mtls (client certificate: SPIFFE URI SAN
    /// spiffe://TD/ns/NS/sa/SA, else CN). See docs/security.md.
    #[arg(long, env = "INFERENCECACHE_PRODUCER_AUTH", default_value = "none",
          value_parser = inferencecache_server::producer::ProducerAuth::parse)]
    pub producer_auth: inferencecache_server::producer::ProducerAuth,

    /// Audience producer tokens must carry (--producer-auth token).
    #[arg(long, env = "INFERENCECACHE_PRODUCER_AUDIENCE",
          default_value = inferencecache_server::producer::DEFAULT_PRODUCER_AUDIENCE)]
    pub producer_audience: String,

    /// YAML or JSON mapping of producer identity (namespace, CN or full
    /// subject) to the extra tenants it may write, e.g. `team-a: [shared]`.
    #[arg(
        long,
        env = "INFERENCECACHE_PRODUCER_TENANTS_FILE",
        value_name = "PATH"
    )]
    pub producer_tenants_file: Option<std::path::PathBuf>,

    /// Blocks per second each producer identity may write (0 = unlimited);
    /// over it, RESOURCE_EXHAUSTED with grpc-retry-pushback-ms.
    #[arg(long, env = "INFERENCECACHE_PRODUCER_MAX_BLOCKS_PER_SECOND",
          default_value_t = inferencecache_server::producer::ratelimit::DEFAULT_BLOCKS_PER_SECOND)]
    pub producer_max_blocks_per_second: u64,

    /// Largest burst of blocks per identity (the token bucket's size; a full
    /// sidecar resync must fit).
    #[arg(long, env = "INFERENCECACHE_PRODUCER_BURST_BLOCKS",
          default_value_t = inferencecache_server::producer::ratelimit::DEFAULT_BURST_BLOCKS)]
    pub producer_burst_blocks: u64,

    /// Open ReportCacheState streams per producer identity (0 = unlimited).
    #[arg(long, env = "INFERENCECACHE_PRODUCER_MAX_STREAMS",
          default_value_t = inferencecache_server::producer::ratelimit::DEFAULT_MAX_STREAMS)]
    pub producer_max_streams: u32,

    /// Require a bearer token (TokenReview, --consumer-audience) on
    /// LookupRoute, LookupPDRoute, RenderTemplate, GetCacheState and
    /// StreamCacheEvents; cached per token.
    #[arg(long, env = "INFERENCECACHE_CONSUMER_AUTH")]
    pub consumer_auth: bool,

    /// Audience consumer tokens must carry (--consumer-auth).
    #[arg(long, env = "INFERENCECACHE_CONSUMER_AUDIENCE",
          default_value = inferencecache_server::producer::DEFAULT_CONSUMER_AUDIENCE)]
    pub consumer_audience: String,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    /// One JSON object per line.
    Json,
    /// Human-readable lines.
    Text,
}

fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "" | "json" => Ok(LogFormat::Json),
        "text" => Ok(LogFormat::Text),
        other => Err(format!("unknown log format {other:?}; use json or text")),
    }
}

fn parse_log_level(s: &str) -> Result<tracing::Level, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "debug" => Ok(tracing::Level::DEBUG),
        "" | "info" => Ok(tracing::Level::INFO),
        "warn" | "warning" => Ok(tracing::Level::WARN),
        "error" => Ok(tracing::Level::ERROR),
        other => Err(format!(
            "unknown log level {other:?}; use debug, info, warn or error"
        )),
    }
}

/// `--ranking` values.
fn parse_ranking(s: &str) -> Result<inferencecache_server::core::RankingMode, String> {
    inferencecache_server::core::RankingMode::parse(s)
        .ok_or_else(|| format!("unknown ranking {s:?}; expected ttft or contract"))
}

/// Go-style durations (`90s`, `1h30m`), shared with the benchmark rigs.
pub(crate) use inferencecache_control_api::duration::parse_duration;

/// A duration, or `0` / `0s` / `off` for none (a feature switched off).
fn parse_duration_or_off(s: &str) -> Result<std::time::Duration, String> {
    match s.trim() {
        "0" | "0s" | "0ms" | "off" => Ok(std::time::Duration::ZERO),
        other => parse_duration(other).map_err(|e| format!("{e}, or 0 / off for none")),
    }
}

/// Accepts Go-style single-dash long flags (`-grpc-bind-address=:9090`), as
/// existing manifests written for the reference server use them.
pub(crate) fn go_style_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    args.into_iter()
        .map(|arg| match arg.to_str() {
            Some(s) if is_go_long_flag(s) => OsString::from(format!("-{s}")),
            _ => arg,
        })
        .collect()
}

fn is_go_long_flag(s: &str) -> bool {
    let Some(rest) = s.strip_prefix('-') else {
        return false;
    };
    if rest.starts_with('-') {
        return false;
    }
    let name = rest.split_once('=').map_or(rest, |(n, _)| n);
    // Only multi-letter names made of flag characters; `-5` or `-h` stay as they are.
    name.len() > 1 && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn go_single_dash_flags_become_long_flags() {
        let got = go_style_args(os(&[
            "x",
            "serve",
            "-grpc-bind-address=:1",
            "-h",
            "-5",
            "--a",
        ]));
        assert_eq!(
            got,
            os(&["x", "serve", "--grpc-bind-address=:1", "-h", "-5", "--a"])
        );
    }

    #[test]
    fn log_flags_parse_like_the_reference() {
        assert_eq!(parse_log_format(" JSON "), Ok(LogFormat::Json));
        assert_eq!(parse_log_format(""), Ok(LogFormat::Json));
        assert_eq!(parse_log_format("Text"), Ok(LogFormat::Text));
        assert!(parse_log_format("xml").is_err());
        assert_eq!(parse_log_level("WARNING"), Ok(tracing::Level::WARN));
        assert_eq!(parse_log_level(""), Ok(tracing::Level::INFO));
        assert!(parse_log_level("trace2").is_err());
    }

    #[test]
    fn durations_parse_go_style() {
        use std::time::Duration;
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        for bad in ["", "5", "m", "5d", "0s", "-1m"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_match_the_reference() {
        let cli = Cli::try_parse_from(["inferencecache", "serve"]).expect("parses");
        let Command::Serve(a) = cli.command else {
            panic!("serve expected");
        };
        assert_eq!(a.grpc_bind_address, ":9090");
        assert_eq!(a.http_bind_address, ":8080");
        assert_eq!(a.snapshot_bind_address, ":8081");
        assert_eq!(a.controller_audience, "inferencecache.io/controller");
        assert_eq!(a.policy_audience, "inferencecache.io/policy");
        assert_eq!(a.engine_block_size, 16);
        assert!(!a.insecure_disable_auth);
        assert_eq!(a.index_max_entries, 1_000_000);
        assert_eq!(a.index_ttl, std::time::Duration::from_secs(1800));
        assert_eq!(a.index_sweep_interval, std::time::Duration::from_secs(60));
    }
}

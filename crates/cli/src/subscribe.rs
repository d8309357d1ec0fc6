//! `inferencecache subscribe`: the kvevent-subscriber sidecar (engine ZMQ KV
//! events → server). Flag validation and signal handling live here; the
//! sidecar itself is `inferencecache_subscriber::sidecar`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use inferencecache_subscriber::decode::TupleLayout;
use inferencecache_subscriber::forward::{ForwardConfig, Identity, ServerTls};
use inferencecache_subscriber::mapping::{DEFAULT_MAX_TRACKED_BLOCKS, MappingConfig};
use inferencecache_subscriber::sidecar::{self, SidecarConfig};
use inferencecache_subscriber::stats::{CacheTierGauge, Profile, ProfileConfig, StatsConfig};
use inferencecache_subscriber::{DecodeOptions, TransportConfig, parse_lora_adapter_names};
use tokio_util::sync::CancellationToken;

use crate::args::parse_duration;
use crate::runtime::{EXIT_FAILURE, EXIT_USAGE};

/// Shown after the flags in `--help`.
const EXAMPLES: &str = "\
Start the engine with KV events on, e.g. vLLM:
  --kv-events-config '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",
    \"endpoint\":\"tcp://*:5557\",\"replay_endpoint\":\"tcp://*:5558\",\"topic\":\"kv-events\"}'
then run the sidecar next to it:
  inferencecache subscribe --replica-id \"$POD_NAME\" --model-id llama-3-8b \\
    --engine-endpoint tcp://127.0.0.1:5557 --replay-endpoint tcp://127.0.0.1:5558 \\
    --server inference-cache-server:9090
Check it: curl localhost:8090/readyz (engine stream and server both up),
curl localhost:8090/metrics (inferencecache_subscriber_*).
Each cached block is keyed by the content fingerprint of its tokens, so a
LookupRoute with the same token_ids finds this replica.";

/// Flags of `subscribe`.
#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub(crate) struct SubscribeArgs {
    /// Index key for this replica (required; the injected sidecar uses $(POD_NAME)).
    #[arg(long, env = "INFERENCECACHE_REPLICA_ID", default_value = "")]
    pub replica_id: String,

    /// Model id the engine serves, as gateways name it in LookupRoute (required).
    #[arg(long, env = "INFERENCECACHE_MODEL_ID", default_value = "")]
    pub model_id: String,

    /// Tenant (the injected sidecar uses $(POD_NAMESPACE)).
    #[arg(long, env = "INFERENCECACHE_TENANT_ID", default_value = "")]
    pub tenant_id: String,

    /// Index domain: vllm or sglang (also selects the engine metrics names
    /// and the SGLang tuple layout).
    #[arg(long, env = "INFERENCECACHE_HASH_SCHEME", default_value = "vllm")]
    pub hash_scheme: String,

    /// The engine's ZMQ PUB endpoint (rank 0; rank r uses port + r).
    #[arg(
        long,
        env = "INFERENCECACHE_ENGINE_ENDPOINT",
        default_value = "tcp://127.0.0.1:5557"
    )]
    pub engine_endpoint: String,

    /// The engine's replay ROUTER endpoint (rank 0; port + r per rank). Empty
    /// disables replays: gaps are then lost and counted instead of recovered.
    #[arg(long, env = "INFERENCECACHE_REPLAY_ENDPOINT", default_value = "")]
    pub replay_endpoint: String,

    /// Bind --engine-endpoint and let the engine connect (for engines whose
    /// kv-events endpoint names a host, which makes them connect).
    #[arg(long, env = "INFERENCECACHE_ENGINE_BIND")]
    pub engine_bind: bool,

    /// ZMQ topic prefix to subscribe to; "" for every topic.
    #[arg(long, env = "INFERENCECACHE_TOPIC", default_value = "kv-events")]
    pub topic: String,

    /// Data-parallel ranks of the engine, each with its own publisher.
    #[arg(long, env = "INFERENCECACHE_DATA_PARALLEL_SIZE", default_value_t = 1)]
    pub data_parallel_size: u32,

    /// First data-parallel rank this sidecar serves.
    #[arg(
        long,
        env = "INFERENCECACHE_DATA_PARALLEL_START_RANK",
        default_value_t = 0
    )]
    pub data_parallel_start_rank: u32,

    /// How long a replay may stay silent before it is given up.
    #[arg(long, env = "INFERENCECACHE_REPLAY_TIMEOUT", default_value = "5s",
          value_parser = parse_duration)]
    pub replay_timeout: Duration,

    /// How long the engine's event stream may stay disconnected before the
    /// replica's blocks are withdrawn from the server (ALL_CLEARED): a dead
    /// engine stops getting hints this long after its stream drops, and
    /// gets them again once it is back and replayed. 0 keeps them (the
    /// reference's behaviour: hints until the TTL or the engine's return).
    #[arg(long, env = "INFERENCECACHE_ENGINE_DOWN_GRACE", default_value = "2s",
          value_parser = parse_duration)]
    pub engine_down_grace: Duration,

    /// Policy server gRPC address (host:port, or a URI).
    #[arg(long, env = "INFERENCECACHE_SERVER", default_value = "127.0.0.1:9090")]
    pub server: String,

    /// Batching interval for reports; p99 visibility is about 2x this.
    #[arg(long, env = "INFERENCECACHE_WINDOW", default_value = "100ms",
          value_parser = parse_duration)]
    pub window: Duration,

    /// Replication bus: publish straight to NATS JetStream instead of --server.
    #[command(flatten)]
    pub bus: crate::bus_args::BusArgs,

    /// Engine blocks tracked at most (about 150 bytes each); past it the least
    /// recently stored block is forgotten and evicted at the server.
    #[arg(long, env = "INFERENCECACHE_MAX_TRACKED_BLOCKS", default_value_t = DEFAULT_MAX_TRACKED_BLOCKS)]
    pub max_tracked_blocks: usize,

    /// The engine has an L2 tier but sends no `medium`: a BlockRemoved
    /// re-reports the block at T2 instead of evicting it.
    #[arg(long, env = "INFERENCECACHE_IGNORE_BLOCK_REMOVED")]
    pub ignore_block_removed: bool,

    /// LoRA names for engines that send only lora_id: `1=sql-lora,2=chat-lora`
    /// (vLLM's --lora-modules load order). Unmapped ids are dropped.
    #[arg(long, env = "INFERENCECACHE_LORA_ADAPTER_NAMES", default_value = "")]
    pub lora_adapter_names: String,

    /// PEM CA bundle: connect to the server with TLS and verify it against this.
    #[arg(long, env = "INFERENCECACHE_SERVER_TLS_CA", default_value = "")]
    pub server_tls_ca: String,

    /// PEM client certificate for mTLS (with --server-tls-key).
    #[arg(long, env = "INFERENCECACHE_SERVER_TLS_CERT", default_value = "")]
    pub server_tls_cert: String,

    /// PEM client key for mTLS (with --server-tls-cert).
    #[arg(long, env = "INFERENCECACHE_SERVER_TLS_KEY", default_value = "")]
    pub server_tls_key: String,

    /// Name to verify in the server certificate, if not the --server host.
    #[arg(
        long,
        env = "INFERENCECACHE_SERVER_TLS_SERVER_NAME",
        default_value = ""
    )]
    pub server_tls_server_name: String,

    /// Bearer token for a server running --producer-auth token: a projected
    /// service-account token with audience inferencecache.io/producer.
    /// Re-read on every reconnect (and every minute), so rotation works.
    #[arg(long, env = "INFERENCECACHE_SERVER_TOKEN_FILE", value_name = "PATH")]
    pub server_token_file: Option<std::path::PathBuf>,

    /// Engine Prometheus endpoint for replica stats; "" disables the stats path.
    #[arg(
        long,
        env = "INFERENCECACHE_ENGINE_METRICS_URL",
        default_value = "http://127.0.0.1:8000/metrics"
    )]
    pub engine_metrics_url: String,

    /// How long the engine's /metrics may fail (after answering once) before
    /// the replica's blocks are withdrawn (ALL_CLEARED): a hung engine keeps
    /// its event stream's connection, so this is how it stops getting hints
    /// (within the grace plus one scrape timeout); the first good scrape
    /// brings them back. 0 never withdraws for metrics.
    #[arg(long, env = "INFERENCECACHE_ENGINE_METRICS_GRACE", default_value = "3s",
          value_parser = parse_duration)]
    pub engine_metrics_grace: Duration,

    /// Scrape and report interval of replica stats: the engine's running and
    /// waiting requests and KV usage, the server's load signal. 1s keeps the
    /// ranking's queued work current (the reference scrapes every 10s).
    #[arg(long, env = "INFERENCECACHE_STATS_INTERVAL", default_value = "1s",
          value_parser = parse_duration)]
    pub stats_interval: Duration,

    /// KV cache bytes; multiplied by the usage ratio for cache_memory_bytes.
    #[arg(
        long,
        env = "INFERENCECACHE_ENGINE_CACHE_SIZE_BYTES",
        default_value_t = 0
    )]
    pub engine_cache_size_bytes: i64,

    /// Denominator of pressure = (running + waiting) / ceiling; 0 disables it.
    #[arg(
        long,
        env = "INFERENCECACHE_MAX_CONCURRENCY_CEILING",
        default_value_t = 256
    )]
    pub max_concurrency_ceiling: u32,

    /// Usage gauge for cache_memory_bytes: auto, kv, gpu or cpu.
    #[arg(long, env = "INFERENCECACHE_CACHE_TIER", default_value = "auto")]
    pub cache_tier: String,

    /// Only count engine series with this model_name label.
    #[arg(long, env = "INFERENCECACHE_ENGINE_MODEL_NAME", default_value = "")]
    pub engine_model_name: String,

    /// ReplicaStats.client_version; empty = detect from engine metrics when present.
    #[arg(long, env = "INFERENCECACHE_CLIENT_VERSION", default_value = "")]
    pub client_version: String,

    /// Listen address for /metrics, /healthz and /readyz; "" serves none.
    #[arg(
        long,
        env = "INFERENCECACHE_HTTP_BIND_ADDRESS",
        default_value = ":8090"
    )]
    pub http_bind_address: String,
}

/// A flag error, with what to do about it.
fn usage(msg: impl std::fmt::Display) -> String {
    format!("{msg} (see `inferencecache subscribe --help`)")
}

fn nonempty(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_owned())
}

/// `:PORT` means every interface, like `serve`.
fn build_config(a: &SubscribeArgs) -> Result<SidecarConfig, String> {
    let replica_id = nonempty(&a.replica_id).ok_or_else(|| {
        usage("--replica-id is required: the index key of this replica, e.g. $POD_NAME")
    })?;
    let model_id = nonempty(&a.model_id)
        .ok_or_else(|| usage("--model-id is required: the model id gateways use in LookupRoute"))?;
    let hash_scheme = nonempty(&a.hash_scheme)
        .ok_or_else(|| usage("--hash-scheme must not be empty (vllm or sglang)"))?;
    let lora_adapter_names = parse_lora_adapter_names(&a.lora_adapter_names)
        .map_err(|e| usage(format!("--lora-adapter-names: {e}")))?;
    let cache_tier: CacheTierGauge = a
        .cache_tier
        .parse()
        .map_err(|e| usage(format!("--cache-tier: {e}")))?;
    if a.data_parallel_size == 0 {
        return Err(usage("--data-parallel-size must be at least 1"));
    }
    if a.max_tracked_blocks == 0 {
        return Err(usage("--max-tracked-blocks must be at least 1"));
    }
    if a.window.is_zero() {
        return Err(usage("--window must be positive, e.g. 100ms"));
    }
    for (flag, v) in [
        ("--engine-endpoint", a.engine_endpoint.as_str()),
        ("--replay-endpoint", a.replay_endpoint.as_str()),
    ] {
        if !v.is_empty() && !v.contains("://") {
            return Err(usage(format!(
                "{flag} {v:?} needs a transport, e.g. tcp://127.0.0.1:5557"
            )));
        }
    }
    let tls = match (
        nonempty(&a.server_tls_ca),
        nonempty(&a.server_tls_cert),
        nonempty(&a.server_tls_key),
    ) {
        (None, None, None) => None,
        (None, _, _) => {
            return Err(usage(
                "--server-tls-cert/--server-tls-key need --server-tls-ca (the CA that signed the server)",
            ));
        }
        (Some(ca), cert, key) => {
            let client_identity = match (cert, key) {
                (Some(c), Some(k)) => Some((PathBuf::from(c), PathBuf::from(k))),
                (None, None) => None,
                _ => {
                    return Err(usage("--server-tls-cert and --server-tls-key go together"));
                }
            };
            Some(ServerTls {
                ca_file: PathBuf::from(ca),
                client_identity,
                server_name: nonempty(&a.server_tls_server_name),
            })
        }
    };
    let profile = Profile::for_scheme(&hash_scheme);
    let stats = nonempty(&a.engine_metrics_url).map(|url| StatsConfig {
        url,
        interval: if a.stats_interval.is_zero() {
            Duration::from_secs(1)
        } else {
            a.stats_interval
        },
        // A scrape slower than two intervals is a stale load signal anyway.
        timeout: (a.stats_interval * 2).clamp(Duration::from_secs(1), Duration::from_secs(5)),
        profile: ProfileConfig {
            profile,
            model_name: nonempty(&a.engine_model_name),
            max_concurrency_ceiling: f64::from(a.max_concurrency_ceiling),
            cache_size_bytes: a.engine_cache_size_bytes.max(0),
            cache_tier,
        },
        client_version: nonempty(&a.client_version),
        down_grace: (!a.engine_metrics_grace.is_zero()).then_some(a.engine_metrics_grace),
    });
    Ok(SidecarConfig {
        transport: TransportConfig {
            engine_endpoint: a.engine_endpoint.clone(),
            replay_endpoint: nonempty(&a.replay_endpoint),
            topic: a.topic.clone(),
            bind: a.engine_bind,
            replay_timeout: a.replay_timeout,
            engine_down_grace: (!a.engine_down_grace.is_zero()).then_some(a.engine_down_grace),
            ..TransportConfig::default()
        },
        first_rank: a.data_parallel_start_rank,
        ranks: a.data_parallel_size,
        mapping: MappingConfig {
            max_tracked_blocks: a.max_tracked_blocks,
            ignore_block_removed: a.ignore_block_removed,
            lora_adapter_names,
            ..MappingConfig::default()
        },
        decode: DecodeOptions {
            tuple_layout: if profile == Profile::Sglang {
                TupleLayout::Sglang
            } else {
                TupleLayout::Vllm
            },
        },
        forward: ForwardConfig {
            server: a.server.clone(),
            tls,
            identity: Identity {
                replica_id,
                model_id,
                tenant_id: a.tenant_id.clone(),
                hash_scheme,
            },
            window: a.window,
            bus: a
                .bus
                .config(inferencecache_bus::config::DEFAULT_MAX_AGE)
                .map_err(usage)?
                .map(
                    |(config, limits)| inferencecache_subscriber::forward::bus::BusForward {
                        config,
                        limits,
                    },
                ),
            token_file: a.server_token_file.clone(),
            ..ForwardConfig::default()
        },
        stats,
        // Parsed (`:PORT` and the other shared forms) where it is bound.
        http_bind: nonempty(&a.http_bind_address),
    })
}

/// Runs `subscribe`; returns the process exit code.
pub(crate) fn run(args: SubscribeArgs) -> ExitCode {
    let config = match build_config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("inferencecache subscribe: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime = match crate::runtime::multi_thread("subscribe", Some(2)) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "subscribe_error");
            eprintln!("inferencecache subscribe: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

async fn serve(config: SidecarConfig) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    // Before "listening", so a signal sent the moment it appears still
    // flushes and stops cleanly.
    let stop = crate::signals::Stop::install()
        .map_err(|e| anyhow::anyhow!("cannot handle SIGINT/SIGTERM: {e}"))?;
    let engine = config.transport.engine_endpoint.clone();
    let server = config.forward.server.clone();
    if config.forward.identity.tenant_id.is_empty() {
        // The server's lookups fail open for an empty tenant, so these
        // entries would be indexed but never matched.
        tracing::warn!(
            "no --tenant-id: LookupRoute never matches an empty tenant, so this replica's blocks will not produce hints; set --tenant-id (the injected sidecar uses $(POD_NAMESPACE))"
        );
    }
    let running = sidecar::start(config, cancel.clone()).await?;
    tracing::info!(
        engine_endpoint = %engine,
        server = %server,
        http_addr = running.http_addr.map(|a| a.to_string()).unwrap_or_default(),
        "listening"
    );
    let signals = tokio::spawn(async move {
        if stop.forward(cancel).await {
            tracing::info!("shutdown signal received; flushing and stopping");
        }
    });
    let result = running.wait().await;
    signals.abort();
    tracing::info!("subscriber stopped");
    Ok(result?)
}

//! `inferencecache gateway`: flag parsing and signals; the gateway itself is
//! `inferencecache_gateway`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use inferencecache_gateway::{EmbeddedIndex, EngineSpec, Gateway, GatewayConfig, HintMode};
use tokio_util::sync::CancellationToken;

use crate::args::parse_duration;
use crate::runtime::{EXIT_FAILURE, EXIT_USAGE};

const EXAMPLES: &str = "\
Examples:
  # Two vLLM engines on this machine (KV events on, prompt-tokens details on):
  #   vllm serve Qwen/Qwen3-0.6B --port 8001 --enable-prefix-caching \\
  #     --enable-prompt-tokens-details --kv-events-config \\
  #     '{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\",\"replay_endpoint\":\"tcp://*:5558\"}'
  #   (the second on --port 8002 with endpoints :5567 / :5568)
  inferencecache gateway --engine http://127.0.0.1:8001 --engine http://127.0.0.1:8002
  # then point any OpenAI client at it:
  curl localhost:8100/v1/chat/completions -H 'content-type: application/json' \\
    -d '{\"model\":\"Qwen/Qwen3-0.6B\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'
  curl -si ... | grep x-inferencecache    # which engine, and why
  curl localhost:8100/metrics             # inferencecache_gateway_*

  # Engines without GET /kv_event_sources (vLLM < 0.32), or a remote model id:
  inferencecache gateway \\
    --engine http://10.0.0.1:8000,id=vllm-0,events=tcp://10.0.0.1:5557,replay=tcp://10.0.0.1:5558 \\
    --tokenizer Qwen/Qwen3-8B=/models/Qwen3-8B

  # Kubernetes: hints from the cluster's server (its sidecars report there);
  # ids must be the sidecars' --replica-id, the tenant their --tenant-id:
  inferencecache gateway --server inference-cache:9090 --tenant team-a \\
    --engine http://vllm-0.vllm:8000,id=vllm-0 --engine http://vllm-1.vllm:8000,id=vllm-1

Failure behaviour: no hint, a lookup slower than --lookup-timeout, an
unhealthy hinted engine or a missing tokenizer all route to the least-loaded
engine; a refused connection moves the request to the next engine. See
docs/gateway.md.";

/// Flags of `gateway`.
#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub(crate) struct GatewayArgs {
    /// An engine: `URL[,id=REPLICA_ID][,events=tcp://HOST:PORT][,replay=tcp://HOST:PORT]`.
    /// Repeat per engine. Without events=, the endpoints come from the
    /// engine's GET /kv_event_sources (`*` = the engine's host).
    #[arg(
        long = "engine",
        env = "INFERENCECACHE_GATEWAY_ENGINES",
        value_delimiter = ' ',
        required = true
    )]
    pub engines: Vec<String>,

    /// Where the OpenAI API is served. `:PORT` means every interface.
    #[arg(long, env = "INFERENCECACHE_GATEWAY_LISTEN", default_value = ":8100")]
    pub listen: String,

    /// Use this remote `inferencecache serve` (gRPC address) for hints
    /// instead of the in-process index; its subscribers run next to the engines.
    #[arg(long, env = "INFERENCECACHE_SERVER")]
    pub server: Option<String>,

    /// Tenant the engines' blocks are indexed under (with --server: the
    /// sidecars' --tenant-id).
    #[arg(long, env = "INFERENCECACHE_TENANT_ID", default_value = inferencecache_gateway::DEFAULT_TENANT)]
    pub tenant: String,

    /// Hash scheme the engines' events use: vllm or sglang.
    #[arg(long, env = "INFERENCECACHE_HASH_SCHEME", default_value = "vllm")]
    pub hash_scheme: String,

    /// Engine KV block size in tokens. Default: read from the engines'
    /// /metrics (vllm:cache_config_info).
    #[arg(long, env = "INFERENCECACHE_ENGINE_BLOCK_SIZE")]
    pub block_size: Option<u32>,

    /// `MODEL=DIR`: the tokenizer (tokenizer.json + tokenizer_config.json)
    /// of a served model. Default: the engine's model directory when it is
    /// on this machine. Repeatable.
    #[arg(long = "tokenizer", value_name = "MODEL=DIR")]
    pub tokenizers: Vec<String>,

    /// Longest a hint lookup may take; slower ones route by load.
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    pub lookup_timeout: Duration,

    /// Engine health-check period (GET /health).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub health_interval: Duration,

    /// Connect timeout towards an engine; past it the next engine is tried.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub connect_timeout: Duration,

    /// How long an idle kept-alive connection to an engine is kept. Keep it
    /// below the engines' own keep-alive (vLLM: 5 s,
    /// VLLM_HTTP_TIMEOUT_KEEP_ALIVE) so the gateway closes first; a request
    /// the engine's close races anyway is resent once on a fresh connection
    /// (inferencecache_gateway_stale_connection_retries).
    #[arg(long, default_value = "4s", value_parser = parse_duration)]
    pub engine_idle_timeout: Duration,

    /// How long to wait for the engines at startup before serving anyway.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub startup_timeout: Duration,

    /// How long the gateway ignores an engine's claims while the
    /// in-process index replays the engine's KV-event history (blocks the
    /// history later drops, e.g. at a prefix-cache reset, would otherwise be
    /// claimed); requests go by load meanwhile (reason catching_up). Past
    /// it, the claims are used on live events alone (a warning).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub catch_up_timeout: Duration,

    /// A running request's weight in the pick, in prompt tokens to prefill.
    #[arg(long, default_value_t = inferencecache_gateway::DEFAULT_DECODE_WEIGHT_TOKENS)]
    pub decode_weight_tokens: u64,

    /// Percent of a prefix's tokens the pick charges for caching a second
    /// copy of it on another engine (0: pure least prefill work). A copy
    /// that does not fit that engine's cache (or the fleet's: vLLM pool
    /// sizes from /metrics) would evict a live prompt and is charged
    /// --intake-weight-pct instead.
    #[arg(long, default_value_t = inferencecache_gateway::DEFAULT_DUPLICATE_WEIGHT_PCT)]
    pub duplicate_weight_pct: u64,

    /// How long the in-process KV-event subscribers batch an engine's block
    /// stores before the index sees them (removals go at once). What the
    /// gateway routed counts from dispatch anyway; shorter windows wake
    /// the gateway more often while idle.
    #[arg(long, default_value = "100ms", value_parser = parse_duration)]
    pub events_window: Duration,

    /// Percent of a prompt's uncached tokens the pick charges, per token an
    /// engine's cache has taken in beyond the least-filled engine's (capped
    /// at the prompt's own): new prefixes go where there is room unless
    /// that engine's queue is longer by about four of their prefills (0:
    /// room is only a tie-break, as before). Not charged while the engine's
    /// cache (its vLLM pool size, an eighth kept free) still has room for
    /// the prompt: then it takes the shorter queue.
    #[arg(long, default_value_t = inferencecache_gateway::DEFAULT_INTAKE_WEIGHT_PCT)]
    pub intake_weight_pct: u64,

    /// Serve POST /inferencecache/engines ({"engine": "<an --engine value>"})
    /// and DELETE /inferencecache/engines/ID: add and remove engines while
    /// the gateway runs. Off by default (whoever reaches the gateway could
    /// point it at any host).
    #[arg(long)]
    pub engine_admin: bool,

    /// Do not count prefixes the gateway routed moments ago and the index
    /// has not indexed yet (rank by the index's hints alone).
    #[arg(long)]
    pub no_pending_prefixes: bool,

    /// Claim (and rank by) every block the index says an engine holds, even
    /// those the requests already sent to it will evict before it schedules
    /// this one. By default the gateway models each vLLM engine's block pool
    /// (capacity from its /metrics) and withholds those blocks, so a hint
    /// does not promise what the engine will have dropped.
    #[arg(long)]
    pub no_eviction_foresight: bool,

    /// Charge an engine's in-flight prefills whole, as sent. By default the
    /// pick prices what is left of the oldest: the engine's prefill rate is
    /// learned from its own first tokens, and a prefill that started 400 ms
    /// ago costs a newcomer less than one sent a moment ago.
    #[arg(long)]
    pub no_prefill_progress: bool,

    /// Runtime worker threads (default: one per core). `1` runs the whole
    /// gateway (proxying, tokenizing, the in-process index) on one thread,
    /// long prompts still tokenized on the blocking pool; on a host whose
    /// two cores the engines share it measured neither better nor worse.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub worker_threads: Option<u16>,

    /// Embedded index: its gRPC listener (`inferencecache lookup|state|watch --server`).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub index_grpc_address: String,

    /// Embedded index: its control listener (the /ui status page, /snapshot).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub index_control_address: String,

    /// Embedded index: its /metrics and /readyz.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub index_http_address: String,

    /// Embedded index: the subscribers report over loopback gRPC instead of
    /// in process (the former path, to compare their cost).
    #[arg(long, hide = true)]
    pub index_ingest_over_grpc: bool,
}

fn usage(msg: impl std::fmt::Display) -> String {
    format!("{msg} (see `inferencecache gateway --help`)")
}

fn addr(flag: &str, s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_owned(),
    };
    full.parse()
        .map_err(|_| usage(format!("{flag} {s:?} is not HOST:PORT or :PORT")))
}

fn build_config(a: &GatewayArgs) -> Result<GatewayConfig, String> {
    let engines = a
        .engines
        .iter()
        .filter(|e| !e.trim().is_empty())
        .map(|e| EngineSpec::parse(e).map_err(usage))
        .collect::<Result<Vec<_>, _>>()?;
    let mut c = GatewayConfig::new(addr("--listen", &a.listen)?, engines);
    c.hints = match &a.server {
        Some(s) if !s.trim().is_empty() => HintMode::Remote(s.trim().to_owned()),
        _ => HintMode::Embedded(EmbeddedIndex {
            grpc_addr: addr("--index-grpc-address", &a.index_grpc_address)?,
            control_addr: addr("--index-control-address", &a.index_control_address)?,
            http_addr: addr("--index-http-address", &a.index_http_address)?,
            ingest_over_grpc: a.index_ingest_over_grpc,
        }),
    };
    c.tenant = a.tenant.clone();
    if !matches!(a.hash_scheme.as_str(), "vllm" | "sglang") {
        return Err(usage(format!(
            "--hash-scheme {:?}: use vllm or sglang",
            a.hash_scheme
        )));
    }
    c.hash_scheme = a.hash_scheme.clone();
    c.block_size = a.block_size;
    c.tokenizers = a
        .tokenizers
        .iter()
        .map(|t| {
            t.split_once('=')
                .filter(|(m, d)| !m.is_empty() && !d.is_empty())
                .map(|(m, d)| (m.to_owned(), PathBuf::from(d)))
                .ok_or_else(|| usage(format!("--tokenizer {t:?} is not MODEL=DIR")))
        })
        .collect::<Result<_, _>>()?;
    if a.lookup_timeout.is_zero() {
        return Err(usage("--lookup-timeout must be positive, e.g. 20ms"));
    }
    if a.health_interval.is_zero() {
        return Err(usage("--health-interval must be positive, e.g. 2s"));
    }
    c.lookup_timeout = a.lookup_timeout;
    c.health_interval = a.health_interval;
    c.connect_timeout = a.connect_timeout;
    c.engine_idle_timeout = a.engine_idle_timeout;
    c.startup_timeout = a.startup_timeout;
    c.catch_up_timeout = a.catch_up_timeout;
    c.decode_weight_tokens = a.decode_weight_tokens;
    c.duplicate_weight_pct = a.duplicate_weight_pct;
    c.intake_weight_pct = a.intake_weight_pct;
    if a.events_window.is_zero() {
        return Err(usage("--events-window must be positive, e.g. 100ms"));
    }
    c.events_window = a.events_window;
    c.pending_prefixes = !a.no_pending_prefixes;
    c.eviction_foresight = !a.no_eviction_foresight;
    c.prefill_progress = !a.no_prefill_progress;
    c.engine_admin = a.engine_admin;
    c.validate().map_err(usage)?;
    Ok(c)
}

pub(crate) fn run(args: GatewayArgs) -> ExitCode {
    let config = match build_config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("inferencecache gateway: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime =
        match crate::runtime::multi_thread("gateway", args.worker_threads.map(usize::from)) {
            Ok(rt) => rt,
            Err(code) => return code,
        };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "gateway_error");
            eprintln!("inferencecache gateway: {e:#}");
            let usage = e
                .downcast_ref::<inferencecache_gateway::GatewayError>()
                .is_some_and(inferencecache_gateway::GatewayError::is_usage);
            ExitCode::from(if usage { EXIT_USAGE } else { EXIT_FAILURE })
        }
    }
}

async fn serve(config: GatewayConfig) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let stop = crate::signals::Stop::install()
        .map_err(|e| anyhow::anyhow!("cannot handle SIGINT/SIGTERM: {e}"))?;
    let engines = config.engines.len();
    let running = Gateway::start(config, cancel.clone()).await?;
    let index = running.index;
    tracing::info!(
        addr = %running.addr,
        engines,
        index_grpc_addr = index.map(|i| i.grpc.to_string()).unwrap_or_default(),
        index_ui = index.map(|i| format!("http://{}/ui", i.control)).unwrap_or_default(),
        index_http_addr = index.map(|i| i.http.to_string()).unwrap_or_default(),
        "listening"
    );
    let signals = tokio::spawn(async move {
        if stop.forward(cancel).await {
            tracing::info!("shutdown signal received; stopping");
        }
    });
    let result = running.wait().await;
    signals.abort();
    tracing::info!("gateway stopped");
    Ok(result?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: GatewayArgs,
    }

    fn parse(args: &[&str]) -> Result<GatewayConfig, String> {
        let t = T::try_parse_from(std::iter::once("x").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        build_config(&t.a)
    }

    #[test]
    fn flags_build_the_config() {
        let c = parse(&[
            "--engine",
            "http://a:8000",
            "--engine",
            "http://b:8000,id=b",
            "--listen",
            ":9999",
            "--tokenizer",
            "m=/d",
        ])
        .unwrap();
        assert_eq!(c.engines.len(), 2);
        assert_eq!(c.listen.port(), 9999);
        assert!(matches!(c.hints, HintMode::Embedded(_)));
        let c = parse(&["--engine", "http://a:8000", "--server", "s:9090"]).unwrap();
        assert_eq!(c.hints, HintMode::Remote("s:9090".into()));
    }

    #[test]
    fn bad_flags_say_what_to_do() {
        for (args, want) in [
            (&["--engine", "a:8000"][..], "http://"),
            (
                &["--engine", "http://a:1", "--tokenizer", "nodir"],
                "MODEL=DIR",
            ),
            (
                &["--engine", "http://a:1", "--hash-scheme", "x"],
                "vllm or sglang",
            ),
            (&["--engine", "http://a:1", "--listen", "nope"], "HOST:PORT"),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}

//! `inferencecache simulate`: trace-driven routing simulator (a thin wrapper
//! over `inferencecache-simulator`).

use clap::Args;
use inferencecache_simulator::{
    LookupInput, PolicyKind, ServiceModel, Settings, SimConfig, SimReport, Workload, read_trace,
    simulate, write_plot,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// Flags of `simulate`.
#[derive(Debug, Args)]
#[command(
    about = "Replay a Mooncake trace through the real stack and compare routing policies",
    long_about = "Replays a Mooncake-format trace (JSONL: timestamp ms, input_length, output_length, \
hash_ids) against N simulated engine replicas, each with an LRU KV cache, a FIFO prefill queue and \
batched decode, and routes every request with each policy in turn, on fresh server state:\n\n\
  rr                 round-robin, blind to caches and load\n\
  least-loaded       fewest requests in flight\n\
  hints              LookupRoute hint with the server's defaults (estimated-TTFT ranking, approximate \
mode; real server, real gateway client; round-robin on no hint)\n\
  hints-contract     as hints, from a server started with --ranking contract (the reference)\n\
  hints-approx       as hints, with no KV events at all (stats reports and tentative holdings only)\n\
  hints-no-affinity  contract ranking with the CachePolicy knob affinityRouting=false\n\
  oracle             longest cached prefix on any replica under the load bound; it sees every cache \
and queue exactly at routing time, which the server cannot\n\n\
The replicas publish vLLM-format KV events through the real subscriber mapping --event-delay after \
each prefill, and report stats (pressure = queue depth / --max-queue) every --stats-interval. Time \
is simulated: an hour of trace takes minutes, and a --seed gives the same decisions on every run.\n\n\
Prints per policy: cache hit rate (cached prompt tokens / prompt tokens), TTFT p50/p99, \
requests per replica as max/mean (1.0 = even), lookup latency p50/p99 and the hint mix.",
    after_help = "Examples:\n  \
inferencecache simulate --trace ../shared/data/mooncake/conversation_trace.jsonl\n  \
inferencecache simulate --trace my.jsonl --replicas 16 --policies rr,hints,oracle --plot out.svg --json out.json\n  \
inferencecache simulate --trace my.jsonl --server 127.0.0.1:9090 --input chain   # a running server"
)]
pub(crate) struct SimulateArgs {
    /// Mooncake-format trace (one JSON request per line).
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// Simulated engine replicas.
    #[arg(long, default_value_t = 8)]
    pub replicas: usize,
    /// KV-cache capacity per replica, in blocks (1024 × 512 tokens ≈ an 8B
    /// model's KV on one 80 GB GPU).
    #[arg(long, default_value_t = 1024)]
    pub cache_blocks: usize,
    /// Tokens per trace block (Mooncake traces use 512).
    #[arg(long, default_value_t = 512)]
    pub block_size: usize,
    /// Policies to compare, comma-separated, in table order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "rr,least-loaded,hints,hints-contract,hints-approx,oracle"
    )]
    pub policies: Vec<PolicyKind>,
    /// Use a running server's gRPC endpoint instead of a fresh in-process one
    /// (its --engine-block-size must equal --block-size for --input
    /// token-ids; hints-no-affinity needs the in-process server).
    #[arg(long, value_name = "ADDR")]
    pub server: Option<String>,
    /// LookupRoute input: token-ids (the server fingerprints the prompt) or
    /// chain (the gateway sends block hashes).
    #[arg(long, value_enum, default_value = "token-ids")]
    pub input: InputArg,
    /// Seed of the token expansion; same seed, same run.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Replay only the first N requests.
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Divide trace time by this (2 = twice the arrival rate).
    #[arg(long, default_value_t = 1.0)]
    pub speedup: f64,
    /// Queue depth at which a replica reports pressure 1.0 (also the
    /// oracle's load bound).
    #[arg(long, default_value_t = 4)]
    pub max_queue: usize,
    /// Prefill cost per uncached prompt token, µs.
    #[arg(long, default_value_t = ServiceModel::default().prefill_us_per_token)]
    pub prefill_us_per_token: f64,
    /// Fixed cost of every prefill, µs.
    #[arg(long, default_value_t = ServiceModel::default().prefill_overhead_us)]
    pub prefill_overhead_us: f64,
    /// Decode time per output token, µs.
    #[arg(long, default_value_t = ServiceModel::default().decode_us_per_token)]
    pub decode_us_per_token: f64,
    /// Delay between a replica's prefill finishing and its KV events reaching
    /// the server (the sidecar's batching window), ms.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    pub event_delay: u64,
    /// How often replicas report stats (the sidecar's scrape interval), s.
    #[arg(long, value_name = "SECONDS", default_value_t = 10.0)]
    pub stats_interval: f64,
    /// Time buckets of the over-time series.
    #[arg(long, default_value_t = 60)]
    pub buckets: usize,
    /// Write the full report (with time series) as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write one CSV row per policy.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write the hit-rate / TTFT-over-time figure: X.svg writes the SVG and
    /// X.png next to it; X.png only the PNG (needs a TTF font, e.g. DejaVu).
    #[arg(long, value_name = "FILE.svg|FILE.png")]
    pub plot: Option<PathBuf>,
    /// Print the table as Markdown.
    #[arg(long)]
    pub markdown: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// `--input` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum InputArg {
    /// `token_ids`: the server fingerprints.
    TokenIds,
    /// `block_hashes`: the gateway fingerprints.
    Chain,
}

/// Runs `simulate`; returns the process exit code.
pub(crate) fn run(args: SimulateArgs) -> ExitCode {
    match run_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inferencecache simulate: {e}");
            ExitCode::from(1)
        }
    }
}

fn run_inner(args: SimulateArgs) -> Result<(), String> {
    let started = Instant::now();
    let settings = Settings {
        replicas: args.replicas,
        cache_blocks: args.cache_blocks,
        block_size: args.block_size,
        seed: args.seed,
        speedup: args.speedup,
        max_queue: args.max_queue,
        input: match args.input {
            InputArg::TokenIds => LookupInput::TokenIds,
            InputArg::Chain => LookupInput::Chain,
        },
        service: ServiceModel {
            prefill_overhead_us: args.prefill_overhead_us,
            prefill_us_per_token: args.prefill_us_per_token,
            decode_us_per_token: args.decode_us_per_token,
        },
        server: args.server.clone(),
        buckets: args.buckets,
        event_delay_ms: args.event_delay,
        stats_interval_ms: if args.stats_interval.is_finite() && args.stats_interval > 0.0 {
            (args.stats_interval * 1000.0).round() as u64
        } else {
            0
        },
        ..Settings::default()
    };
    settings.validate().map_err(|e| e.to_string())?;
    let trace = read_trace(&args.trace, args.limit).map_err(|e| e.to_string())?;
    let workload = Workload::new(args.trace.display().to_string(), trace, &settings);
    let config = SimConfig {
        settings,
        policies: args.policies.clone(),
        progress: !args.quiet,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let report = runtime
        .block_on(simulate(&config, &workload))
        .map_err(|e| e.to_string())?;
    if args.markdown {
        print!("{}", report.markdown());
    } else {
        print!("{}", report.table());
    }
    write_outputs(&report, &args)?;
    println!("wall time {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

fn write_outputs(report: &SimReport, args: &SimulateArgs) -> Result<(), String> {
    let write = |path: &Path, body: String| {
        std::fs::write(path, body).map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    if let Some(path) = &args.json {
        write(path, report.json())?;
    }
    if let Some(path) = &args.csv {
        write(path, report.csv())?;
    }
    if let Some(path) = &args.plot {
        write_plot(report, path).map_err(|e| e.to_string())?;
    }
    Ok(())
}

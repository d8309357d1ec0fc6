//! `inferencecache-bench`: the benchmark rigs, kept out of the shipping
//! `inferencecache` binary (docs/decisions.md, issue 35) so that it carries
//! neither their code nor their dependencies (hdrhistogram, indicatif, the
//! plain HF tokenizer, the index crate).
//!
//! - `grpc`: closed-loop LookupRoute load over loopback gRPC with a
//!   concurrent ReportCacheState ingest stream; QPS, client-side
//!   p50/p99/p99.9 and the server-side (handler) latency (this file);
//! - `tokenize`: prompt_text tokenization cost (this file);
//! - `visibility`: engine event to visible-in-LookupRoute latency
//!   (`visibility/`), with a producer flood (`flood.rs`);
//! - `replicate`: snapshot size and load time, bus convergence and replay
//!   (`replicate/`).
//!
//! Build and run: `cargo run --release -p inferencecache-bench -- grpc --help`.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::{CacheStateUpdate, LookupRouteRequest, PrefixEntry};
use inferencecache_server::{Server, ServerConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// Benchmark rigs for inference-cache (not part of the shipped binary).
#[derive(Debug, Parser)]
#[command(name = "inferencecache-bench", version)]
struct BenchArgs {
    /// Log level on stderr (error, warn, info, debug, trace).
    #[arg(long, global = true, default_value = "warn")]
    log_level: tracing::Level,

    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Debug, Subcommand)]
enum BenchWhat {
    /// LookupRoute throughput and latency over gRPC while ingesting.
    ///
    /// Without --server it starts a server in this process on loopback
    /// (client and server then share the machine's cores, as a sidecar
    /// deployment would). Example:
    /// `inferencecache-bench grpc --concurrency 1,16,64 --duration 5s`
    Grpc(GrpcBenchArgs),

    /// prompt_text tokenization cost (chat template + encode) per request,
    /// p50/p99 per prompt size, with a real tokenizer directory.
    ///
    /// Example (after `.ci/fetch-tokenizers`):
    /// `inferencecache-bench tokenize --sizes 1000,8000,32000`
    Tokenize(TokenizeBenchArgs),

    /// The sidecar's engine event → visible-in-LookupRoute latency (p50/p99)
    /// at target block rates, plus its memory per tracked block; engine
    /// publisher, sidecar and server all in this process on loopback.
    ///
    /// Example: `inferencecache-bench visibility --rates 1000,50000 --window 100ms`
    Visibility(visibility::VisibilityBenchArgs),

    /// Active-active replicas and warm restarts: snapshot size and load
    /// time, bus convergence lag and replay rate (needs nats-server for `bus`).
    ///
    /// Example: `inferencecache-bench replicate snapshot --entries 100000,1000000`
    Replicate(replicate::ReplicateBenchArgs),

    /// The server's RSS under a flood of 1 MiB prompt_text lookups and
    /// after it (starts the given release binary; GLIBC_TUNABLES and other
    /// environment pass through; extra server flags after `--`).
    ///
    /// Example: `inferencecache-bench memory-flood --concurrency 16 --duration 20s`
    MemoryFlood(memory_flood::MemoryFloodArgs),
}

mod args;
mod flood;
mod memory_flood;
mod replicate;
mod visibility;

fn main() -> std::process::ExitCode {
    let args = BenchArgs::parse();
    // Logs go to stderr, the figures to stdout.
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(args.log_level)
        .with_target(false)
        .try_init();
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("inferencecache-bench: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

/// Flags of `inferencecache-bench tokenize`.
#[derive(Debug, Args)]
pub(crate) struct TokenizeBenchArgs {
    /// Tokenizer models directory (as --tokenizer-models-dir).
    #[arg(long, default_value = ".cache/tokenizers")]
    models_dir: std::path::PathBuf,
    /// Model id inside it.
    #[arg(long, default_value = "Qwen/Qwen3")]
    model: String,
    /// Approximate prompt sizes in tokens.
    #[arg(long, value_delimiter = ',', default_value = "1000,8000,32000")]
    sizes: Vec<usize>,
    /// Requests per size and column.
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// Prefix cache budget for the `miss` and `warm` columns (as
    /// --tokenize-prefix-cache-bytes).
    #[arg(long, default_value_t = inferencecache_server::tokenize_prefix::DEFAULT_BUDGET_BYTES)]
    prefix_cache_bytes: usize,
    /// Share of a `warm` prompt's text sent (and cached) the turn before.
    #[arg(long, default_value_t = 0.9)]
    warm_share: f64,
    /// Also send the `warm` case as LookupRoute calls to an in-process
    /// server and report its handler latency (`lookup_latency_us`).
    #[arg(long)]
    grpc: bool,
}

/// A prompt of about `tokens` tokens: varied English, code and numbers, so
/// the tokenizer does realistic work (not one repeated merge).
pub(crate) fn synthetic_prompt(tokens: usize, salt: usize) -> String {
    const PARAGRAPH: &str = "The cache-aware router sends each request to the replica that \
        already holds the longest prefix of its prompt, so prefill work is skipped. \
        fn route(req: &Request) -> Option<ReplicaId> { index.lookup(req.chain()) } \
        Measured at 2026-12-02: 31,023 lookups/s, p99 3.9 ms. ";
    // ~60 tokens per paragraph for BPE tokenizers of this family.
    let mut out = format!("Document {salt}. ");
    let mut i = 0;
    while out.len() < tokens * 4 {
        out.push_str(&format!("[{}] {PARAGRAPH}", i + salt));
        i += 1;
    }
    out
}

/// Flags of `inferencecache-bench grpc`.
#[derive(Debug, Args)]
pub(crate) struct GrpcBenchArgs {
    /// Target server (host:port). Default: an in-process server on loopback.
    #[arg(long)]
    server: Option<String>,
    /// Closed-loop client concurrency levels to run, in order.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    concurrency: Vec<usize>,
    /// Measured time per level.
    #[arg(long, default_value = "5s", value_parser = crate::args::parse_duration)]
    duration: Duration,
    /// Unmeasured warm-up per level.
    #[arg(long, default_value = "1s", value_parser = crate::args::parse_duration)]
    warmup: Duration,
    /// Replicas reporting prefixes.
    #[arg(long, default_value_t = 64)]
    replicas: usize,
    /// Distinct prompt chains pre-loaded (each held by 4 replicas at different depths).
    #[arg(long, default_value_t = 4096)]
    chains: usize,
    /// Blocks per chain (16 tokens each).
    #[arg(long, default_value_t = 32)]
    blocks: usize,
    /// Blocks per second re-reported by the concurrent ingest stream (0 = no ingest).
    #[arg(long, default_value_t = 100_000)]
    ingest_rate: u64,
    /// gRPC connections the lookup workers share.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Send prompt_text of about this many tokens instead of block hashes
    /// (needs a tokenizer: --tokenizer-models-dir and --prompt-model).
    #[arg(long, default_value_t = 0)]
    prompt_tokens: usize,
    /// Tokenizer models directory for the in-process server.
    #[arg(long, default_value = ".cache/tokenizers")]
    tokenizer_models_dir: std::path::PathBuf,
    /// Model id used for prompt_text lookups.
    #[arg(long, default_value = "Qwen/Qwen3")]
    prompt_model: String,
    /// Producers flooding ReportCacheState as fast as the server takes it,
    /// each on its own connection (0 = none). The ingest_blk/s column then
    /// counts flooded prefixes.
    #[arg(long, default_value_t = 0)]
    flood_streams: usize,
    /// Distinct prefixes each flood producer cycles through.
    #[arg(long, default_value_t = 2_000_000)]
    flood_prefixes: usize,
    /// Prefixes per flood update.
    #[arg(long, default_value_t = 1000)]
    flood_batch: usize,
    /// Bearer token sent with every LookupRoute (for a server with
    /// --consumer-auth), read from this file.
    #[arg(long, value_name = "PATH")]
    token_file: Option<std::path::PathBuf>,
    /// Run the in-process server with --consumer-auth, reviewing tokens
    /// against the cluster of --kubeconfig (measures the cached check).
    #[arg(long, requires = "kubeconfig")]
    consumer_auth: bool,
    /// Kubeconfig of the cluster that reviews tokens (with --consumer-auth).
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<std::path::PathBuf>,
}

const TENANT: &str = "bench";
const MODEL: &str = "bench-model";
const SCHEME: &str = "vllm";
const BLOCK_TOKENS: i32 = 16;
/// Replicas holding each chain.
const HOLDERS: usize = 4;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn block_hash(chain: usize, block: usize) -> Vec<u8> {
    splitmix(((chain as u64) << 20) | block as u64)
        .to_be_bytes()
        .to_vec()
}

struct Workload {
    replicas: usize,
    chains: usize,
    blocks: usize,
    /// (model, prompts) when lookups send prompt_text.
    prompts: Option<(String, Vec<String>)>,
}

impl Workload {
    /// Chain `c` is held by HOLDERS replicas, the k-th to a depth of
    /// blocks·(k+1)/HOLDERS, so lookups see partial matches of several depths.
    fn updates_for_chain(&self, c: usize) -> Vec<CacheStateUpdate> {
        (0..HOLDERS)
            .map(|k| {
                let depth = (self.blocks * (k + 1) / HOLDERS).max(1);
                CacheStateUpdate {
                    replica_id: format!("replica-{:03}", (c * 7 + k * 13) % self.replicas),
                    model_id: MODEL.into(),
                    tenant_id: TENANT.into(),
                    hash_scheme: SCHEME.into(),
                    prefixes: vec![PrefixEntry {
                        block_hashes: (0..depth).map(|b| block_hash(c, b)).collect(),
                        block_token_counts: vec![BLOCK_TOKENS; depth],
                        ..Default::default()
                    }],
                    ..Default::default()
                }
            })
            .collect()
    }

    fn lookup(&self, c: usize) -> LookupRouteRequest {
        if let Some((model, prompts)) = &self.prompts {
            return LookupRouteRequest {
                model_id: model.clone(),
                tenant_id: TENANT.into(),
                hash_scheme: SCHEME.into(),
                prompt_text: prompts[c % prompts.len()].clone(),
                ..Default::default()
            };
        }
        LookupRouteRequest {
            model_id: MODEL.into(),
            tenant_id: TENANT.into(),
            hash_scheme: SCHEME.into(),
            block_hashes: (0..self.blocks).map(|b| block_hash(c, b).into()).collect(),
            block_token_counts: vec![BLOCK_TOKENS; self.blocks],
            ..Default::default()
        }
    }
}

/// Runs one rig.
fn run(args: BenchArgs) -> anyhow::Result<()> {
    let g = match args.what {
        BenchWhat::Grpc(g) => g,
        BenchWhat::Tokenize(t) => return tokenize(&t),
        BenchWhat::Visibility(v) => return visibility::run(v),
        BenchWhat::Replicate(r) => return replicate::run(r),
        BenchWhat::MemoryFlood(m) => return memory_flood::run(m),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(grpc(g))
}

async fn grpc(args: GrpcBenchArgs) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let (target, server_task) = match &args.server {
        Some(addr) => (addr.clone(), None),
        None => {
            let mut config = ServerConfig::ephemeral();
            config.index.max_entries = 0;
            if args.prompt_tokens > 0 {
                config.tokenizer_models_dir = Some(args.tokenizer_models_dir.clone());
            }
            config.producer.consumer_auth = args.consumer_auth;
            config.kubeconfig.clone_from(&args.kubeconfig);
            let server = Server::bind(&config).await?;
            let addr = server.grpc_addr().to_string();
            (addr, Some(tokio::spawn(server.serve(shutdown.clone()))))
        }
    };
    let url = format!("http://{target}");
    let mut channels = Vec::new();
    for _ in 0..args.connections.max(1) {
        channels.push(
            Channel::from_shared(url.clone())?
                .connect()
                .await
                .with_context(|| format!("connect to {target}; is the server running?"))?,
        );
    }
    let prompts = (args.prompt_tokens > 0).then(|| {
        (0..64)
            .map(|salt| synthetic_prompt(args.prompt_tokens, salt))
            .collect::<Vec<_>>()
    });
    let w = Arc::new(Workload {
        replicas: args.replicas.max(HOLDERS),
        chains: args.chains.max(1),
        blocks: args.blocks.max(1),
        prompts: prompts.map(|p| (args.prompt_model.clone(), p)),
    });

    preload(&w, channels[0].clone()).await?;
    println!(
        "bench grpc: {} chains x {} blocks, {} holders each, {} replicas; ingest {} blocks/s; target {target}",
        w.chains, w.blocks, HOLDERS, w.replicas, args.ingest_rate
    );
    println!(
        "{:>11} {:>10} {:>8} {:>8} {:>9} {:>13} {:>13} {:>13} {:>9}",
        "concurrency",
        "lookups/s",
        "p50_us",
        "p99_us",
        "p99.9_us",
        "server_p50_us",
        "server_p99_us",
        "ingest_blk/s",
        "hit_%"
    );
    for &c in &args.concurrency {
        let r = level(&args, &w, &channels, c.max(1), &url).await?;
        println!(
            "{:>11} {:>10.0} {:>8} {:>8} {:>9} {:>13} {:>13} {:>13.0} {:>9.1}",
            c,
            r.qps,
            r.client.value_at_quantile(0.5),
            r.client.value_at_quantile(0.99),
            r.client.value_at_quantile(0.999),
            r.server.value_at_quantile(0.5),
            r.server.value_at_quantile(0.99),
            r.ingest_blocks_per_s,
            r.hit_pct
        );
    }
    shutdown.cancel();
    if let Some(t) = server_task {
        t.await??;
    }
    Ok(())
}

fn tokenize(args: &TokenizeBenchArgs) -> anyhow::Result<()> {
    use inferencecache_server::tokenize::Tokenizers;
    use inferencecache_server::tokenize_prefix::PrefixCacheMetrics;
    let not_found = || {
        format!(
            "model {:?} not found under {}; run .ci/fetch-tokenizers or pass --models-dir",
            args.model,
            args.models_dir.display()
        )
    };
    let plain = Tokenizers::load_dir(&args.models_dir);
    let plain = plain.get(&args.model).with_context(not_found)?;
    // The path before issue 16: HF's own tokenizer (fancy-regex split) and
    // `encode` with offsets.
    let hf_tok =
        tokenizers::Tokenizer::from_file(args.models_dir.join(&args.model).join("tokenizer.json"))
            .map_err(|e| anyhow::anyhow!("{e}"))
            .ok();
    let metrics = PrefixCacheMetrics::default();
    let cached = Tokenizers::load_dir_cached(&args.models_dir, args.prefix_cache_bytes, &metrics);
    let cached = cached.get(&args.model).with_context(not_found)?;
    println!(
        "bench tokenize: model {} ({} requests per size and column; prefix cache {} bytes{}; warm = {:.0}% of the text sent before)",
        args.model,
        args.iterations,
        args.prefix_cache_bytes,
        if cached.prefix_cache().is_some() {
            ""
        } else {
            ", not enabled for this tokenizer"
        },
        args.warm_share * 100.0
    );
    println!(
        "{:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "target_tok",
        "actual_tok",
        "hf_p50_us",
        "cold_p50",
        "cold_us/t",
        "miss_p50",
        "warm_p50",
        "warm_p99",
        "warm_us/t",
        "render_p50"
    );
    let micros = |t: Instant| {
        u64::try_from(t.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1)
    };
    // A fresh conversation per request, so only the `warm` column hits.
    let mut salt = 0;
    let mut next = |size: usize| {
        salt += 1;
        synthetic_prompt(size, salt)
    };
    for &size in &args.sizes {
        let actual = plain.encode_chat(&synthetic_prompt(size, 0))?.len();
        let (mut hf, mut cold, mut miss, mut warm, mut render) = (
            histogram()?,
            histogram()?,
            histogram()?,
            histogram()?,
            histogram()?,
        );
        let bar = ProgressBar::new(args.iterations as u64);
        for _ in 0..args.iterations {
            // Before this cache: render + HF `encode` (with offsets).
            let prompt = next(size);
            let t = Instant::now();
            let rendered = plain.render(&prompt)?;
            render.saturating_record(micros(t));
            if let Some(tok) = &hf_tok {
                let t = Instant::now();
                let e = tok
                    .encode(plain.render(&prompt)?, false)
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                hf.saturating_record(micros(t));
                std::hint::black_box((e, rendered));
            }
            let prompt = next(size);
            let t = Instant::now();
            std::hint::black_box(plain.encode_chat(&prompt)?);
            cold.saturating_record(micros(t));
            let prompt = next(size);
            let t = Instant::now();
            std::hint::black_box(cached.encode_chat(&prompt)?);
            miss.saturating_record(micros(t));
            let prompt = next(size);
            let mut sent = (prompt.len() as f64 * args.warm_share) as usize;
            while !prompt.is_char_boundary(sent) {
                sent -= 1;
            }
            cached.encode_chat(&prompt[..sent])?;
            let t = Instant::now();
            std::hint::black_box(cached.encode_chat(&prompt)?);
            warm.saturating_record(micros(t));
            bar.inc(1);
        }
        bar.finish_and_clear();
        let per_token = |us: u64| us as f64 / actual.max(1) as f64;
        println!(
            "{:>10} {:>10} {:>10} {:>10} {:>10.3} {:>10} {:>10} {:>10} {:>10.3} {:>10}",
            size,
            actual,
            hf.value_at_quantile(0.5),
            cold.value_at_quantile(0.5),
            per_token(cold.value_at_quantile(0.5)),
            miss.value_at_quantile(0.5),
            warm.value_at_quantile(0.5),
            warm.value_at_quantile(0.99),
            per_token(warm.value_at_quantile(0.5)),
            render.value_at_quantile(0.5)
        );
    }
    if let Some(cache) = cached.prefix_cache() {
        println!(
            "prefix cache: {} entries, {} bytes",
            cache.len(),
            cache.bytes()
        );
    }
    if args.grpc {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("start the async runtime")?
            .block_on(tokenize_grpc(args))?;
    }
    Ok(())
}

/// The `warm` case through gRPC: per request a fresh conversation, its first
/// `warm_share` sent once (`first_srv_*`), then the whole of it (`srv_*`:
/// the server's own `lookup_latency_us`; `client_*`: the round trip).
async fn tokenize_grpc(args: &TokenizeBenchArgs) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    let mut config = ServerConfig::ephemeral();
    config.tokenizer_models_dir = Some(args.models_dir.clone());
    config.tokenize_prefix_cache_bytes = args.prefix_cache_bytes;
    let server = Server::bind(&config).await?;
    let addr = server.grpc_addr().to_string();
    let task = tokio::spawn(server.serve(shutdown.clone()));
    let mut client = InferenceCacheClient::connect(format!("http://{addr}"))
        .await
        .context("connect")?;
    println!("bench tokenize --grpc: LookupRoute with prompt_text to an in-process server");
    println!(
        "{:>10} {:>14} {:>12} {:>12} {:>14}",
        "target_tok", "first_srv_p50", "srv_p50_us", "srv_p99_us", "client_p50_us"
    );
    let micros = |t: Instant| {
        u64::try_from(t.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1)
    };
    let request = |text: &str| LookupRouteRequest {
        model_id: args.model.clone(),
        tenant_id: "bench".into(),
        hash_scheme: "vllm".into(),
        prompt_text: text.to_owned(),
        ..Default::default()
    };
    let mut salt = 1 << 30;
    for &size in &args.sizes {
        let (mut first, mut srv, mut cli) = (histogram()?, histogram()?, histogram()?);
        for _ in 0..args.iterations {
            salt += 1;
            let prompt = synthetic_prompt(size, salt);
            let mut sent = (prompt.len() as f64 * args.warm_share) as usize;
            while !prompt.is_char_boundary(sent) {
                sent -= 1;
            }
            let r = client
                .lookup_route(request(&prompt[..sent]))
                .await?
                .into_inner();
            first.saturating_record(u64::try_from(r.lookup_latency_us).unwrap_or(0).max(1));
            let t = Instant::now();
            let r = client.lookup_route(request(&prompt)).await?.into_inner();
            cli.saturating_record(micros(t));
            anyhow::ensure!(
                !r.token_ids.is_empty(),
                "the server did not tokenize ({})",
                r.reason_code
            );
            srv.saturating_record(u64::try_from(r.lookup_latency_us).unwrap_or(0).max(1));
        }
        println!(
            "{:>10} {:>14} {:>12} {:>12} {:>14}",
            size,
            first.value_at_quantile(0.5),
            srv.value_at_quantile(0.5),
            srv.value_at_quantile(0.99),
            cli.value_at_quantile(0.5)
        );
    }
    shutdown.cancel();
    task.await??;
    Ok(())
}

async fn preload(w: &Workload, channel: Channel) -> anyhow::Result<()> {
    let mut client = InferenceCacheClient::new(channel);
    let updates: Vec<CacheStateUpdate> =
        (0..w.chains).flat_map(|c| w.updates_for_chain(c)).collect();
    client
        .report_cache_state(futures::stream::iter(updates))
        .await
        .context("pre-load ReportCacheState")?;
    Ok(())
}

struct LevelResult {
    qps: f64,
    client: Histogram<u64>,
    server: Histogram<u64>,
    ingest_blocks_per_s: f64,
    hit_pct: f64,
}

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, 60_000_000, 3).context("histogram bounds")
}

async fn level(
    args: &GrpcBenchArgs,
    w: &Arc<Workload>,
    channels: &[Channel],
    concurrency: usize,
    url: &str,
) -> anyhow::Result<LevelResult> {
    let total = args.warmup + args.duration;
    let bar = ProgressBar::new(total.as_secs());
    bar.set_style(
        ProgressStyle::with_template("  concurrency {msg:>3} [{bar:30}] {pos}/{len}s")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(concurrency.to_string());

    let measuring = Arc::new(AtomicBool::new(false));
    let stop = CancellationToken::new();
    let ingested = Arc::new(AtomicU64::new(0));
    let ingest = (args.ingest_rate > 0).then(|| {
        tokio::spawn(ingest_loop(
            Arc::clone(w),
            channels[0].clone(),
            args.ingest_rate,
            Arc::clone(&measuring),
            Arc::clone(&ingested),
            stop.clone(),
        ))
    });
    let flooders = flood::start(
        url,
        flood::Flood {
            streams: args.flood_streams,
            prefixes: args.flood_prefixes,
            batch: args.flood_batch,
        },
        Arc::clone(&measuring),
        Arc::clone(&ingested),
        stop.clone(),
    )
    .await?;
    let auth = match &args.token_file {
        Some(path) => {
            let token = std::fs::read_to_string(path)
                .with_context(|| format!("read --token-file {}", path.display()))?;
            Some(
                format!("Bearer {}", token.trim())
                    .parse::<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>()
                    .context("--token-file is not a printable token")?,
            )
        }
        None => None,
    };
    let mut workers = Vec::new();
    for i in 0..concurrency {
        let client = InferenceCacheClient::new(channels[i % channels.len()].clone());
        workers.push(tokio::spawn(worker(
            i as u64,
            client,
            auth.clone(),
            Arc::clone(w),
            Arc::clone(&measuring),
            stop.clone(),
        )));
    }
    let tick = Duration::from_secs(1);
    let start = Instant::now();
    while start.elapsed() < total {
        tokio::time::sleep(tick.min(total.saturating_sub(start.elapsed()))).await;
        if start.elapsed() >= args.warmup {
            measuring.store(true, Ordering::Release);
        }
        bar.set_position(start.elapsed().as_secs());
    }
    let measured = start
        .elapsed()
        .saturating_sub(args.warmup)
        .max(Duration::from_millis(1));
    stop.cancel();
    bar.finish_and_clear();

    let mut client = histogram()?;
    let mut server = histogram()?;
    let (mut calls, mut hits) = (0u64, 0u64);
    for wk in workers {
        let r = wk.await??;
        client.add(&r.client).context("merge histograms")?;
        server.add(&r.server).context("merge histograms")?;
        calls += r.calls;
        hits += r.hits;
    }
    if let Some(t) = ingest {
        t.await??;
    }
    for t in flooders {
        t.await??;
    }
    let secs = measured.as_secs_f64();
    Ok(LevelResult {
        qps: calls as f64 / secs,
        client,
        server,
        ingest_blocks_per_s: ingested.load(Ordering::Acquire) as f64 / secs,
        hit_pct: if calls == 0 {
            0.0
        } else {
            100.0 * hits as f64 / calls as f64
        },
    })
}

struct WorkerResult {
    client: Histogram<u64>,
    server: Histogram<u64>,
    calls: u64,
    hits: u64,
}

async fn worker(
    seed: u64,
    mut client: InferenceCacheClient<Channel>,
    auth: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    w: Arc<Workload>,
    measuring: Arc<AtomicBool>,
    stop: CancellationToken,
) -> anyhow::Result<WorkerResult> {
    let mut r = WorkerResult {
        client: histogram()?,
        server: histogram()?,
        calls: 0,
        hits: 0,
    };
    let mut rng = splitmix(seed + 1);
    while !stop.is_cancelled() {
        rng = splitmix(rng);
        let mut req = tonic::Request::new(w.lookup((rng % w.chains as u64) as usize));
        if let Some(h) = &auth {
            req.metadata_mut().insert("authorization", h.clone());
        }
        let t = Instant::now();
        let resp = client
            .lookup_route(req)
            .await
            .context("LookupRoute")?
            .into_inner();
        let us = u64::try_from(t.elapsed().as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        if measuring.load(Ordering::Acquire) {
            r.client.saturating_record(us);
            r.server
                .saturating_record(u64::try_from(resp.lookup_latency_us).unwrap_or(0).max(1));
            r.calls += 1;
            r.hits += u64::from(
                resp.reason_code == inferencecache_proto::Reason::PrefixMatch.as_str()
                    || !resp.token_ids.is_empty(),
            );
        }
    }
    Ok(r)
}

/// Re-reports pre-loaded chains at `rate` blocks/s on one long-lived stream,
/// paced in 10 ms slices.
async fn ingest_loop(
    w: Arc<Workload>,
    channel: Channel,
    rate: u64,
    measuring: Arc<AtomicBool>,
    ingested: Arc<AtomicU64>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let (tx, rx) = tokio::sync::mpsc::channel::<CacheStateUpdate>(1024);
    let mut client = InferenceCacheClient::new(channel);
    let call = tokio::spawn(async move {
        client
            .report_cache_state(tokio_stream_from(rx))
            .await
            .map(|_| ())
    });
    let slice = Duration::from_millis(10);
    let per_slice = (rate / 100).max(1);
    let mut next_chain = 0usize;
    let mut tick = tokio::time::interval(slice);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    'outer: while !stop.is_cancelled() {
        tick.tick().await;
        let mut sent = 0u64;
        while sent < per_slice {
            for u in w.updates_for_chain(next_chain % w.chains) {
                let blocks = u
                    .prefixes
                    .iter()
                    .map(|p| p.block_hashes.len() as u64)
                    .sum::<u64>();
                if tx.send(u).await.is_err() {
                    break 'outer;
                }
                sent += blocks;
                if measuring.load(Ordering::Acquire) {
                    ingested.fetch_add(blocks, Ordering::AcqRel);
                }
            }
            next_chain += 1;
        }
    }
    drop(tx);
    call.await?.context("ingest ReportCacheState")?;
    Ok(())
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<CacheStateUpdate>,
) -> impl futures::Stream<Item = CacheStateUpdate> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

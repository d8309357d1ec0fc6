//! `inferencecache bench visibility`: engine event → visible in LookupRoute.
//!
//! Everything runs in this process on loopback, sharing the machine's cores
//! as a sidecar deployment shares a node: a ZMQ publisher shaped like vLLM's,
//! the real sidecar (`inferencecache_subscriber::sidecar`) and the real
//! server. The publisher stores new root chains at a target rate; a sample
//! of them is polled with LookupRoute (same token_ids, every 1 ms) until it
//! answers PREFIX_MATCH for the replica. Latency = publish → first match.
//! It also prints the sidecar's memory per tracked block (RSS delta while
//! tracking a million blocks).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use inferencecache_proto::v1alpha1::LookupRouteRequest;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_server::{Server, ServerConfig};
use inferencecache_subscriber::forward::{ForwardConfig, Identity};
use inferencecache_subscriber::loopback::{LoopbackEngine, Stored, stored_batch};
use inferencecache_subscriber::mapping::MappingConfig;
use inferencecache_subscriber::sidecar::{self, SidecarConfig};
use inferencecache_subscriber::{DecodeOptions, Mapping, TransportConfig, decode_batch};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// Flags of `bench visibility`.
#[derive(Debug, Args)]
pub struct VisibilityBenchArgs {
    /// Target ingest rates in blocks per second.
    #[arg(long, value_delimiter = ',', default_value = "1000,50000")]
    rates: Vec<u64>,
    /// The sidecar's --window.
    #[arg(long, default_value = "100ms", value_parser = crate::args::parse_duration)]
    window: Duration,
    /// How long to publish at each rate.
    #[arg(long, default_value = "10s", value_parser = crate::args::parse_duration)]
    duration: Duration,
    /// Blocks per BlockStored event (16 tokens each; 4 = the 64-token floor).
    #[arg(long, default_value_t = 4)]
    blocks_per_event: u32,
    /// Events sampled per second for latency.
    #[arg(long, default_value_t = 25)]
    samples_per_second: u64,
}

const TOPIC: &str = "kv-events";
const BLOCK: u32 = 16;

/// Runs the benchmark and prints one line per rate.
pub fn run(args: VisibilityBenchArgs) -> anyhow::Result<()> {
    memory_per_block()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    println!(
        "window {:?}; {} blocks/event; {} s per rate",
        args.window,
        args.blocks_per_event,
        args.duration.as_secs_f64()
    );
    println!(
        "{:>12} {:>12} {:>8} {:>9} {:>9} {:>9} {:>7} {:>9}",
        "target b/s", "achieved", "samples", "p50 ms", "p99 ms", "max ms", "missed", "overflow"
    );
    for &rate in &args.rates {
        runtime.block_on(one_rate(&args, rate))?;
    }
    Ok(())
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// RSS growth while one rank's map tracks 1,000,000 blocks (u64 hashes).
fn memory_per_block() -> anyhow::Result<()> {
    const N: u64 = 1_000_000;
    let before = rss_bytes();
    let mut m = Mapping::new(MappingConfig {
        max_tracked_blocks: N as usize,
        ..MappingConfig::default()
    });
    let mut out = Vec::new();
    for i in 0..N / 64 {
        let events: Vec<Stored> = (0..16u64)
            .map(|e| {
                let base = i * 64 + e * 4;
                Stored {
                    hashes: (base..base + 4).map(|h| u64::MAX - h).collect(),
                    parent: None,
                    tokens: (base as u32 * BLOCK)..((base as u32 + 4) * BLOCK),
                }
            })
            .collect();
        let batch = decode_batch(&stored_batch(1.0, &events, BLOCK));
        out.clear();
        m.apply_all(&batch.events, &mut out);
    }
    let after = rss_bytes();
    anyhow::ensure!(m.tracked_blocks() == N as usize, "map did not fill");
    println!(
        "memory per tracked block: {} bytes (RSS +{:.1} MiB for {} blocks)",
        after.saturating_sub(before) / N,
        after.saturating_sub(before) as f64 / 1048576.0,
        N
    );
    Ok(())
}

async fn one_rate(args: &VisibilityBenchArgs, rate: u64) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let server = Server::bind(&ServerConfig::ephemeral())
        .await
        .context("bind the server")?;
    let grpc = server.grpc_addr();
    let server_task = tokio::spawn(server.serve(cancel.clone()));
    let mut engine = LoopbackEngine::bind(TOPIC).await?;
    let config = SidecarConfig {
        transport: TransportConfig {
            engine_endpoint: engine.endpoint.clone(),
            replay_endpoint: None,
            topic: TOPIC.into(),
            ..TransportConfig::default()
        },
        first_rank: 0,
        ranks: 1,
        // No overflow evictions during the run: this measures the add path.
        mapping: MappingConfig {
            max_tracked_blocks: 4_000_000,
            ..MappingConfig::default()
        },
        decode: DecodeOptions::default(),
        forward: ForwardConfig {
            server: grpc.to_string(),
            identity: Identity {
                replica_id: "bench".into(),
                model_id: "m".into(),
                tenant_id: "t".into(),
                hash_scheme: "vllm".into(),
            },
            window: args.window,
            ..ForwardConfig::default()
        },
        stats: None,
        http_bind: None,
    };
    let running = sidecar::start(config, cancel.clone()).await?;
    let metrics = Arc::clone(&running.metrics);
    let ready = Instant::now();
    while !metrics.server_up() {
        anyhow::ensure!(
            ready.elapsed() < Duration::from_secs(10),
            "sidecar never connected"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // slow joiner: the SUB subscription must reach the PUB first
    tokio::time::sleep(Duration::from_millis(500)).await;

    let client = InferenceCacheClient::connect(format!("http://{grpc}")).await?;
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let missed = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let bpe = u64::from(args.blocks_per_event.max(1));
    let events_per_s = (rate / bpe).max(1);
    let sample_every = (events_per_s / args.samples_per_second.max(1)).max(1);
    let tick = Duration::from_millis(5);
    let start = Instant::now();
    let mut sent_events = 0u64;
    let mut samplers = tokio::task::JoinSet::new();
    while start.elapsed() < args.duration {
        let due = (start.elapsed().as_secs_f64() * events_per_s as f64) as u64;
        let mut events = Vec::new();
        let mut sample = None;
        while sent_events < due {
            let base = sent_events * bpe;
            let first_token = (base as u32).wrapping_mul(BLOCK);
            let tokens = first_token..first_token + bpe as u32 * BLOCK;
            if sent_events % sample_every == 0 {
                sample = Some(tokens.clone());
            }
            events.push(Stored {
                hashes: (base..base + bpe).map(|h| u64::MAX - h).collect(),
                parent: None,
                tokens,
            });
            sent_events += 1;
        }
        if !events.is_empty() {
            engine.publish(stored_batch(0.0, &events, BLOCK)).await?;
            let published = Instant::now();
            if let Some(tokens) = sample {
                let (mut c, h, m) = (client.clone(), Arc::clone(&hist), Arc::clone(&missed));
                samplers.spawn(async move {
                    let req = LookupRouteRequest {
                        model_id: "m".into(),
                        tenant_id: "t".into(),
                        hash_scheme: "vllm".into(),
                        token_ids: tokens.collect(),
                        ..Default::default()
                    };
                    while published.elapsed() < Duration::from_secs(5) {
                        if let Ok(r) = c.lookup_route(req.clone()).await {
                            let r = r.into_inner();
                            if r.reason_code == "PREFIX_MATCH" {
                                let us = published.elapsed().as_micros() as u64;
                                let _ = h.lock().await.record(us.max(1));
                                return;
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    m.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                });
            }
        }
        tokio::time::sleep(tick).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    while samplers.join_next().await.is_some() {}
    let text = metrics.encode();
    let overflow: f64 = text
        .lines()
        .filter(|l| l.starts_with("inferencecache_subscriber_send_overflow_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    let h = hist.lock().await;
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{:>12} {:>12.0} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>7} {:>9}",
        rate,
        (sent_events * bpe) as f64 / elapsed,
        h.len(),
        ms(0.5),
        ms(0.99),
        h.max() as f64 / 1000.0,
        missed.load(std::sync::atomic::Ordering::Relaxed),
        overflow
    );
    cancel.cancel();
    running.wait().await?;
    let _ = server_task.await;
    Ok(())
}

//! `inferencecache-bench replicate`: the figures of active-active replicas
//! and warm restarts.
//!
//! - `snapshot`: for each entry count, encode the index, write and read the
//!   file, decode it into an empty index (the warm restart's load), and check
//!   the restored index answers like the original. Prints bytes/entry, encode
//!   and load time, replay rate from a snapshot.
//! - `bus`: against a real nats-server (`--nats-url`), publish block reports
//!   at a target rate through the producer while one consumer applies them
//!   to an index; prints the convergence lag (publish → applied) p50/p99,
//!   then replays the whole stream into a fresh index (replay rate from the
//!   stream).
//! - `load`: the shared load of bus mode (`load.rs`): lag from a delivery on
//!   one server core to its apply on another, flushes per second, and the
//!   lookup path's cost with sharing on and off.

mod load;

use anyhow::Context;
use clap::{Args, Subcommand};
use hdrhistogram::Histogram;
use inferencecache_bus::{
    Applied, Bus, BusConfig, BusMessage, ConsumerStatus, Producer, ProducerLimits, run_consumer,
};
use inferencecache_index::persist::{SnapshotMeta, decode_into, encode_index};
use inferencecache_index::{
    CacheUpdate, Clock, Index, IndexConfig, LookupRequest, PrefixEntry, SystemClock, Tier,
};
use inferencecache_proto::v1alpha1 as pb;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Flags of `inferencecache-bench replicate`.
#[derive(Debug, Args)]
pub(super) struct ReplicateBenchArgs {
    #[command(subcommand)]
    what: What,
}

#[derive(Debug, Subcommand)]
enum What {
    /// Snapshot size, encode time and warm-restart load time per entry count.
    ///
    /// Example: `inferencecache-bench replicate snapshot --entries 100000,1000000,5000000`
    Snapshot(SnapshotArgs),
    /// Convergence lag at a block rate, and replay rate from the stream,
    /// against a real nats-server.
    ///
    /// Example: `inferencecache-bench replicate bus --nats-url nats://127.0.0.1:4299 --rate 100000`
    Bus(BusArgs),
    /// Shared load: delivery lag between two server cores over a real
    /// nats-server, and the lookup path's cost with sharing on and off.
    ///
    /// Example: `inferencecache-bench replicate load --nats-url nats://127.0.0.1:4299 --rate 20000`
    Load(load::LoadArgs),
}

#[derive(Debug, Args)]
struct SnapshotArgs {
    /// Entry counts ((prefix, replica) pairs).
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000,5000000")]
    entries: Vec<usize>,
    /// Where the snapshot file is written.
    #[arg(long, default_value = "/tmp/inferencecache-bench.snapshot")]
    file: std::path::PathBuf,
}

#[derive(Debug, Args)]
struct BusArgs {
    /// nats-server with JetStream.
    #[arg(long)]
    nats_url: String,
    /// Blocks per second published.
    #[arg(long, default_value_t = 100_000)]
    rate: u64,
    /// Blocks per message (a sidecar's window batch).
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// Measured time.
    #[arg(long, default_value = "10s", value_parser = crate::args::parse_duration)]
    duration: Duration,
    /// Stream name (deleted and recreated: use a scratch name).
    #[arg(long, default_value = "BENCH_REPLICATE")]
    stream: String,
}

/// Runs `inferencecache-bench replicate ...`.
pub(super) fn run(args: ReplicateBenchArgs) -> anyhow::Result<()> {
    match args.what {
        What::Snapshot(a) => snapshot(&a),
        What::Bus(a) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("start the async runtime")?
            .block_on(bus(a)),
        What::Load(a) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .context("start the async runtime")?
            .block_on(load::run(a)),
    }
}

const REPLICAS: usize = 8;
const CHAIN: usize = 32;

fn key(chain: usize, i: usize) -> Vec<u8> {
    ((chain as u64) << 16 | i as u64)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .to_be_bytes()
        .to_vec()
}

/// An index of about `entries` entries: chains of 32 blocks, each chain
/// held by 2 of 8 replicas, tiers and ages varied.
fn build(entries: usize) -> Index {
    let idx = IndexConfig::new().max_entries(0).build();
    let now_us = SystemClock.now_ns() / 1_000;
    let chains = entries / (CHAIN * 2) + 1;
    for c in 0..chains {
        for h in 0..2 {
            idx.ingest(&CacheUpdate {
                replica_id: format!("replica-{}", (c + h * 3) % REPLICAS),
                model_id: "model".into(),
                tenant_id: format!("tenant-{}", c % 4),
                hash_scheme: "vllm".into(),
                timestamp_us: now_us - (c % 600) as i64 * 1_000_000,
                prefixes: vec![PrefixEntry {
                    block_hashes: (0..CHAIN).map(|i| key(c, i)).collect(),
                    block_token_counts: vec![16; CHAIN],
                    tier: Tier::from_wire(1 + (c % 2) as i32),
                    ..PrefixEntry::default()
                }],
                ..CacheUpdate::default()
            });
        }
    }
    idx
}

fn snapshot(a: &SnapshotArgs) -> anyhow::Result<()> {
    println!(
        "entries\tbytes/entry\tencode_ms\twrite_ms\tload_ms (read+decode)\treplay entries/s\tbaseline: ingest entries/s\tidentical"
    );
    for &n in &a.entries {
        let t = Instant::now();
        let idx = build(n);
        let built = t.elapsed();
        let entries = idx.total_entries();
        let meta = SnapshotMeta {
            created_ns: SystemClock.now_ns(),
            last_sequence: 1,
            stream: "bench".into(),
            policy_json: Vec::new(),
        };
        let t = Instant::now();
        let bytes = encode_index(&idx, &meta);
        let encode = t.elapsed();
        let t = Instant::now();
        std::fs::write(&a.file, &bytes).context("write snapshot")?;
        let write = t.elapsed();
        drop(bytes);
        let t = Instant::now();
        let read = std::fs::read(&a.file).context("read snapshot")?;
        let fresh = IndexConfig::new().max_entries(0).build();
        let (_, out) = decode_into(&read, &fresh).context("decode")?;
        let load = t.elapsed();
        let same = (0..1000).all(|c| {
            let hashes: Vec<Vec<u8>> = (0..CHAIN).map(|i| key(c, i)).collect();
            let counts = vec![16; CHAIN];
            let tenant = format!("tenant-{}", c % 4);
            let req = LookupRequest::new(&tenant, "model", "vllm").chain(&hashes, &counts);
            let (x, y) = (idx.lookup(&req), fresh.lookup(&req));
            x.strategy == y.strategy
                && x.scores
                    .iter()
                    .map(|s| (&s.replica_id, s.matched_tokens))
                    .eq(y.scores.iter().map(|s| (&s.replica_id, s.matched_tokens)))
        });
        println!(
            "{entries}\t{:.1}\t{}\t{}\t{}\t{:.0}\t{:.0}\t{same}",
            read.len() as f64 / entries as f64,
            encode.as_millis(),
            write.as_millis(),
            load.as_millis(),
            out.entries as f64 / load.as_secs_f64(),
            entries as f64 / built.as_secs_f64(),
        );
        let _ = std::fs::remove_file(&a.file);
    }
    Ok(())
}

fn now_us() -> i64 {
    SystemClock.now_ns() / 1_000
}

async fn bus(a: BusArgs) -> anyhow::Result<()> {
    let mut cfg = BusConfig::new(a.nats_url.clone());
    cfg.stream = a.stream.clone();
    cfg.subject_prefix = format!("bench.{}", a.stream.to_lowercase());
    let b = Bus::connect(cfg).await.context("connect")?;
    b.wait_connected().await;
    let _ = b.js.delete_stream(&a.stream).await;
    b.stream().await.context("create stream")?;

    // Consumer: apply into an index; lag = applied - published (the
    // message's timestamp carries the publish time).
    let idx = Arc::new(IndexConfig::new().max_entries(0).build());
    let lag = Arc::new(Mutex::new(Histogram::<u64>::new(3).context("histogram")?));
    let status = Arc::new(ConsumerStatus::default());
    let stop = CancellationToken::new();
    {
        let (idx, lag, b, status, stop) = (
            Arc::clone(&idx),
            Arc::clone(&lag),
            b.clone(),
            Arc::clone(&status),
            stop.clone(),
        );
        tokio::spawn(run_consumer(
            b,
            status,
            move |d| {
                if let BusMessage::Update(u) = d.message {
                    let sent = u.timestamp_us;
                    idx.ingest(&update(u));
                    let us = (now_us() - sent).max(0) as u64;
                    if let Ok(mut h) = lag.lock() {
                        let _ = h.record(us);
                    }
                }
                Applied::Ok
            },
            stop,
        ));
    }
    let producer = Producer::start(b.clone(), ProducerLimits::default(), stop.clone());
    let msgs_per_s = (a.rate as f64 / a.batch as f64).max(1.0);
    let period = Duration::from_secs_f64(1.0 / msgs_per_s);
    let start = Instant::now();
    let mut sent = 0u64;
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while start.elapsed() < a.duration {
        tick.tick().await;
        let m = BusMessage::Update(pb::CacheStateUpdate {
            replica_id: format!("replica-{}", sent % REPLICAS as u64),
            model_id: "model".into(),
            tenant_id: "tenant".into(),
            hash_scheme: "vllm".into(),
            timestamp_us: now_us(),
            prefixes: vec![pb::PrefixEntry {
                block_hashes: (0..a.batch).map(|i| key(sent as usize, i)).collect(),
                block_token_counts: vec![16; a.batch],
                ..Default::default()
            }],
            ..Default::default()
        });
        producer.send(m).await;
        sent += 1;
    }
    let published_in = start.elapsed();
    while status.applied.load(Ordering::SeqCst) < sent {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let h = lag
        .lock()
        .map_err(|_| anyhow::anyhow!("lag histogram poisoned"))?
        .clone();
    println!(
        "published {sent} messages ({} blocks) in {:.1}s = {:.0} blocks/s; lag publish->applied p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        sent * a.batch as u64,
        published_in.as_secs_f64(),
        (sent * a.batch as u64) as f64 / published_in.as_secs_f64(),
        h.value_at_quantile(0.5) as f64 / 1e3,
        h.value_at_quantile(0.99) as f64 / 1e3,
        h.max() as f64 / 1e3,
    );

    // Replay: a fresh index consumes the whole stream.
    let fresh = Arc::new(IndexConfig::new().max_entries(0).build());
    let status2 = Arc::new(ConsumerStatus::default());
    let t = Instant::now();
    {
        let (fresh, status2, b, stop) = (
            Arc::clone(&fresh),
            Arc::clone(&status2),
            b.clone(),
            stop.clone(),
        );
        tokio::spawn(run_consumer(
            b,
            status2,
            move |d| {
                if let BusMessage::Update(u) = d.message {
                    fresh.ingest(&update(u));
                }
                Applied::Ok
            },
            stop,
        ));
    }
    while status2.applied.load(Ordering::SeqCst) < sent {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = t.elapsed();
    println!(
        "replayed {sent} messages ({} entries) from the stream in {:.2}s = {:.0} entries/s",
        fresh.total_entries(),
        took.as_secs_f64(),
        fresh.total_entries() as f64 / took.as_secs_f64()
    );
    stop.cancel();
    let _ = b.js.delete_stream(&a.stream).await;
    Ok(())
}

fn update(u: pb::CacheStateUpdate) -> CacheUpdate {
    inferencecache_server::convert::update_from_proto(u)
}

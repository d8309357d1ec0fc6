//! `inferencecache-bench replicate load`: the shared-load figures of bus
//! mode (issue 36, item 4) against a real nats-server.
//!
//! Two in-process server cores hold the same fleet (`--replicas` engines,
//! each live with a prefix of its own). Lookups run through core A's real
//! LookupRoute pipeline at `--rate` (cold prompts: every answer is an
//! AFFINITY_HINT, i.e. a delivery), A's delivery log is published by the
//! server's own publisher (`load_share::publish_loop`), and core B applies
//! what arrives with the server's own `apply_batch`. Printed: batches and
//! hints published / applied / dropped, and the lag from a delivery on A to
//! its apply on B (for the first and the last delivery of each batch entry),
//! then the lookup path's cost with sharing on against the same core with
//! it off (the baseline, alternated in the same run).

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use hdrhistogram::Histogram;
use inferencecache_bus::{Bus, BusConfig, DeliveryBatch};
use inferencecache_proto::v1alpha1 as pb;
use inferencecache_server::core::Core;
use inferencecache_server::replicate::load_share::{self, LoadShareMetrics, ReportTimes};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Args)]
pub(super) struct LoadArgs {
    /// nats-server (core NATS is enough; JetStream is not used).
    #[arg(long)]
    nats_url: String,
    /// Lookups per second through core A (each one delivers a hint).
    #[arg(long, default_value_t = 20_000)]
    rate: u64,
    /// Measured time.
    #[arg(long, default_value = "10s", value_parser = crate::args::parse_duration)]
    duration: Duration,
    /// `--bus-load-interval` of core A's publisher.
    #[arg(long, default_value = "10ms", value_parser = crate::args::parse_duration)]
    interval: Duration,
    /// Engine replicas in the fleet.
    #[arg(long, default_value_t = 16)]
    replicas: usize,
    /// Lookups per side of the lookup-cost comparison (sharing on / off).
    #[arg(long, default_value_t = 20_000)]
    cost_lookups: usize,
}

fn core(replicas: usize) -> Core {
    let core = Core::with_defaults();
    for r in 0..replicas {
        core.ingest(&inferencecache_server::convert::update_from_proto(
            pb::CacheStateUpdate {
                replica_id: format!("engine-{r}"),
                tenant_id: "t".into(),
                model_id: "m".into(),
                hash_scheme: "vllm".into(),
                prefixes: vec![pb::PrefixEntry {
                    block_hashes: vec![block(1_000_000 + r as u64, 0)],
                    block_token_counts: vec![16],
                    tier: 1,
                    ..Default::default()
                }],
                stats: Some(pb::ReplicaStats {
                    replica_id: format!("engine-{r}"),
                    cache_memory_bytes: 1 << 30,
                    ..Default::default()
                }),
                ..Default::default()
            },
        ));
    }
    core
}

fn block(family: u64, i: u64) -> Vec<u8> {
    (family << 8 | i)
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .to_be_bytes()
        .to_vec()
}

/// A cold 8-block prompt of family `n`.
fn request(n: u64) -> pb::LookupRouteRequest {
    pb::LookupRouteRequest {
        tenant_id: "t".into(),
        model_id: "m".into(),
        hash_scheme: "vllm".into(),
        block_hashes: (0..8).map(|i| block(n, i).into()).collect(),
        block_token_counts: vec![16; 8],
        ..Default::default()
    }
}

fn now_ns() -> i64 {
    use inferencecache_index::Clock;
    inferencecache_index::SystemClock.now_ns()
}

#[derive(Default)]
struct Lags {
    first: Option<Histogram<u64>>,
    last: Option<Histogram<u64>>,
    batches: u64,
}

/// Runs the rig.
pub(super) async fn run(a: LoadArgs) -> anyhow::Result<()> {
    let mut cfg = BusConfig::new(a.nats_url.clone());
    cfg.subject_prefix = format!("bench.load{}", std::process::id());
    let bus = Bus::connect(cfg).await.context("connect")?;
    tokio::time::timeout(Duration::from_secs(10), bus.wait_connected())
        .await
        .context("nats-server did not answer within 10 s")?;
    let (ca, cb) = (core(a.replicas), core(a.replicas));
    ca.pipeline.deliveries().enable();
    let stop = CancellationToken::new();
    let (ma, mb) = (
        Arc::new(LoadShareMetrics::default()),
        Arc::new(LoadShareMetrics::default()),
    );
    tokio::spawn(load_share::publish_loop(
        bus.clone(),
        ca.pipeline.deliveries().clone(),
        "bench-a/1".into(),
        a.interval,
        Arc::clone(&ma),
        stop.clone(),
    ));
    // B: the server's apply, with the lag recorded per batch entry.
    let lags = Arc::new(Mutex::new(Lags {
        first: Some(Histogram::new(3)?),
        last: Some(Histogram::new(3)?),
        batches: 0,
    }));
    let mut sub = bus
        .client
        .subscribe(bus.config.load_subject())
        .await
        .context("subscribe")?;
    bus.client.flush().await.context("flush")?;
    {
        let (cb, mb, lags, stop) = (cb.clone(), Arc::clone(&mb), Arc::clone(&lags), stop.clone());
        tokio::spawn(async move {
            let reports = ReportTimes::default();
            loop {
                let m = tokio::select! {
                    () = stop.cancelled() => return,
                    m = sub.next() => m,
                };
                let Some(m) = m else { return };
                let Some(batch) = DeliveryBatch::decode_body(&m.payload) else {
                    continue;
                };
                let now = now_ns();
                load_share::apply_batch(&cb, "bench-b/2", &reports, &mb, &batch, now);
                if let Ok(mut l) = lags.lock() {
                    l.batches += 1;
                    for e in &batch.replicas {
                        let us = |t: i64| ((now - t).max(0) / 1_000) as u64;
                        if let Some(h) = l.first.as_mut() {
                            let _ = h.record(us(e.first_unix_ns));
                        }
                        if let Some(h) = l.last.as_mut() {
                            let _ = h.record(us(e.last_unix_ns));
                        }
                    }
                }
            }
        });
    }

    // Paced lookups through A: one tick per ms.
    let per_tick = (a.rate / 1_000).max(1);
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let start = Instant::now();
    let mut n = 0u64;
    let mut running = Vec::new();
    while start.elapsed() < a.duration {
        tick.tick().await;
        let first = n;
        n += per_tick;
        let c = ca.clone();
        running.push(tokio::spawn(async move {
            for i in first..first + per_tick {
                let resp =
                    inferencecache_server::convert::lookup_route(&c.pipeline, &request(i), None)
                        .await;
                if resp.reason_code != "AFFINITY_HINT" {
                    return Err(anyhow::anyhow!("{resp:?}"));
                }
            }
            Ok(())
        }));
        if running.len() > 64 {
            for t in running.drain(..) {
                t.await??;
            }
        }
    }
    for t in running {
        t.await??;
    }
    let took = start.elapsed();
    let settle = Instant::now();
    while mb.hints_applied.get() + mb.skipped_total() < n
        && settle.elapsed() < Duration::from_secs(5)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    {
        let l = lags
            .lock()
            .map_err(|_| anyhow::anyhow!("lag histograms poisoned"))?;
        let q = |h: &Option<Histogram<u64>>, p: f64| {
            h.as_ref()
                .map_or(f64::NAN, |h| h.value_at_quantile(p) as f64 / 1e3)
        };
        println!(
            "lookups through A: {n} in {:.1} s = {:.0}/s, each an AFFINITY_HINT delivery",
            took.as_secs_f64(),
            n as f64 / took.as_secs_f64()
        );
        println!(
            "published by A: {} flushes ({:.0}/s), {} hints; dropped: {} flushes, {} hints",
            ma.batches_published.get(),
            ma.batches_published.get() as f64 / took.as_secs_f64(),
            ma.hints_published.get(),
            ma.batches_dropped.get(),
            ma.hints_dropped.get()
        );
        println!(
            "applied by B: {} hints in {} messages; skipped {}",
            mb.hints_applied.get(),
            l.batches,
            mb.skipped_total()
        );
        println!(
            "lag delivery on A -> applied on B, first delivery of an entry: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; last delivery: p50 {:.2} ms, p99 {:.2} ms",
            q(&l.first, 0.5),
            q(&l.first, 0.99),
            l.first.as_ref().map_or(f64::NAN, |h| h.max() as f64 / 1e3),
            q(&l.last, 0.5),
            q(&l.last, 0.99),
        );
    }
    stop.cancel();

    // The lookup path's cost: two fresh cores holding the same fleet, one
    // with sharing on (its log published every interval), one off,
    // alternated; the same prompts on both.
    let stop2 = CancellationToken::new();
    for round in 0..3 {
        let (on, off) = (core(a.replicas), core(a.replicas));
        on.pipeline.deliveries().enable();
        tokio::spawn(load_share::publish_loop(
            bus.clone(),
            on.pipeline.deliveries().clone(),
            format!("bench-cost/{round}"),
            a.interval,
            Arc::new(LoadShareMetrics::default()),
            stop2.clone(),
        ));
        for (name, c) in [("sharing on", &on), ("sharing off", &off)] {
            let t = Instant::now();
            for i in 0..a.cost_lookups {
                let r = request(10_000_000 + (round * a.cost_lookups + i) as u64);
                let _ = inferencecache_server::convert::lookup_route(&c.pipeline, &r, None).await;
            }
            let ns = t.elapsed().as_nanos() as f64 / a.cost_lookups as f64;
            println!("round {round}: LookupRoute through the pipeline, {name}: {ns:.0} ns/lookup");
        }
    }
    stop2.cancel();
    Ok(())
}

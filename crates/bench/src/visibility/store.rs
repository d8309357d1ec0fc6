//! `--mode store`: the publisher only stores new root chains; a sample of
//! them is polled until LookupRoute answers PREFIX_MATCH.

use std::time::Instant;

use inferencecache_subscriber::loopback::{Stored, stored_batch};

use super::probe::{Latencies, poll_until, request};
use super::rig::Rig;
use super::{BLOCK, TICK, VisibilityBenchArgs, chain};

pub(super) fn header() {
    println!(
        "{:>12} {:>12} {:>8} {:>9} {:>9} {:>9} {:>7} {:>9}",
        "target b/s", "achieved", "samples", "p50 ms", "p99 ms", "max ms", "missed", "overflow"
    );
}

pub(super) async fn one_rate(args: &VisibilityBenchArgs, rate: u64) -> anyhow::Result<()> {
    let mut rig = Rig::start(args).await?;
    let visible = Latencies::new()?;
    let bpe = u64::from(args.blocks_per_event.max(1));
    let events_per_s = (rate / bpe).max(1);
    let sample_every = (events_per_s / args.samples_per_second.max(1)).max(1);
    let start = Instant::now();
    let mut sent_events = 0u64;
    let mut samplers = tokio::task::JoinSet::new();
    while start.elapsed() < args.duration {
        let due = (start.elapsed().as_secs_f64() * events_per_s as f64) as u64;
        let mut events = Vec::new();
        let mut sample = None;
        while sent_events < due {
            let ev: Stored = chain(sent_events, bpe);
            if sent_events % sample_every == 0 {
                sample = Some(ev.tokens.clone());
            }
            events.push(ev);
            sent_events += 1;
        }
        if !events.is_empty() {
            rig.engine
                .publish(stored_batch(0.0, &events, BLOCK))
                .await?;
            let published = Instant::now();
            if let Some(tokens) = sample {
                let (mut c, v) = (rig.client.clone(), visible.clone());
                samplers.spawn(async move {
                    let req = request(tokens);
                    let seen = poll_until(&mut c, &req, published, |r| {
                        r.reason_code == inferencecache_proto::Reason::PrefixMatch.as_str()
                    })
                    .await;
                    v.add(seen);
                });
            }
        }
        tokio::time::sleep(TICK).await;
    }
    let elapsed = start.elapsed().as_secs_f64();
    while samplers.join_next().await.is_some() {}
    let overflow = rig.counter("inferencecache_subscriber_send_overflow_total");
    let s = visible.summary();
    println!(
        "{:>12} {:>12.0} {:>8} {:>9.1} {:>9.1} {:>9.1} {:>7} {:>9}",
        rate,
        (sent_events * bpe) as f64 / elapsed,
        s.samples,
        s.p50,
        s.p99,
        s.max,
        s.missed,
        overflow
    );
    rig.stop().await?;
    Ok(())
}

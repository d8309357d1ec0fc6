//! `--mode churn`: a full engine cache's steady state. Each chain is removed
//! from the GPU (one `BlockRemoved` per block, tail first) `--evict-after`
//! after it was stored, so once that much time has passed evictions run at
//! the store rate. Only then does measuring start: store → visible under
//! churn, and evict → gone (LookupRoute no longer matches the whole chain
//! on the sidecar's replica; with the default 64-token floor that is also
//! "no PREFIX_MATCH"), sampled on the same chains.

use std::collections::HashMap;
use std::ops::Range;
use std::time::Instant;

use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_subscriber::loopback::churn_batch;
use tokio::sync::oneshot;
use tonic::transport::Channel;

use super::probe::{Latencies, Summary, full_match, poll_until, request};
use super::rig::Rig;
use super::{BLOCK, TICK, VisibilityBenchArgs, chain};

const SENT_EVICTIONS: &str = "inferencecache_subscriber_sent_total{rpc=\"PublishEvent\"}";

pub(super) fn header() {
    println!(
        "{:42}{:^33}  {:^33}",
        "", "store → visible (ms)", "evict → gone (ms)"
    );
    println!(
        "{:>10} {:>9} {:>9} {:>10} {}  {} {:>10} {:>10} {:>8} {:>5}",
        "target b/s",
        "stored/s",
        "removed/s",
        "sent ev/s",
        SERIES,
        SERIES,
        "evictions",
        "superseded",
        "overflow",
        "lost"
    );
}

const SERIES: &str = "samples    p50    p99    max miss";

fn series(s: &Summary) -> String {
    format!(
        "{:>7} {:>6.1} {:>6.1} {:>6.1} {:>4}",
        s.samples, s.p50, s.p99, s.max, s.missed
    )
}

/// Chains are numbered in store order; `c` covers blocks `c*bpe..`.
pub(super) async fn one_rate(args: &VisibilityBenchArgs, rate: u64) -> anyhow::Result<()> {
    let mut rig = Rig::start(args).await?;
    let (visible, gone) = (Latencies::new()?, Latencies::new()?);
    let bpe = u64::from(args.blocks_per_event.max(1));
    let events_per_s = (rate / bpe).max(1);
    let sample_every = (events_per_s / args.samples_per_second.max(1)).max(1);
    let resident = (args.evict_after.as_secs_f64() * events_per_s as f64) as u64;
    let fill = args.evict_after;
    // Sampled chains not removed yet: where to send their removal time.
    let mut waiting: HashMap<u64, oneshot::Sender<Instant>> = HashMap::new();
    let mut samplers = tokio::task::JoinSet::new();
    let (mut stored, mut removed) = (0u64, 0u64);
    let mut at_fill = None;
    let start = Instant::now();
    while start.elapsed() < fill + args.duration {
        let now = start.elapsed();
        let due = (now.as_secs_f64() * events_per_s as f64) as u64;
        let measuring = now >= fill;
        if measuring && at_fill.is_none() {
            at_fill = Some((Instant::now(), stored, removed, rig.counter(SENT_EVICTIONS)));
        }
        let mut gone_hashes = Vec::new();
        let first_removed = removed;
        while removed + resident < due {
            let c = chain(removed, bpe);
            gone_hashes.extend(c.hashes.iter().rev());
            removed += 1;
        }
        let new: Vec<_> = (stored..due).map(|c| chain(c, bpe)).collect();
        let first_stored = stored;
        stored = stored.max(due);
        if new.is_empty() && gone_hashes.is_empty() {
            tokio::time::sleep(TICK).await;
            continue;
        }
        rig.engine
            .publish(churn_batch(0.0, &gone_hashes, &new, BLOCK))
            .await?;
        let published = Instant::now();
        for c in first_removed..removed {
            if let Some(tx) = waiting.remove(&c) {
                let _ = tx.send(published);
            }
        }
        for (c, ev) in (first_stored..).zip(&new) {
            if c % sample_every != 0 {
                continue;
            }
            let (tx, rx) = oneshot::channel();
            waiting.insert(c, tx);
            samplers.spawn(sample(
                rig.client.clone(),
                ev.tokens.clone(),
                published,
                rx,
                measuring.then(|| visible.clone()),
                gone.clone(),
            ));
        }
        tokio::time::sleep(TICK).await;
    }
    let end = (Instant::now(), stored, removed, rig.counter(SENT_EVICTIONS));
    // Chains stored last are never removed: their samplers end here.
    waiting.clear();
    while samplers.join_next().await.is_some() {}
    let (t0, s0, r0, e0) = at_fill.unwrap_or(end);
    let secs = end.0.duration_since(t0).as_secs_f64().max(1e-9);
    let per_s = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs;
    println!(
        "{:>10} {:>9.0} {:>9.0} {:>10.0} {}  {} {:>10} {:>10} {:>8} {:>5}",
        rate,
        per_s(end.1, s0) * bpe as f64,
        per_s(end.2, r0) * bpe as f64,
        per_s(end.3, e0),
        series(&visible.summary()),
        series(&gone.summary()),
        rig.counter(SENT_EVICTIONS),
        rig.counter("inferencecache_subscriber_evictions_superseded_total"),
        rig.counter("inferencecache_subscriber_send_overflow_total"),
        rig.counter("inferencecache_subscriber_lost_messages_total"),
    );
    rig.stop().await?;
    Ok(())
}

/// One sampled chain: store → visible (recorded into `store` when given),
/// then, once `removed` says when its removal was published, removal → gone.
async fn sample(
    mut client: InferenceCacheClient<Channel>,
    tokens: Range<u32>,
    published: Instant,
    removed: oneshot::Receiver<Instant>,
    store: Option<Latencies>,
    gone: Latencies,
) {
    let (req, n) = (request(tokens.clone()), tokens.len());
    let seen = poll_until(&mut client, &req, published, |r| full_match(r, n)).await;
    if let Some(store) = store {
        store.add(seen);
    }
    // A chain never seen cannot be seen to go.
    if seen.is_none() {
        return;
    }
    let Ok(removed_at) = removed.await else {
        return;
    };
    gone.add(poll_until(&mut client, &req, removed_at, |r| !full_match(r, n)).await);
}

//! One load view across server replicas: each replica publishes the hints it
//! delivered, coalesced per `--bus-load-interval`, on the bus's load subject
//! (`inferencecache_bus::load`), and applies the other replicas' batches to
//! its index, so every replica's queue and bounded-load count are the
//! fleet's. Replicas' answers then converge within the bus lag instead of
//! each one seeing 1/N of the load.
//!
//! - **Publisher.** Sleeps until the lookup path records a delivery
//!   (`delivery_log.rs`), publishes at once (an idle fleet's first hint is not
//!   held back), then waits out the interval, so a busy replica sends at most
//!   one batch per interval whatever its lookup rate. While the bus is down a
//!   batch is dropped and counted: stale load is worse than none.
//! - **Applier.** Skips its own batches (the origin is unique per process),
//!   skips an engine replica's deliveries made before that engine's last load
//!   report this replica applied (the report's counts include them, exactly
//!   as the report drops local hints delivered before it), and queues the
//!   rest with the work that has not drained since they were delivered.
//!   Deliveries older than [`MAX_AGE`] are skipped as stale.

use crate::core::Core;
use crate::delivery_log::{DeliveryLog, DeliveryMap};
use crate::metrics::ReasonLabel;
use futures::StreamExt;
use inferencecache_bus::load::{
    CallerLoadBatch, KIND_CALLER_LOAD, KIND_DELIVERIES, MAX_REPLICAS_PER_MESSAGE,
};
use inferencecache_bus::{Bus, DeliveryBatch, ReplicaDeliveries};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Default `--bus-load-interval`.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(10);
/// Deliveries older than this when they arrive are not applied: the bus was
/// partitioned or the batch sat in a buffer, and the load it describes has
/// been counted by the engines' reports since (they come every second).
pub const MAX_AGE: Duration = Duration::from_secs(2);
/// Engine replicas whose last load report time is remembered at most; past
/// it the table starts over (a missing entry only means the report check is
/// skipped for that replica until its next report).
const MAX_REPORTS: usize = 65_536;

/// Why a remote delivery was not applied (metric label).
const SKIP_REASONS: [&str; 6] = [
    "own",
    "reported",
    "stale",
    "unknown_replica",
    "garbage",
    "caller_unapplied",
];

/// Load-sharing metrics (registered into the server's registry).
#[derive(Debug)]
pub struct LoadShareMetrics {
    /// Batches published.
    pub batches_published: Counter,
    /// Batches dropped (bus down, publish failed or timed out).
    pub batches_dropped: Counter,
    /// Hints published (in batches).
    pub hints_published: Counter,
    /// Hints dropped with their batch.
    pub hints_dropped: Counter,
    /// Other replicas' hints applied to this index.
    pub hints_applied: Counter,
    /// Callers' in-flight reports received here, published for the others.
    pub caller_loads_published: Counter,
    /// Callers' in-flight reports other replicas received, applied here.
    pub caller_loads_applied: Counter,
    /// Hints (for `garbage`: messages) not applied, by reason.
    pub skipped: Family<ReasonLabel, Counter>,
    /// From a remote delivery (the batch's first, per replica) to its apply
    /// here: coalescing + bus latency.
    pub lag_seconds: Histogram,
}

impl Default for LoadShareMetrics {
    fn default() -> Self {
        Self {
            batches_published: Counter::default(),
            batches_dropped: Counter::default(),
            hints_published: Counter::default(),
            hints_dropped: Counter::default(),
            hints_applied: Counter::default(),
            caller_loads_published: Counter::default(),
            caller_loads_applied: Counter::default(),
            skipped: Family::default(),
            lag_seconds: Histogram::new([
                0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0,
            ]),
        }
    }
}

impl LoadShareMetrics {
    /// Registers every series.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "inferencecache_bus_load_batches_published",
            "Batches of this replica's delivered hints published on the bus's load subject",
            m.batches_published.clone(),
        );
        registry.register(
            "inferencecache_bus_load_batches_dropped",
            "Batches of delivered hints dropped: bus down, publish failed or timed out",
            m.batches_dropped.clone(),
        );
        registry.register(
            "inferencecache_bus_load_hints_published",
            "Delivered hints published for the other server replicas",
            m.hints_published.clone(),
        );
        registry.register(
            "inferencecache_bus_load_hints_dropped",
            "Delivered hints dropped with their batch",
            m.hints_dropped.clone(),
        );
        registry.register(
            "inferencecache_bus_load_hints_applied",
            "Hints other server replicas delivered, applied to this replica's load",
            m.hints_applied.clone(),
        );
        registry.register(
            "inferencecache_bus_load_caller_reports_published",
            "Callers' in-flight counts (ReportCallerLoad) this replica received, published for the others",
            m.caller_loads_published.clone(),
        );
        registry.register(
            "inferencecache_bus_load_caller_reports_applied",
            "Callers' in-flight counts other replicas received, applied to this replica's load",
            m.caller_loads_applied.clone(),
        );
        registry.register(
            "inferencecache_bus_load_skipped",
            "Remote delivered hints not applied, by reason (own|reported|stale|unknown_replica; garbage counts messages; caller_unapplied counts callers' counts for unknown replicas or too old)",
            m.skipped.clone(),
        );
        registry.register(
            "inferencecache_bus_load_lag_seconds",
            "From another replica's delivery (first of its batch) to its apply here",
            m.lag_seconds.clone(),
        );
        for r in SKIP_REASONS {
            let _ = m.skipped.get_or_create(&ReasonLabel { reason: r.into() });
        }
        m
    }

    /// Remote hints not applied, every reason (garbage messages included).
    pub fn skipped_total(&self) -> u64 {
        SKIP_REASONS
            .iter()
            .map(|r| {
                self.skipped
                    .get_or_create(&ReasonLabel {
                        reason: (*r).into(),
                    })
                    .get()
            })
            .sum()
    }

    fn skip(&self, reason: &'static str, n: u64) {
        self.skipped
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .inc_by(n);
    }
}

/// When this replica last applied each engine's load report (Unix ns).
#[derive(Debug, Default)]
pub struct ReportTimes(Mutex<HashMap<String, i64>>);

impl ReportTimes {
    /// An engine load report stamped `at_ns` was applied for `replica`.
    pub fn note(&self, replica: &str, at_ns: i64) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = m.get_mut(replica) {
            *t = (*t).max(at_ns);
            return;
        }
        if m.len() >= MAX_REPORTS {
            m.clear();
        }
        m.insert(replica.to_owned(), at_ns);
    }

    fn last(&self, replica: &str) -> Option<i64> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(replica)
            .copied()
    }
}

/// This process's origin on the load subject: the bus name plus a nonce.
pub fn origin(name: &str) -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_i64(unix_now_ns());
    format!("{name}/{:016x}", h.finish())
}

/// Publishes this replica's deliveries until `stop`.
pub async fn publish_loop(
    bus: Bus,
    log: DeliveryLog,
    origin: String,
    interval: Duration,
    metrics: Arc<LoadShareMetrics>,
    stop: CancellationToken,
) {
    let subject = bus.config.load_subject();
    let mut taken = DeliveryMap::new();
    let mut batch_no = 0u64;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = log.wait_recorded() => {}
        }
        log.take(&mut taken);
        let hints: u64 = taken.values().map(|c| u64::from(c.hints)).sum();
        if hints > 0 {
            let entries: Vec<ReplicaDeliveries> = taken
                .iter()
                .map(|(r, c)| ReplicaDeliveries {
                    replica_id: r.to_string(),
                    hints: c.hints,
                    work_us: c.work_us,
                    first_unix_ns: c.first_ns,
                    last_unix_ns: c.last_ns,
                })
                .collect();
            let mut ok = true;
            for part in entries.chunks(MAX_REPLICAS_PER_MESSAGE) {
                batch_no += 1;
                let body = DeliveryBatch {
                    origin: origin.clone(),
                    sent_unix_ns: unix_now_ns(),
                    replicas: part.to_vec(),
                    batch: batch_no,
                }
                .encode_body();
                ok &= publish(&bus, &subject, KIND_DELIVERIES, body, interval).await;
            }
            if ok {
                metrics.batches_published.inc();
                metrics.hints_published.inc_by(hints);
            } else {
                metrics.batches_dropped.inc();
                metrics.hints_dropped.inc_by(hints);
            }
        }
        // Coalesce: whatever is delivered during the interval leaves in the
        // next batch.
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// One fire-and-forget publish; false when the bus is down or does not take
/// it within a bound (the batch is then dropped: never buffered, never
/// retried, see the module docs of `inferencecache_bus::load`).
async fn publish(
    bus: &Bus,
    subject: &str,
    kind: &'static str,
    body: bytes::Bytes,
    interval: Duration,
) -> bool {
    if !bus.is_connected() {
        return false;
    }
    let mut headers = inferencecache_bus::async_nats::HeaderMap::new();
    headers.insert(inferencecache_bus::message::KIND_HEADER, kind);
    let sent = bus
        .client
        .publish_with_headers(subject.to_owned(), headers, body);
    let bound = interval.max(Duration::from_millis(100));
    match tokio::time::timeout(bound, sent).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "bus_load_publish_failed");
            false
        }
        Err(_) => {
            tracing::debug!("bus_load_publish_timed_out");
            false
        }
    }
}

/// Publishes the callers' reports this replica received
/// (`caller_load.rs`) as they arrive, until `stop`: a report is a count that
/// replaces the caller's last, so one batch per wake-up (whatever queued
/// meanwhile) and no interval to wait out.
pub async fn publish_caller_loads(
    bus: Bus,
    core: Core,
    origin: String,
    metrics: Arc<LoadShareMetrics>,
    stop: CancellationToken,
) {
    let subject = bus.config.load_subject();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = core.caller_loads.wait_queued() => {}
        }
        let Some(batch) = core.caller_loads.take_batch(&origin, unix_now_ns()) else {
            continue;
        };
        let n = batch.loads.len() as u64;
        let body = batch.encode_body();
        if publish(&bus, &subject, KIND_CALLER_LOAD, body, DEFAULT_INTERVAL).await {
            metrics.caller_loads_published.inc_by(n);
        } else {
            metrics.batches_dropped.inc();
        }
    }
}

/// Applies the other replicas' deliveries until `stop`.
pub async fn apply_loop(
    bus: Bus,
    core: Core,
    origin: String,
    reports: Arc<ReportTimes>,
    metrics: Arc<LoadShareMetrics>,
    stop: CancellationToken,
) {
    let subject = bus.config.load_subject();
    let mut sub = loop {
        match bus.client.subscribe(subject.clone()).await {
            Ok(s) => break s,
            Err(e) => {
                tracing::debug!(error = %e, "bus_load_subscribe_failed");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    };
    loop {
        let msg = tokio::select! {
            () = stop.cancelled() => return,
            m = sub.next() => m,
        };
        let Some(msg) = msg else { return };
        let kind = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(inferencecache_bus::message::KIND_HEADER))
            .map(|v| v.as_str().to_owned());
        if kind.as_deref() == Some(KIND_CALLER_LOAD) {
            let Some(batch) = CallerLoadBatch::decode_body(&msg.payload) else {
                metrics.skip("garbage", 1);
                continue;
            };
            let (applied, not) =
                core.caller_loads
                    .apply_batch(&core.index, &origin, &batch, unix_now_ns());
            metrics.caller_loads_applied.inc_by(applied);
            if batch.origin != origin {
                metrics.skip("caller_unapplied", not);
            }
            continue;
        }
        let Some(batch) = DeliveryBatch::decode_body(&msg.payload) else {
            metrics.skip("garbage", 1);
            continue;
        };
        apply_batch(&core, &origin, &reports, &metrics, &batch, unix_now_ns());
    }
}

/// Applies one batch at `now_ns` (module docs).
pub fn apply_batch(
    core: &Core,
    origin: &str,
    reports: &ReportTimes,
    metrics: &LoadShareMetrics,
    batch: &DeliveryBatch,
    now_ns: i64,
) {
    let hints = |e: &ReplicaDeliveries| u64::from(e.hints);
    if batch.origin == origin {
        metrics.skip("own", batch.replicas.iter().map(hints).sum());
        return;
    }
    let max_age = i64::try_from(MAX_AGE.as_nanos()).unwrap_or(i64::MAX);
    for e in &batch.replicas {
        if e.hints == 0 {
            continue;
        }
        let age = now_ns.saturating_sub(e.first_unix_ns);
        if age > max_age {
            metrics.skip("stale", hints(e));
            continue;
        }
        if reports
            .last(&e.replica_id)
            .is_some_and(|at| e.last_unix_ns < at)
        {
            metrics.skip("reported", hints(e));
            continue;
        }
        // Each hint's work as delivered, less what has drained since the
        // last of them was delivered.
        let drained_us = now_ns.saturating_sub(e.last_unix_ns).max(0) as f64 / 1_000.0;
        let each = e.work_us / f64::from(e.hints) - drained_us;
        if core
            .index
            .record_remote_deliveries(&e.replica_id, e.hints, each.max(0.0))
        {
            metrics.hints_applied.inc_by(hints(e));
            metrics.lag_seconds.observe(age.max(0) as f64 / 1e9);
        } else {
            metrics.skip("unknown_replica", hints(e));
        }
    }
}

/// Now, Unix ns (the bus's clock: deliveries and callers' counts are stamped
/// with it).
pub fn unix_now_ns() -> i64 {
    use inferencecache_index::Clock;
    inferencecache_index::SystemClock.now_ns()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicate::core_holding;

    fn batch(origin: &str, replica: &str, hints: u32, at_ns: i64) -> DeliveryBatch {
        DeliveryBatch {
            origin: origin.into(),
            sent_unix_ns: at_ns,
            replicas: vec![ReplicaDeliveries {
                replica_id: replica.into(),
                hints,
                work_us: 1_000.0 * f64::from(hints),
                first_unix_ns: at_ns,
                last_unix_ns: at_ns,
            }],
            batch: 1,
        }
    }

    fn skipped(m: &LoadShareMetrics, reason: &str) -> u64 {
        m.skipped
            .get_or_create(&ReasonLabel {
                reason: reason.into(),
            })
            .get()
    }

    #[test]
    fn a_batch_applies_once_to_known_replicas_after_their_last_report() {
        let core = core_holding(&["r1"]);
        let (m, reports) = (LoadShareMetrics::default(), ReportTimes::default());
        let now = unix_now_ns();
        // Our own batch: counted when delivered, skipped here.
        apply_batch(
            &core,
            "me/1",
            &reports,
            &m,
            &batch("me/1", "r1", 4, now),
            now,
        );
        assert_eq!(
            (skipped(&m, "own"), core.index.delivered_hints("r1")),
            (4, 0)
        );
        // A peer's: applied.
        apply_batch(
            &core,
            "me/1",
            &reports,
            &m,
            &batch("peer/2", "r1", 3, now),
            now,
        );
        assert_eq!(
            (m.hints_applied.get(), core.index.delivered_hints("r1")),
            (3, 3)
        );
        // Unknown replica, too old, or delivered before the engine's last
        // load report (which counted it): skipped, each by its reason.
        apply_batch(
            &core,
            "me/1",
            &reports,
            &m,
            &batch("peer/2", "zz", 1, now),
            now,
        );
        let old = now - 3 * 1_000_000_000;
        apply_batch(
            &core,
            "me/1",
            &reports,
            &m,
            &batch("peer/2", "r1", 2, old),
            now,
        );
        reports.note("r1", now + 1);
        apply_batch(
            &core,
            "me/1",
            &reports,
            &m,
            &batch("peer/2", "r1", 5, now),
            now,
        );
        assert_eq!(
            (
                skipped(&m, "unknown_replica"),
                skipped(&m, "stale"),
                skipped(&m, "reported")
            ),
            (1, 2, 5)
        );
        assert_eq!(core.index.delivered_hints("r1"), 3);
    }

    #[test]
    fn origins_differ_per_process_start() {
        assert_ne!(origin("a"), origin("a"));
        assert!(origin("a").starts_with("a/"));
    }
}

//! Bus and warm-restart metrics, registered into the server's registry.
//!
//! The bus crate keeps its counters in atomics; [`ReplicationMetrics::sync`]
//! mirrors them (counters by delta) every second and before shutdown.

use crate::metrics::ReasonLabel;
use inferencecache_bus::{ConsumerStatus, ProducerStats, SkipReason};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Labels of `inferencecache_state_snapshots_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct SnapshotLabels {
    /// `file` or `bucket`.
    pub target: String,
    /// `ok` or `error`.
    pub result: String,
}

/// Replication and persistence metrics.
#[derive(Debug, Default)]
pub struct ReplicationMetrics {
    /// 1 when the bus is connected (bus mode only).
    pub bus_connected: Gauge,
    /// 1 once the replica caught up with the stream at start.
    pub bus_caught_up: Gauge,
    /// Last stream sequence applied.
    pub bus_applied_sequence: Gauge,
    /// Messages pending behind the last applied one.
    pub bus_lag_messages: Gauge,
    /// Age of the last applied message when applied, seconds.
    pub bus_lag_seconds: Gauge<f64, AtomicU64>,
    /// Stream messages applied.
    pub bus_applied: Counter,
    /// Stream messages skipped, by reason.
    pub bus_skipped: Family<ReasonLabel, Counter>,
    /// Start points found purged (gap → resync request).
    pub bus_gaps: Counter,
    /// Messages relayed to the stream (published).
    pub bus_published: Counter,
    /// Messages dropped by the relay's bounded buffer.
    pub bus_publish_dropped: Counter,
    /// Publishes that failed or lost their ack.
    pub bus_publish_failed: Counter,
    /// Resyncs asked of gRPC producers (their report streams were ended).
    pub bus_resyncs: Counter,
    /// Snapshot writes and publishes.
    pub state_snapshots: Family<SnapshotLabels, Counter>,
    /// Size of the last snapshot written, bytes.
    pub state_snapshot_bytes: Gauge,
    /// Entries restored at start.
    pub state_restored_entries: Gauge,
    /// Delivered hints shared with the other server replicas.
    pub load: std::sync::Arc<super::load_share::LoadShareMetrics>,
    last: Mutex<[u64; 9]>,
}

impl ReplicationMetrics {
    /// Registers every series.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            load: std::sync::Arc::new(super::load_share::LoadShareMetrics::register(registry)),
            ..Self::default()
        };
        registry.register(
            "inferencecache_bus_connected",
            "1 when the NATS bus is connected (bus mode)",
            m.bus_connected.clone(),
        );
        registry.register(
            "inferencecache_bus_caught_up",
            "1 once this replica has applied the stream up to where it was at start",
            m.bus_caught_up.clone(),
        );
        registry.register(
            "inferencecache_bus_applied_sequence",
            "Last bus stream sequence applied",
            m.bus_applied_sequence.clone(),
        );
        registry.register(
            "inferencecache_bus_lag_messages",
            "Bus messages pending behind the last applied one",
            m.bus_lag_messages.clone(),
        );
        registry.register(
            "inferencecache_bus_lag_seconds",
            "Age of the last applied bus message when it was applied",
            m.bus_lag_seconds.clone(),
        );
        registry.register(
            "inferencecache_bus_applied",
            "Bus messages applied to the index",
            m.bus_applied.clone(),
        );
        registry.register(
            "inferencecache_bus_skipped",
            "Bus messages skipped, by reason (missing_kind|unknown_kind|garbage|probe_tenant)",
            m.bus_skipped.clone(),
        );
        registry.register("inferencecache_bus_gaps", "Times the replica's start point had been purged from the stream (a resync was requested)", m.bus_gaps.clone());
        registry.register(
            "inferencecache_bus_published",
            "Messages received over gRPC and published to the bus",
            m.bus_published.clone(),
        );
        registry.register(
            "inferencecache_bus_publish_dropped",
            "Messages dropped because the bus relay buffer was full",
            m.bus_publish_dropped.clone(),
        );
        registry.register(
            "inferencecache_bus_publish_failed",
            "Bus publishes that failed or lost their ack",
            m.bus_publish_failed.clone(),
        );
        registry.register(
            "inferencecache_bus_resyncs",
            "Full resyncs asked of gRPC producers after a possible loss",
            m.bus_resyncs.clone(),
        );
        registry.register(
            "inferencecache_state_snapshots",
            "Index snapshots written (file) or published (bucket), by result",
            m.state_snapshots.clone(),
        );
        registry.register(
            "inferencecache_state_snapshot_bytes",
            "Size of the last index snapshot written",
            m.state_snapshot_bytes.clone(),
        );
        registry.register(
            "inferencecache_state_restored_entries",
            "Replica x prefix entries restored at start",
            m.state_restored_entries.clone(),
        );
        for r in SkipReason::ALL {
            let _ = m.bus_skipped.get_or_create(&ReasonLabel {
                reason: r.label().into(),
            });
        }
        m
    }

    /// Mirrors the bus crate's atomics.
    pub fn sync(&self, consumer: Option<&ConsumerStatus>, producer: Option<&ProducerStats>) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let mut bump = |i: usize, now: u64, c: &Counter| {
            if let Some(prev) = last.get_mut(i) {
                if now > *prev {
                    c.inc_by(now - *prev);
                }
                *prev = now;
            }
        };
        if let Some(s) = consumer {
            let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
            self.bus_connected
                .set(i64::from(s.connected.load(Ordering::Relaxed)));
            self.bus_caught_up
                .set(i64::from(s.caught_up.load(Ordering::Relaxed)));
            self.bus_applied_sequence
                .set(i64::try_from(ld(&s.applied)).unwrap_or(i64::MAX));
            self.bus_lag_messages
                .set(i64::try_from(ld(&s.lag_messages)).unwrap_or(i64::MAX));
            self.bus_lag_seconds
                .set(s.lag_ns.load(Ordering::Relaxed) as f64 / 1e9);
            bump(0, ld(&s.applied_total), &self.bus_applied);
            bump(1, ld(&s.gaps), &self.bus_gaps);
            for (i, r) in SkipReason::ALL.iter().enumerate() {
                let c = self.bus_skipped.get_or_create(&ReasonLabel {
                    reason: r.label().into(),
                });
                bump(5 + i, s.skipped(*r), &c);
            }
        }
        if let Some(p) = producer {
            let ld = |a: &AtomicU64| a.load(Ordering::Relaxed);
            bump(2, ld(&p.published), &self.bus_published);
            bump(3, ld(&p.dropped), &self.bus_publish_dropped);
            bump(4, ld(&p.failed), &self.bus_publish_failed);
        }
    }

    /// Records the entries a snapshot restored.
    pub fn restored(&self, entries: u64) {
        self.state_restored_entries
            .set(i64::try_from(entries).unwrap_or(i64::MAX));
    }

    /// Records one snapshot file write of `bytes` (`None`: it failed).
    pub fn written(&self, bytes: Option<usize>) {
        self.snapshot("file", bytes.is_some());
        if let Some(n) = bytes {
            self.state_snapshot_bytes
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Counts one snapshot write or publish.
    pub fn snapshot(&self, target: &str, ok: bool) {
        self.state_snapshots
            .get_or_create(&SnapshotLabels {
                target: target.into(),
                result: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
    }
}

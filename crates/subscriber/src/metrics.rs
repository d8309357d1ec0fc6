//! The sidecar's own `/metrics` (OpenMetrics, `inferencecache_subscriber_*`).
//!
//! The event path keeps plain cumulative counters in its own structs
//! ([`ReplicaStats`], [`MappingStats`], [`TransportStatus`]); they are copied
//! here after each delivery ([`SidecarMetrics::sync_totals`]) so the hot path
//! never touches an atomic per block.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::mapping::MappingStats;
use crate::replica::ReplicaStats;
use crate::transport::TransportStatus;

type Label = [(&'static str, &'static str); 1];
type RankLabel = [(&'static str, String); 1];

/// Every metric the sidecar exposes, plus the readiness flags.
pub struct SidecarMetrics {
    registry: Mutex<Registry>,
    /// Engine events decoded, by `type`.
    pub events: Family<Label, Counter>,
    /// Blocks by what happened to them (`op`).
    pub blocks: Family<Label, Counter>,
    /// Blocks dropped, by `reason`.
    pub dropped_blocks: Family<Label, Counter>,
    /// Decode errors, by `kind` (event, batch, frame).
    pub decode_errors: Family<Label, Counter>,
    /// Live sequence gaps seen.
    pub gaps: Counter,
    /// Replays requested / timed out.
    pub replays: Family<Label, Counter>,
    /// Engine messages lost for good.
    pub lost_messages: Counter,
    /// Engine restarts detected.
    pub engine_restarts: Counter,
    /// Engines disconnected past the grace, their blocks withdrawn.
    pub engine_withdrawals: Counter,
    /// Full-state resyncs sent to the server.
    pub resyncs: Counter,
    /// Times the server's ingest limit pushed the sidecar back
    /// (RESOURCE_EXHAUSTED with a retry hint; it waited, then resynced).
    pub throttled: Counter,
    /// Updates not sent because the send buffer was full or the server was
    /// unreachable (repaired by the next resync).
    pub send_overflow: Counter,
    /// Server RPCs that failed, by `rpc`.
    pub rpc_errors: Family<Label, Counter>,
    /// Messages sent, by `rpc`.
    pub sent: Family<Label, Counter>,
    /// Time to send (and, where acknowledged, get the ack of) one message, by `rpc`.
    pub send_latency: Family<Label, Histogram, fn() -> Histogram>,
    /// Evictions queued or in flight towards the server.
    pub eviction_backlog: Gauge,
    /// Engine batch with an eviction received → the server's ack (applied:
    /// lookups no longer hint the block).
    pub eviction_visible: Histogram,
    /// Queued evictions dropped before sending because the block was stored
    /// again (or the replica cleared) meanwhile.
    pub evictions_superseded: Counter,
    /// Engine blocks tracked, summed over ranks.
    pub tracked_blocks: Gauge,
    /// Blocks held back for an unknown parent, summed over ranks.
    pub pending_blocks: Gauge,
    /// 1 while the server stream is up and resynced.
    pub server_connected: Gauge,
    /// 1 while the rank's engine PUB is connected, by `rank`.
    pub engine_connected: Family<RankLabel, Gauge>,
    /// Engine `/metrics` scrapes, by `result`.
    pub scrapes: Family<Label, Counter>,
    /// Times the engine's metrics stayed unreachable past
    /// `--engine-metrics-grace` and the replica's blocks were withdrawn.
    pub metrics_withdrawals: Counter,
    /// 1 while the replica is withdrawn for dead engine metrics.
    pub engine_metrics_down: Gauge,
    server_up: AtomicBool,
    metrics_down: AtomicBool,
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~3.3 s
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

impl std::fmt::Debug for SidecarMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SidecarMetrics").finish_non_exhaustive()
    }
}

impl Default for SidecarMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Raises a counter to a cumulative total kept elsewhere.
fn set_total(c: &Counter, total: u64) {
    let now = c.get();
    if total > now {
        c.inc_by(total - now);
    }
}

impl SidecarMetrics {
    /// Registers everything under `inferencecache_subscriber_`.
    pub fn new() -> Self {
        let m = Self {
            registry: Mutex::new(Registry::with_prefix("inferencecache_subscriber")),
            events: Family::default(),
            blocks: Family::default(),
            dropped_blocks: Family::default(),
            decode_errors: Family::default(),
            gaps: Counter::default(),
            replays: Family::default(),
            lost_messages: Counter::default(),
            engine_restarts: Counter::default(),
            engine_withdrawals: Counter::default(),
            resyncs: Counter::default(),
            throttled: Counter::default(),
            send_overflow: Counter::default(),
            rpc_errors: Family::default(),
            sent: Family::default(),
            send_latency: Family::new_with_constructor(latency_histogram),
            eviction_backlog: Gauge::default(),
            // 1 ms .. 1 s, fine around the 50 ms target.
            eviction_visible: Histogram::new([
                0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2,
                0.5, 1.0,
            ]),
            evictions_superseded: Counter::default(),
            tracked_blocks: Gauge::default(),
            pending_blocks: Gauge::default(),
            server_connected: Gauge::default(),
            engine_connected: Family::default(),
            scrapes: Family::default(),
            metrics_withdrawals: Counter::default(),
            engine_metrics_down: Gauge::default(),
            server_up: AtomicBool::new(false),
            metrics_down: AtomicBool::new(false),
        };
        if let Ok(mut r) = m.registry.lock() {
            r.register(
                "events",
                "Engine KV events decoded, by type",
                m.events.clone(),
            );
            r.register(
                "blocks",
                "Engine blocks by outcome (stored, evicted, downgraded, overflow_evicted, removed_unknown, duplicate_stored: a second physical copy of a held hash, duplicate_removed: a copy removed while another stays, window_stored: stored in a sliding-window or other non-full group (hybrid models; tracked, not reported), end_changed: re-reported because whether a match may end there changed)",
                m.blocks.clone(),
            );
            r.register(
                "dropped_blocks",
                "Engine blocks not indexed, by reason",
                m.dropped_blocks.clone(),
            );
            r.register(
                "decode_errors",
                "Undecodable engine input, by kind (event, batch, frame); each skipped",
                m.decode_errors.clone(),
            );
            r.register(
                "gaps",
                "Live sequence gaps (seq > last + 1)",
                m.gaps.clone(),
            );
            r.register(
                "replays",
                "Replay requests to the engine, by result (requested, timed_out)",
                m.replays.clone(),
            );
            r.register(
                "lost_messages",
                "Engine messages lost for good (gap not replayable)",
                m.lost_messages.clone(),
            );
            r.register(
                "engine_restarts",
                "Engine restarts detected (sequence reset)",
                m.engine_restarts.clone(),
            );
            r.register(
                "engine_withdrawals",
                "Times the engine's event stream stayed down past --engine-down-grace and the replica's blocks were withdrawn",
                m.engine_withdrawals.clone(),
            );
            r.register(
                "resyncs",
                "Full-state resyncs sent to the server (ALL_CLEARED + every tracked block)",
                m.resyncs.clone(),
            );
            r.register(
                "throttled",
                "Times the server's producer ingest limit pushed back (waited for its retry hint, then resynced)",
                m.throttled.clone(),
            );
            r.register("send_overflow", "Updates not sent (send buffer full or server unreachable); the next resync repairs them", m.send_overflow.clone());
            r.register(
                "rpc_errors",
                "Failed server RPCs, by rpc",
                m.rpc_errors.clone(),
            );
            r.register(
                "sent",
                "Messages sent to the server, by rpc",
                m.sent.clone(),
            );
            r.register(
                "send_latency_seconds",
                "Time to send one message (acknowledged RPCs: until the ack), by rpc",
                m.send_latency.clone(),
            );
            r.register(
                "eviction_backlog",
                "Evictions queued or in flight towards the server",
                m.eviction_backlog.clone(),
            );
            r.register(
                "eviction_visible_seconds",
                "Time from the engine batch carrying an eviction reaching the sidecar to the server acknowledging it (applied: lookups no longer hint the block)",
                m.eviction_visible.clone(),
            );
            r.register(
                "evictions_superseded",
                "Queued evictions not sent because the block was stored again (or the replica cleared) first",
                m.evictions_superseded.clone(),
            );
            r.register(
                "tracked_blocks",
                "Engine blocks tracked (all ranks)",
                m.tracked_blocks.clone(),
            );
            r.register(
                "pending_blocks",
                "Blocks held back for an unknown parent (all ranks)",
                m.pending_blocks.clone(),
            );
            r.register(
                "server_connected",
                "1 while the server stream is up and resynced",
                m.server_connected.clone(),
            );
            r.register(
                "engine_connected",
                "1 while the engine PUB socket of a rank is connected",
                m.engine_connected.clone(),
            );
            r.register(
                "engine_scrapes",
                "Engine /metrics scrapes, by result",
                m.scrapes.clone(),
            );
            r.register(
                "engine_metrics_withdrawals",
                "Times the engine's /metrics stayed unreachable past --engine-metrics-grace (a hung or dead engine) and the replica's blocks were withdrawn",
                m.metrics_withdrawals.clone(),
            );
            r.register(
                "engine_metrics_down",
                "1 while the replica's blocks are withdrawn because the engine's /metrics does not answer",
                m.engine_metrics_down.clone(),
            );
        }
        m
    }

    /// Records whether the engine's metrics are down past the grace.
    pub fn set_engine_metrics_down(&self, down: bool) {
        self.metrics_down.store(down, Ordering::Relaxed);
        self.engine_metrics_down.set(i64::from(down));
    }

    /// Whether the replica is withdrawn for dead engine metrics.
    pub fn engine_metrics_down(&self) -> bool {
        self.metrics_down.load(Ordering::Relaxed)
    }

    /// The OpenMetrics exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(r) = self.registry.lock() {
            if prometheus_client::encoding::text::encode(&mut out, &r).is_err() {
                out.clear();
            }
        }
        out
    }

    /// Counts one message sent (acknowledged, where the RPC acknowledges)
    /// and its latency.
    pub fn record_sent(&self, rpc: &'static str, started: std::time::Instant) {
        self.sent.get_or_create(&[("rpc", rpc)]).inc();
        self.send_latency
            .get_or_create(&[("rpc", rpc)])
            .observe(started.elapsed().as_secs_f64());
    }

    /// Records whether the server is reachable (stream up, resync done).
    pub fn set_server_up(&self, up: bool) {
        self.server_up.store(up, Ordering::Relaxed);
        self.server_connected.set(i64::from(up));
    }

    /// Whether the server is reachable.
    pub fn server_up(&self) -> bool {
        self.server_up.load(Ordering::Relaxed)
    }

    /// Copies the event path's cumulative counters.
    pub fn sync_totals<'a>(
        &self,
        replica: &ReplicaStats,
        mappings: impl Iterator<Item = &'a MappingStats>,
        tracked: usize,
        pending: usize,
    ) {
        let ev = |t| self.events.get_or_create(&[("type", t)]).clone();
        set_total(&ev("BlockStored"), replica.stored_events);
        set_total(&ev("BlockRemoved"), replica.removed_events);
        set_total(&ev("AllBlocksCleared"), replica.cleared_events);
        set_total(&ev("unknown"), replica.unknown_events);
        let de = |k| self.decode_errors.get_or_create(&[("kind", k)]).clone();
        set_total(&de("event"), replica.bad_events);
        set_total(&de("batch"), replica.bad_batches);
        set_total(&self.engine_restarts, replica.engine_restarts);
        let mut sum = MappingStats::default();
        for m in mappings {
            sum.blocks_stored += m.blocks_stored;
            sum.blocks_evicted += m.blocks_evicted;
            sum.blocks_downgraded += m.blocks_downgraded;
            sum.overflow_evicted += m.overflow_evicted;
            sum.removed_unknown += m.removed_unknown;
            sum.duplicate_blocks += m.duplicate_blocks;
            sum.removed_duplicates += m.removed_duplicates;
            sum.window_blocks += m.window_blocks;
            sum.end_changes += m.end_changes;
            sum.dropped_token_mismatch += m.dropped_token_mismatch;
            sum.dropped_unmapped_lora += m.dropped_unmapped_lora;
            sum.dropped_unknown_parent += m.dropped_unknown_parent;
            sum.skipped_non_prefix_group += m.skipped_non_prefix_group;
            sum.held_back_events += m.held_back_events;
            sum.resolved_events += m.resolved_events;
        }
        // Totals must never go down: a rank's Mapping lives as long as the
        // process (reset keeps its stats), so sums only grow.
        let b = |op| self.blocks.get_or_create(&[("op", op)]).clone();
        set_total(&b("stored"), sum.blocks_stored);
        set_total(&b("evicted"), sum.blocks_evicted);
        set_total(&b("downgraded"), sum.blocks_downgraded);
        set_total(&b("overflow_evicted"), sum.overflow_evicted);
        set_total(&b("removed_unknown"), sum.removed_unknown);
        set_total(&b("duplicate_stored"), sum.duplicate_blocks);
        set_total(&b("duplicate_removed"), sum.removed_duplicates);
        set_total(&b("window_stored"), sum.window_blocks);
        set_total(&b("end_changed"), sum.end_changes);
        set_total(&b("held_back"), sum.held_back_events);
        set_total(&b("resolved_after_hold"), sum.resolved_events);
        let d = |r| self.dropped_blocks.get_or_create(&[("reason", r)]).clone();
        set_total(&d("unknown_parent"), sum.dropped_unknown_parent);
        set_total(&d("token_mismatch"), sum.dropped_token_mismatch);
        set_total(&d("unmapped_lora"), sum.dropped_unmapped_lora);
        set_total(&d("non_prefix_group"), sum.skipped_non_prefix_group);
        self.tracked_blocks.set(tracked as i64);
        self.pending_blocks.set(pending as i64);
    }

    /// Copies the transports' counters and link state.
    pub fn sync_transports(&self, ranks: &[(u32, Arc<TransportStatus>)]) {
        let mut t = [0u64; 7];
        for (rank, s) in ranks {
            let up = s.connected.load(Ordering::Relaxed);
            self.engine_connected
                .get_or_create(&[("rank", rank.to_string())])
                .set(i64::from(up));
            t[0] += s.gaps.load(Ordering::Relaxed);
            t[1] += s.replays.load(Ordering::Relaxed);
            t[2] += s.replay_timeouts.load(Ordering::Relaxed);
            t[3] += s.lost.load(Ordering::Relaxed);
            t[4] += s.malformed.load(Ordering::Relaxed);
            t[5] += s.duplicates.load(Ordering::Relaxed);
            t[6] += s.withdrawals.load(Ordering::Relaxed);
        }
        set_total(&self.engine_withdrawals, t[6]);
        set_total(&self.gaps, t[0]);
        set_total(
            &self
                .replays
                .get_or_create(&[("result", "requested")])
                .clone(),
            t[1],
        );
        set_total(
            &self
                .replays
                .get_or_create(&[("result", "timed_out")])
                .clone(),
            t[2],
        );
        set_total(&self.lost_messages, t[3]);
        set_total(
            &self
                .decode_errors
                .get_or_create(&[("kind", "frame")])
                .clone(),
            t[4],
        );
        set_total(
            &self
                .replays
                .get_or_create(&[("result", "duplicate")])
                .clone(),
            t[5],
        );
    }
}

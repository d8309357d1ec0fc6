//! The consumer: applies the stream in order, from the sequence after the
//! last one applied, through an ordered consumer of its own.
//!
//! Every replica runs one. An ordered consumer is ephemeral, unacknowledged
//! and flow-controlled, and the client recreates it from the last delivered
//! sequence when it notices a gap; the replica's own position is the
//! sequence it last applied (kept in its snapshot), so no durable consumer
//! state lives on the server. After a broken connection the consumer is
//! created again from `applied + 1`; sequences at or below `applied` are
//! skipped, so a redelivery never applies twice.
//!
//! **Caught up.** At each (re)start the consumer reads the stream's last
//! sequence; once it has applied up to it, [`ConsumerStatus::caught_up`]
//! turns true (and stays true).
//!
//! **Gaps.** When the sequence after `applied` has been purged (retention
//! ran past a replica that was down too long), the consumer starts at the
//! first sequence still stored, counts the gap, and asks every producer for
//! a full resync on the control subject.
//!
//! **Bad input.** A message without a kind header, of an unknown kind, or
//! whose body does not decode is counted by reason and skipped; it never
//! stalls the consumer.

use crate::config::Bus;
use crate::message::{BusMessage, KIND_HEADER, SkipReason};
use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Consumer position, lag and counters, shared with metrics and readiness.
#[derive(Debug, Default)]
pub struct ConsumerStatus {
    /// Connected to the bus with a live consumer.
    pub connected: AtomicBool,
    /// Caught up with the stream as it was at start (sticky).
    pub caught_up: AtomicBool,
    /// Last stream sequence applied.
    pub applied: AtomicU64,
    /// Stream's last sequence when the consumer (re)started.
    pub target: AtomicU64,
    /// Messages the server says are still pending after the last applied one.
    pub lag_messages: AtomicU64,
    /// Age of the last applied message when it was applied, ns.
    pub lag_ns: AtomicI64,
    /// Messages applied.
    pub applied_total: AtomicU64,
    /// Skipped messages, by [`SkipReason`] (same order as [`SkipReason::ALL`]).
    pub skipped: [AtomicU64; 4],
    /// Times the start point had been purged.
    pub gaps: AtomicU64,
    /// Times the consumer was (re)created.
    pub restarts: AtomicU64,
}

impl ConsumerStatus {
    /// A status starting after `applied` (0 = from the beginning).
    pub fn starting_after(applied: u64) -> Self {
        let s = Self::default();
        s.applied.store(applied, Ordering::SeqCst);
        s
    }

    /// Skipped count for one reason.
    pub fn skipped(&self, r: SkipReason) -> u64 {
        SkipReason::ALL
            .iter()
            .position(|x| *x == r)
            .and_then(|i| self.skipped.get(i))
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    fn skip(&self, r: SkipReason) {
        if let Some(c) = SkipReason::ALL
            .iter()
            .position(|x| *x == r)
            .and_then(|i| self.skipped.get(i))
        {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn mark_caught_up(&self) {
        if !self.caught_up.swap(true, Ordering::SeqCst) {
            tracing::info!(
                applied = self.applied.load(Ordering::SeqCst),
                "bus_caught_up"
            );
        }
    }
}

/// One message to apply.
#[derive(Debug)]
pub struct Delivery {
    /// Stream sequence.
    pub sequence: u64,
    /// When the stream stored it, Unix ns (the time for `timestamp_us == 0`).
    pub stored_ns: i64,
    /// The message.
    pub message: BusMessage,
}

/// What the applier says about a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Applied.
    Ok,
    /// Skipped for a reason (counted).
    Skipped(SkipReason),
}

/// Runs until `cancel`, calling `apply` for every message in stream order.
pub async fn run_consumer(
    bus: Bus,
    status: Arc<ConsumerStatus>,
    mut apply: impl FnMut(Delivery) -> Applied + Send,
    cancel: CancellationToken,
) {
    let mut logged_down = false;
    loop {
        if cancel.is_cancelled() {
            return;
        }
        if !bus.is_connected() {
            status.connected.store(false, Ordering::SeqCst);
            if !logged_down {
                tracing::warn!(url = %bus.config.url, "bus_not_connected; serving from the local index (fail-open)");
                logged_down = true;
            }
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(Duration::from_millis(100)) => continue,
            }
        }
        match consume(&bus, &status, &mut apply, &cancel).await {
            Ok(()) => return,
            Err(e) => {
                status.connected.store(false, Ordering::SeqCst);
                tracing::warn!(error = %e, "bus_consumer_restart");
                logged_down = false;
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
        }
    }
}

async fn consume(
    bus: &Bus,
    status: &ConsumerStatus,
    apply: &mut (impl FnMut(Delivery) -> Applied + Send),
    cancel: &CancellationToken,
) -> Result<(), crate::BusError> {
    let stream_err = |e: &dyn std::fmt::Display| crate::BusError::Stream(e.to_string());
    let mut stream = bus.stream().await?;
    let info = stream.info().await.map_err(|e| stream_err(&e))?.clone();
    let applied = status.applied.load(Ordering::SeqCst);
    let (first, last) = (info.state.first_sequence, info.state.last_sequence);
    status.target.store(last, Ordering::SeqCst);
    let mut start = applied + 1;
    if applied > last {
        // The stream is younger than our position: it was deleted and
        // recreated. Everything stored now is new to us.
        status.gaps.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            applied,
            last,
            "bus_stream_reset: replaying it from its start"
        );
        status.applied.store(0, Ordering::SeqCst);
        start = first.max(1);
        if let Err(e) = crate::producer::request_resync(bus, "stream reset").await {
            tracing::warn!(error = %e, "bus_resync_request_failed");
        }
    } else if applied > 0 && start < first {
        status.gaps.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            applied,
            first_stored = first,
            "bus_gap: the next sequence was purged; asking producers for a full resync"
        );
        start = first;
        let why = format!(
            "{}: sequences {}..{} purged",
            bus.config.client_name,
            applied + 1,
            first - 1
        );
        if let Err(e) = crate::producer::request_resync(bus, &why).await {
            tracing::warn!(error = %e, "bus_resync_request_failed");
        }
    }
    if status.applied.load(Ordering::SeqCst) >= last || info.state.messages == 0 {
        status.mark_caught_up();
    }
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: start.max(1),
            },
            max_expires: Duration::from_secs(5),
            ..Default::default()
        })
        .await
        .map_err(|e| stream_err(&e))?;
    let mut messages = consumer.messages().await.map_err(|e| stream_err(&e))?;
    status.restarts.fetch_add(1, Ordering::Relaxed);
    status.connected.store(true, Ordering::SeqCst);
    tracing::info!(start, last, "bus_consumer_started");
    loop {
        let next = tokio::select! {
            () = cancel.cancelled() => return Ok(()),
            next = messages.next() => next,
        };
        let msg = match next {
            None => return Err(crate::BusError::Stream("ordered consumer ended".into())),
            Some(Err(e)) => return Err(stream_err(&e)),
            Some(Ok(m)) => m,
        };
        let Ok(info) = msg.info() else {
            status.skip(SkipReason::Garbage);
            continue;
        };
        let seq = info.stream_sequence;
        let pending = info.pending;
        let stored_ns = i64::try_from(info.published.unix_timestamp_nanos()).unwrap_or(0);
        if seq <= status.applied.load(Ordering::SeqCst) {
            continue;
        }
        let kind = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(KIND_HEADER))
            .map(|v| v.as_str());
        match BusMessage::decode(kind, &msg.payload) {
            Ok(message) => match apply(Delivery {
                sequence: seq,
                stored_ns,
                message,
            }) {
                Applied::Ok => {
                    status.applied_total.fetch_add(1, Ordering::Relaxed);
                }
                Applied::Skipped(r) => status.skip(r),
            },
            Err(r) => status.skip(r),
        }
        status.applied.store(seq, Ordering::SeqCst);
        status.lag_messages.store(pending, Ordering::Relaxed);
        status
            .lag_ns
            .store(now_ns().saturating_sub(stored_ns).max(0), Ordering::Relaxed);
        if pending == 0 || seq >= status.target.load(Ordering::SeqCst) {
            status.mark_caught_up();
        }
    }
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

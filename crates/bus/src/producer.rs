//! The producer: publishes bus messages in order, with publish acks and a
//! bounded number in flight; buffers within a bound while the bus is down;
//! and asks its owner for a **full resync** whenever something may have been
//! lost.
//!
//! # Loss and resync
//!
//! JetStream stores what it acknowledged, in the order it was received on one
//! connection. A failed publish or a missing ack means a message may be lost,
//! and retrying it later could store it *after* messages sent after it (an
//! old store landing after a newer eviction). So nothing is retried: a
//! failure, like a message dropped because the buffer was full, marks the
//! producer *lost*, and as soon as the bus is up again and nothing is in
//! flight, the resync generation ([`Producer::resyncs`]) moves on. The owner
//! then re-reports its whole state (`ALL_CLEARED` first), which supersedes
//! whatever was lost. A sidecar owns that state; the server in bus mode
//! relays for gRPC sidecars and turns a resync into `UNAVAILABLE` on their
//! report streams, which is what makes them re-report.
//!
//! The same generation moves when a replica asks for a resync on the control
//! subject ([`crate::BusConfig::resync_subject`]), e.g. after finding its
//! start point purged from the stream.

use crate::config::Bus;
use crate::message::{BusMessage, KIND_HEADER};
use crate::subject::subject;
use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::publish::PublishAck;
use futures::StreamExt;
use futures::stream::FuturesOrdered;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Producer bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerLimits {
    /// Messages buffered while the bus is down or slow; more are dropped
    /// (counted) and trigger a resync.
    pub buffer: usize,
    /// Publishes awaiting their ack.
    pub max_in_flight: usize,
    /// How long shutdown waits for the buffer to drain.
    pub drain_timeout: Duration,
}

impl Default for ProducerLimits {
    fn default() -> Self {
        Self {
            buffer: 65_536,
            max_in_flight: 256,
            drain_timeout: Duration::from_secs(5),
        }
    }
}

/// Producer counters (monotonic) and state.
#[derive(Debug, Default)]
pub struct ProducerStats {
    /// Messages handed to the connection.
    pub published: AtomicU64,
    /// Messages the stream acknowledged.
    pub acked: AtomicU64,
    /// Messages dropped because the buffer was full.
    pub dropped: AtomicU64,
    /// Publishes that failed or whose ack failed or timed out.
    pub failed: AtomicU64,
    /// Resyncs asked of the owner.
    pub resyncs: AtomicU64,
    /// Resync requests received on the control subject.
    pub resync_requests: AtomicU64,
    /// Messages waiting in the buffer.
    pub buffered: AtomicU64,
}

struct Shared {
    stats: ProducerStats,
    lost: AtomicBool,
    resync: watch::Sender<u64>,
    /// True once the publishing task has ended (buffer drained or timed out).
    finished: watch::Sender<bool>,
    /// Wakes the publishing task when `lost` is set from outside it.
    wake: tokio::sync::Notify,
    bus: Bus,
}

/// Handle to a running producer (cheap to clone).
#[derive(Clone)]
pub struct Producer {
    tx: mpsc::Sender<BusMessage>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer").finish_non_exhaustive()
    }
}

type AckFuture = Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>;

impl Producer {
    /// Starts the publishing task and the control-subject listener; both end
    /// with `cancel` (the buffer is drained first, bounded by
    /// [`ProducerLimits::drain_timeout`]).
    pub fn start(bus: Bus, limits: ProducerLimits, cancel: CancellationToken) -> Producer {
        let (tx, rx) = mpsc::channel(limits.buffer.max(1));
        let (resync, _) = watch::channel(0u64);
        let shared = Arc::new(Shared {
            stats: ProducerStats::default(),
            lost: AtomicBool::new(false),
            resync,
            wake: tokio::sync::Notify::new(),
            finished: watch::channel(false).0,
            bus,
        });
        let s = Arc::clone(&shared);
        let c = cancel.clone();
        tokio::spawn(async move {
            publish_loop(Arc::clone(&s), rx, limits, c).await;
            s.finished.send_replace(true);
        });
        tokio::spawn(control_loop(Arc::clone(&shared), cancel));
        Producer { tx, shared }
    }

    /// Queues a message; `false` when the buffer is full (the message is
    /// dropped, counted, and a resync will follow).
    pub fn try_send(&self, msg: BusMessage) -> bool {
        match self.tx.try_send(msg) {
            Ok(()) => {
                self.shared.stats.buffered.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(_) => {
                self.shared.stats.dropped.fetch_add(1, Ordering::Relaxed);
                self.shared.lost.store(true, Ordering::SeqCst);
                self.shared.wake.notify_one();
                false
            }
        }
    }

    /// Queues a message, waiting for buffer space.
    pub async fn send(&self, msg: BusMessage) -> bool {
        let ok = self.tx.send(msg).await.is_ok();
        if ok {
            self.shared.stats.buffered.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Waits until the publishing task has ended (after cancellation: the
    /// buffer is drained, bounded by [`ProducerLimits::drain_timeout`]).
    pub async fn finished(&self) {
        let mut rx = self.shared.finished.subscribe();
        let _ = rx.wait_for(|done| *done).await;
    }

    /// Counters.
    pub fn stats(&self) -> &ProducerStats {
        &self.shared.stats
    }

    /// Whether the bus connection is up.
    pub fn is_connected(&self) -> bool {
        self.shared.bus.is_connected()
    }

    /// Resync generation: moves on every time the owner must re-report its
    /// whole state.
    pub fn resyncs(&self) -> watch::Receiver<u64> {
        self.shared.resync.subscribe()
    }
}

async fn publish_loop(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<BusMessage>,
    limits: ProducerLimits,
    cancel: CancellationToken,
) {
    let bus = shared.bus.clone();
    let stats = &shared.stats;
    let mut in_flight: FuturesOrdered<AckFuture> = FuturesOrdered::new();
    let mut need_stream = true;
    let mut deadline: Option<tokio::time::Instant> = None;
    let max = limits.max_in_flight.max(1);
    loop {
        if deadline.is_none() && cancel.is_cancelled() {
            deadline = Some(tokio::time::Instant::now() + limits.drain_timeout);
            rx.close();
        }
        let connected = bus.is_connected();
        if connected && need_stream {
            match bus.stream().await {
                Ok(_) => need_stream = false,
                Err(e) => tracing::debug!(error = %e, "bus_stream_not_ready"),
            }
        }
        if connected
            && !need_stream
            && in_flight.is_empty()
            && shared.lost.swap(false, Ordering::SeqCst)
        {
            let n = stats.resyncs.fetch_add(1, Ordering::Relaxed) + 1;
            shared.resync.send_replace(n);
            tracing::info!(generation = n, "bus_producer_resync");
        }
        let ready = connected && !need_stream && in_flight.len() < max;
        let until =
            deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            biased;
            () = tokio::time::sleep_until(until), if deadline.is_some() => {
                let left = stats.buffered.load(Ordering::Relaxed);
                if left > 0 || !in_flight.is_empty() {
                    tracing::warn!(left, in_flight = in_flight.len(), "bus_producer_drain_timeout");
                }
                return;
            }
            () = cancel.cancelled(), if deadline.is_none() => {}
            Some(r) = in_flight.next(), if !in_flight.is_empty() => match r {
                Ok(_) => { stats.acked.fetch_add(1, Ordering::Relaxed); }
                Err(e) => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    shared.lost.store(true, Ordering::SeqCst);
                    need_stream = true;
                    tracing::warn!(error = %e, "bus_publish_ack_failed");
                }
            },
            m = rx.recv(), if ready => {
                let Some(m) = m else {
                    // Closed and drained: wait for the last acks, then stop.
                    while let Some(r) = in_flight.next().await {
                        if r.is_ok() { stats.acked.fetch_add(1, Ordering::Relaxed); }
                    }
                    return;
                };
                stats.buffered.fetch_sub(1, Ordering::Relaxed);
                let subj = subject(&bus.config.subject_prefix, m.tenant(), m.model());
                let mut headers = async_nats::HeaderMap::new();
                headers.insert(KIND_HEADER, m.kind());
                match bus.js.publish_with_headers(subj, headers, m.encode_body()).await {
                    Ok(ack) => {
                        stats.published.fetch_add(1, Ordering::Relaxed);
                        in_flight.push_back(ack.into_future());
                    }
                    Err(e) => {
                        stats.failed.fetch_add(1, Ordering::Relaxed);
                        shared.lost.store(true, Ordering::SeqCst);
                        need_stream = true;
                        tracing::warn!(error = %e, "bus_publish_failed");
                    }
                }
            }
            () = shared.wake.notified() => {}
            () = tokio::time::sleep(Duration::from_millis(50)), if !ready => {}
        }
    }
}

/// Listens for resync requests on the control subject.
async fn control_loop(shared: Arc<Shared>, cancel: CancellationToken) {
    let subject = shared.bus.config.resync_subject();
    let mut sub = loop {
        match shared.bus.client.subscribe(subject.clone()).await {
            Ok(s) => break s,
            Err(e) => {
                tracing::debug!(error = %e, "bus_control_subscribe_failed");
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    };
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            m = sub.next() => {
                let Some(m) = m else { return };
                shared.stats.resync_requests.fetch_add(1, Ordering::Relaxed);
                tracing::info!(from = %String::from_utf8_lossy(&m.payload), "bus_resync_requested");
                shared.lost.store(true, Ordering::SeqCst);
                shared.wake.notify_one();
            }
        }
    }
}

/// Asks every producer listening on the control subject for a full resync.
pub async fn request_resync(bus: &Bus, why: &str) -> Result<(), crate::BusError> {
    bus.client
        .publish(bus.config.resync_subject(), why.to_owned().into())
        .await
        .map_err(|e| crate::BusError::Publish(e.to_string()))?;
    bus.client
        .flush()
        .await
        .map_err(|e| crate::BusError::Publish(e.to_string()))
}

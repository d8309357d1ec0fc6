//! Forwarding to the policy server: the event loop that owns the replica's
//! state and the gRPC client.
//!
//! # Ordering
//!
//! Reports go on **one long-lived `ReportCacheState` client stream**; the
//! server ingests each message as it arrives but acknowledges only when the
//! stream ends. Evictions and clears are unary `PublishEvent`s, which the
//! server handles on other HTTP/2 streams, so a report still in flight on the
//! stream could be ingested *after* a later eviction of the same key. Hence:
//!
//! - each `--window` is compacted first (last operation per key wins,
//!   [`Outbox`]), so a window's evictions and reports name disjoint keys;
//! - before an eviction or clear, if the stream carried reports that are not
//!   acknowledged yet, the stream is closed and its `Ack` awaited (the only
//!   proof of ingestion), then reopened for the next reports;
//! - evictions are pipelined (at most `max_in_flight` at once) and all
//!   acknowledged before the window's reports are sent;
//! - a clear is acknowledged before anything after it is sent.
//!
//! So the stream lives as long as the engine only stores, and is cut at
//! window boundaries only when an eviction must not overtake a report; it is
//! reopened at the next tick even when idle, because its failure is how a
//! restarted server is noticed (HTTP/2 keepalive covers a vanished host).
//!
//! # Timestamps
//!
//! Every message carries `timestamp_us = 0`, the server's "now", not the
//! engine batch time: a replay at startup delivers batches that may be
//! minutes old for blocks that are still cached, and since removals are
//! tracked exactly, "still held as of now" is what the sidecar knows. Engine
//! time would make those blocks look stale (or past the TTL) at once.
//!
//! # Failure and resync
//!
//! Any failed or timed-out RPC, a full stream buffer, or the server ending
//! the stream marks the server unreachable: buffered updates are discarded
//! (counted in `send_overflow`), and reconnects are tried with exponential
//! backoff and jitter. Every (re)connect is a **resync**: `ALL_CLEARED` for
//! the replica (acknowledged), then every tracked block
//! ([`ReplicaState::current_reports`]). That repairs whatever was lost —
//! a restarted server, dropped evictions during a partition, a stale entry
//! from a previous sidecar — at the cost of this replica's hints being absent
//! for the few milliseconds the resync takes (a missed hint, never a false
//! one). While unreachable, nothing is buffered: the replica state itself is
//! the buffer.

pub mod backoff;
pub mod channel;
pub mod messages;
pub mod outbox;
mod stream;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use inferencecache_proto::v1alpha1::CacheEvent;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::error::SidecarError;
use crate::mapping::Update;
use crate::metrics::SidecarMetrics;
use crate::replica::ReplicaState;
use crate::stats::EngineStats;
use crate::transport::{Delivery, TransportStatus};
pub use backoff::Backoff;
pub use channel::{ServerTls, connect_lazy, server_uri};
pub use messages::Identity;
pub use outbox::{Flush, Outbox};
use stream::ReportStream;

/// Forwarding settings.
#[derive(Debug, Clone)]
pub struct ForwardConfig {
    /// `--server`: `host:port` or a URI.
    pub server: String,
    /// TLS to the server, if any.
    pub tls: Option<ServerTls>,
    /// Fields every message carries.
    pub identity: Identity,
    /// `--window`: reports are batched this long.
    pub window: Duration,
    /// Distinct buffered keys that force an early flush; also the most
    /// prefixes per `CacheStateUpdate`.
    pub max_batch: usize,
    /// `PublishEvent`s in flight at most.
    pub max_in_flight: usize,
    /// Timeout of every RPC (and of a stream send waiting for buffer space).
    pub rpc_timeout: Duration,
    /// First reconnect delay.
    pub backoff_initial: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// Messages buffered towards the report stream.
    pub stream_buffer: usize,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        Self {
            server: "127.0.0.1:9090".to_owned(),
            tls: None,
            identity: Identity::default(),
            window: Duration::from_millis(100),
            max_batch: 4096,
            max_in_flight: 64,
            rpc_timeout: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            stream_buffer: 64,
        }
    }
}

/// Why a send did not go through (the server is then treated as unreachable).
#[derive(Debug)]
struct SendFailed {
    rpc: &'static str,
    reason: String,
}

/// The event loop's inputs besides the configuration.
pub struct Inputs {
    /// The replica state (empty at start).
    pub state: ReplicaState,
    /// Deliveries from every rank's transport.
    pub deliveries: mpsc::Receiver<Delivery>,
    /// Stats samples from the stats path.
    pub stats: mpsc::Receiver<EngineStats>,
    /// Each rank's transport status, for metrics.
    pub transports: Vec<(u32, Arc<TransportStatus>)>,
}

struct Forwarder {
    config: ForwardConfig,
    client: InferenceCacheClient<Channel>,
    metrics: Arc<SidecarMetrics>,
    outbox: Outbox,
    stream: Option<ReportStream>,
    /// Reports sent on the current stream and not yet acknowledged.
    dirty: bool,
    connected: bool,
    backoff: Backoff,
    next_attempt: Instant,
}

/// Runs the event path until `cancel` fires or every transport is gone,
/// then flushes what it can (bounded by the RPC timeout) and closes the
/// stream.
pub async fn run(
    config: ForwardConfig,
    inputs: Inputs,
    metrics: Arc<SidecarMetrics>,
    cancel: CancellationToken,
) -> Result<(), SidecarError> {
    let channel = connect_lazy(&config.server, config.tls.as_ref(), config.rpc_timeout)?;
    let Inputs {
        mut state,
        mut deliveries,
        mut stats,
        transports,
    } = inputs;
    let mut fw = Forwarder {
        client: InferenceCacheClient::new(channel),
        backoff: Backoff::new(config.backoff_initial, config.backoff_max),
        config,
        metrics,
        outbox: Outbox::default(),
        stream: None,
        dirty: false,
        connected: false,
        next_attempt: Instant::now(),
    };
    fw.metrics.set_server_up(false);
    let mut tick = tokio::time::interval(fw.config.window);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut updates: Vec<Update> = Vec::new();
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            failure = stream::failed(&mut fw.stream) => {
                fw.disconnect(SendFailed { rpc: "ReportCacheState", reason: failure });
            }
            d = deliveries.recv() => {
                let Some(d) = d else { break };
                updates.clear();
                state.handle(&d, &mut updates);
                let (tracked, pending) = state.mappings().fold((0, 0), |(t, p), (_, m)| {
                    (t + m.tracked_blocks(), p + m.pending_blocks())
                });
                fw.metrics.sync_totals(
                    state.stats(),
                    state.mappings().map(|(_, m)| m.stats()),
                    tracked,
                    pending,
                );
                // While unreachable nothing is buffered: the resync sends
                // the state these updates were applied to.
                if fw.connected {
                    fw.outbox.push_all(updates.drain(..));
                    if fw.outbox.len() >= fw.config.max_batch {
                        fw.flush().await;
                    }
                }
            }
            _ = tick.tick() => {
                fw.metrics.sync_transports(&transports);
                if fw.connected {
                    fw.flush().await;
                    // An idle sidecar must still notice a restarted server:
                    // the open stream fails when the connection does.
                    if fw.connected && fw.stream.is_none() {
                        fw.stream = Some(ReportStream::open(&fw.client, fw.config.stream_buffer));
                    }
                } else if Instant::now() >= fw.next_attempt {
                    fw.resync(&state).await;
                }
            }
            Some(s) = stats.recv() => {
                if fw.connected {
                    let msg = fw.config.identity.stats_update(&s);
                    // Stats carry no prefixes: an eviction need not wait for them.
                    let dirty = fw.dirty;
                    match fw.send_report(msg).await {
                        Ok(()) => fw.dirty = dirty,
                        Err(e) => fw.disconnect(e),
                    }
                }
            }
        }
    }
    if fw.connected {
        fw.flush().await;
        if let Err(e) = fw.close_stream().await {
            tracing::warn!(rpc = e.rpc, reason = %e.reason, "final stream close failed");
        }
    }
    fw.metrics.set_server_up(false);
    Ok(())
}

impl Forwarder {
    fn disconnect(&mut self, why: SendFailed) {
        let discarded = self.outbox.len() as u64;
        self.outbox.discard();
        self.stream = None;
        self.dirty = false;
        self.metrics
            .rpc_errors
            .get_or_create(&[("rpc", why.rpc)])
            .inc();
        if discarded > 0 {
            self.metrics.send_overflow.inc_by(discarded);
        }
        let delay = self.backoff.next_delay();
        self.next_attempt = Instant::now() + delay;
        if self.connected {
            tracing::warn!(server = %self.config.server, rpc = why.rpc, reason = %why.reason, discarded, retry_in_ms = delay.as_millis() as u64, "server unreachable; will resync when it is back");
        } else {
            tracing::debug!(server = %self.config.server, rpc = why.rpc, reason = %why.reason, retry_in_ms = delay.as_millis() as u64, "server still unreachable");
        }
        self.connected = false;
        self.metrics.set_server_up(false);
    }

    /// `ALL_CLEARED`, then the full state; on success the server is up.
    async fn resync(&mut self, state: &ReplicaState) {
        self.outbox.discard();
        let result = async {
            self.publish(self.config.identity.all_cleared()).await?;
            let reports = state.current_reports();
            for chunk in reports.chunks(self.config.max_batch.max(1)) {
                let msg = self.config.identity.update(chunk);
                self.send_report(msg).await?;
            }
            Ok::<usize, SendFailed>(reports.len())
        }
        .await;
        match result {
            Ok(blocks) => {
                self.connected = true;
                self.backoff.reset();
                self.metrics.resyncs.inc();
                self.metrics.set_server_up(true);
                tracing::info!(server = %self.config.server, blocks, "server connected; full state re-reported");
            }
            Err(e) => {
                // `connected` is false: logs at debug, schedules the retry.
                self.disconnect(e);
            }
        }
    }

    /// Sends the compacted window: clear → evictions → reports.
    async fn flush(&mut self) {
        if self.outbox.is_empty() {
            return;
        }
        let f = self.outbox.take();
        let total = (f.evicts.len() + f.reports.len() + usize::from(f.clear)) as u64;
        if let Err(e) = self.send_flush(&f).await {
            self.metrics.send_overflow.inc_by(total);
            self.disconnect(e);
        }
    }

    async fn send_flush(&mut self, f: &Flush) -> Result<(), SendFailed> {
        if f.clear {
            self.close_stream().await?;
            self.publish(self.config.identity.all_cleared()).await?;
        }
        if !f.evicts.is_empty() {
            if self.dirty {
                self.close_stream().await?;
            }
            let identity = &self.config.identity;
            let events: Vec<CacheEvent> = f.evicts.iter().map(|e| identity.evicted(e)).collect();
            let mut results = futures::stream::iter(events)
                .map(|ev| self.publish(ev))
                .buffer_unordered(self.config.max_in_flight.max(1));
            while let Some(r) = results.next().await {
                r?;
            }
        }
        for chunk in f.reports.chunks(self.config.max_batch.max(1)) {
            let msg = self.config.identity.update(chunk);
            self.send_report(msg).await?;
        }
        Ok(())
    }

    async fn publish(&self, ev: CacheEvent) -> Result<(), SendFailed> {
        let started = Instant::now();
        let mut client = self.client.clone();
        let fail = |reason: String| SendFailed {
            rpc: "PublishEvent",
            reason,
        };
        let ack = tokio::time::timeout(self.config.rpc_timeout, client.publish_event(ev))
            .await
            .map_err(|_| fail("timed out".into()))?
            .map_err(|s| fail(format!("{}: {}", s.code(), s.message())))?
            .into_inner();
        self.record("PublishEvent", started);
        if ack.accepted {
            Ok(())
        } else {
            Err(fail(format!("not accepted ({})", ack.reason_code)))
        }
    }

    async fn send_report(
        &mut self,
        msg: inferencecache_proto::v1alpha1::CacheStateUpdate,
    ) -> Result<(), SendFailed> {
        let started = Instant::now();
        let stream = match &mut self.stream {
            Some(s) => s,
            None => self
                .stream
                .insert(ReportStream::open(&self.client, self.config.stream_buffer)),
        };
        stream
            .send(msg, self.config.rpc_timeout)
            .await
            .map_err(|reason| SendFailed {
                rpc: "ReportCacheState",
                reason,
            })?;
        self.dirty = true;
        self.record("ReportCacheState", started);
        Ok(())
    }

    /// Ends the stream and waits for its `Ack`: afterwards every report sent
    /// on it is ingested.
    async fn close_stream(&mut self) -> Result<(), SendFailed> {
        let Some(s) = self.stream.take() else {
            return Ok(());
        };
        let started = Instant::now();
        s.close(self.config.rpc_timeout)
            .await
            .map_err(|reason| SendFailed {
                rpc: "ReportCacheState",
                reason,
            })?;
        self.dirty = false;
        self.record("ReportCacheState_ack", started);
        Ok(())
    }

    fn record(&self, rpc: &'static str, started: Instant) {
        self.metrics.sent.get_or_create(&[("rpc", rpc)]).inc();
        self.metrics
            .send_latency
            .get_or_create(&[("rpc", rpc)])
            .observe(started.elapsed().as_secs_f64());
    }
}

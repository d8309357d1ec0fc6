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
//!   [`Outbox`]), so a window's evictions and reports name disjoint keys,
//!   and its reports can go first;
//! - before a window's evictions are queued, if the stream carried reports
//!   of any evicted key that are not acknowledged yet, the stream is closed
//!   and its `Ack` awaited (the only proof of ingestion), then reopened for
//!   the next reports; evictions of keys not reported since the last `Ack`
//!   (the usual case: an engine evicts other prompts' blocks) are queued at
//!   once;
//! - queued evictions are sent in the background, pipelined (at most
//!   `max_in_flight` at once, [`evictions`]), while the loop goes on; a
//!   later report of a key whose eviction is still queued drops that
//!   eviction (the re-store supersedes it), and one whose eviction is in
//!   flight waits for it;
//! - a clear drops the queued evictions, waits for those in flight, and is
//!   acknowledged before anything after it is sent.
//!
//! A window ends early when an engine batch removes anything (an eviction
//! or a clear): removals are flushed as they arrive, with the reports
//! before them, so a lookup stops hinting a block within an RPC of its
//! removal rather than after up to a window. Not while the engine's
//! history is on its way to a router that waits for it
//! (`ForwardConfig::caught_up`, which ignores the engine's claims until
//! then): the history is one window, compacted (a prefix-cache reset in
//! it drops everything before), sent when the last rank's replay has
//! ended, or earlier only when `max_batch` keys wait.
//!
//! So the stream lives as long as the engine only stores, and is cut at
//! window boundaries only when an eviction must not overtake a report; it is
//! reopened at the next tick even when idle, because its failure is how a
//! restarted server is noticed (HTTP/2 keepalive covers a vanished host).
//! At most `max_evict_backlog` evictions wait; past that a flush waits for
//! the server, and the loop stops reading engine events meanwhile.
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
//!
//! # Producer auth and ingest limits
//!
//! With `--server-token-file` every call carries `authorization: Bearer`,
//! the file re-read on every reconnect and at most a minute apart
//! ([`token`]). A server over this producer's ingest limit answers
//! `RESOURCE_EXHAUSTED` with `grpc-retry-pushback-ms`: the sidecar treats it
//! like any failure (disconnect, then resync) but waits at least the hint,
//! and a throttled resync waits out each hint and goes on where it stopped
//! (its chunks are acknowledged one by one), so nothing is lost.

pub mod backoff;
pub mod bus;
pub mod channel;
mod config;
mod evictions;
mod link;
pub mod messages;
pub mod outbox;
mod stream;
pub mod thread;
pub mod token;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use inferencecache_proto::v1alpha1::{Ack, CacheEvent};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::SidecarError;
use crate::mapping::Update;
use crate::metrics::SidecarMetrics;
use crate::replica::ReplicaState;
use crate::stats::StatsSignal;
use crate::transport::{Delivery, TransportStatus};
pub use backoff::Backoff;
pub use channel::{ServerTls, connect_lazy, server_uri};
pub use config::ForwardConfig;
use evictions::Evictions;
pub use link::LocalServer;
use link::ServerLink;
pub use messages::Identity;
pub use outbox::{Flush, Outbox};
use stream::ReportStream;
pub use token::{BearerToken, ServerClient};

/// A report at least this often (an empty one when there is nothing else):
/// the server withdraws a heartbeating producer's replica after
/// `--producer-silence` (10 s by default) without one.
pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(2);

/// Keys remembered per report stream before any eviction has to wait for
/// the stream's `Ack` again (bounds the set on a long-lived stream).
const MAX_UNACKED_KEYS: usize = 1 << 16;

/// Most ingest-limit pushbacks one resync waits out before it gives up and
/// the reconnect backoff takes over.
const MAX_RESYNC_PUSHBACKS: u32 = 64;

/// Why a send did not go through (the server is then treated as unreachable).
#[derive(Debug)]
struct SendFailed {
    rpc: &'static str,
    reason: String,
    /// The server's `grpc-retry-pushback-ms` (an ingest limit): the next
    /// attempt waits at least this long.
    retry_after: Option<std::time::Duration>,
}

impl SendFailed {
    fn new(rpc: &'static str, reason: String) -> Self {
        Self {
            rpc,
            reason,
            retry_after: None,
        }
    }

    fn status(rpc: &'static str, s: &tonic::Status) -> Self {
        Self {
            rpc,
            reason: format!("{}: {}", s.code(), s.message()),
            retry_after: inferencecache_proto::retry_pushback(s),
        }
    }
}

/// A unary call's outcome, bounded by a timeout, as a send result.
fn check_ack(
    rpc: &'static str,
    r: Result<Result<Ack, tonic::Status>, tokio::time::error::Elapsed>,
) -> Result<(), SendFailed> {
    let ack = r
        .map_err(|_| SendFailed::new(rpc, "timed out".into()))?
        .map_err(|s| SendFailed::status(rpc, &s))?;
    if ack.accepted {
        Ok(())
    } else {
        Err(SendFailed::new(
            rpc,
            format!("not accepted ({})", ack.reason_code),
        ))
    }
}

/// Whether `updates` remove anything (an eviction or a clear).
fn has_removal(updates: &[Update]) -> bool {
    updates
        .iter()
        .any(|u| matches!(u, Update::Evict(_) | Update::AllCleared))
}

/// The event loop's inputs besides the configuration.
pub struct Inputs {
    /// The replica state (empty at start).
    pub state: ReplicaState,
    /// Deliveries from every rank's transport.
    pub deliveries: mpsc::Receiver<Delivery>,
    /// Stats samples and engine liveness from the stats path.
    pub stats: mpsc::Receiver<StatsSignal>,
    /// Each rank's transport status, for metrics.
    pub transports: Vec<(u32, Arc<TransportStatus>)>,
}

struct Forwarder {
    config: ForwardConfig,
    client: ServerLink,
    token: BearerToken,
    metrics: Arc<SidecarMetrics>,
    outbox: Outbox,
    evictions: Evictions,
    stream: Option<ReportStream>,
    /// Reports sent on the current stream and not yet acknowledged.
    dirty: bool,
    /// Keys reported on the current stream since its last `Ack` (`None`
    /// past [`MAX_UNACKED_KEYS`]: any eviction then waits for the `Ack`).
    unacked: Option<HashSet<(u64, Arc<str>)>>,
    connected: bool,
    backoff: Backoff,
    next_attempt: Instant,
    /// When a report last went out (heartbeats fill the gaps).
    last_report: Instant,
    /// The engine's metrics are dead past the grace: the server holds
    /// nothing of this replica, and engine events only update the state
    /// (the resync when the engine answers again sends it).
    withdrawn: bool,
    /// When the first engine batch with removals in the outbox arrived (the
    /// eviction-visibility histogram starts there).
    removal_received: Option<Instant>,
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
    let token = BearerToken::new(config.token_file.clone());
    let client = match &config.local {
        Some(server) => ServerLink::Local(Arc::clone(server)),
        None => {
            let channel = connect_lazy(&config.server, config.tls.as_ref(), config.rpc_timeout)?;
            ServerLink::Grpc(token::client(channel, token.clone()))
        }
    };
    let Inputs {
        mut state,
        mut deliveries,
        mut stats,
        transports,
    } = inputs;
    let evictions = Evictions::new(
        client.clone(),
        config.identity.clone(),
        config.rpc_timeout,
        config.max_in_flight,
        Arc::clone(&metrics),
    );
    let mut fw = Forwarder {
        client,
        token,
        backoff: Backoff::new(config.backoff_initial, config.backoff_max),
        config,
        metrics,
        outbox: Outbox::default(),
        evictions,
        stream: None,
        dirty: false,
        unacked: Some(HashSet::new()),
        connected: false,
        next_attempt: Instant::now(),
        last_report: Instant::now(),
        withdrawn: false,
        removal_received: None,
    };
    fw.metrics.set_server_up(false);
    let mut tick = tokio::time::interval(fw.config.window);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut updates: Vec<Update> = Vec::new();
    let mut history = History::new(
        fw.config.caught_up.clone(),
        transports.iter().map(|(rank, _)| *rank),
    );
    loop {
        if history.due() && fw.connected {
            fw.confirm_history(&mut history).await;
        }
        tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            failure = stream::failed(&mut fw.stream) => {
                fw.disconnect(failure);
            }
            done = fw.evictions.next() => {
                if let Err(e) = done {
                    fw.disconnect(e);
                }
            }
            d = deliveries.recv() => {
                let Some(d) = d else { break };
                let received = Instant::now();
                history.delivered(&d);
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
                // While unreachable (or withdrawn) nothing is buffered: the
                // resync sends the state these updates were applied to.
                if fw.connected && !fw.withdrawn {
                    // Removals leave at once, with the stores before them:
                    // until the server drops a block, lookups hint a replica
                    // that no longer holds it. Stores alone wait for the
                    // window (a late store is a missed hint, not a false one).
                    // Not while the history is on its way: the router
                    // ignores this engine's claims until it is confirmed,
                    // and a replay flushed removal by removal waited for a
                    // report-stream `Ack` per engine batch (the gateway
                    // opened its 4-client passes still catching up, runs
                    // G4-G5). Compacted into windows, a history's resets
                    // also drop everything stored before them.
                    let urgent = has_removal(&updates) && !history.pending();
                    if urgent {
                        fw.removal_received.get_or_insert(received);
                    }
                    fw.outbox.push_all(updates.drain(..));
                    if urgent || fw.outbox.len() >= fw.config.max_batch {
                        fw.flush().await;
                    }
                }
            }
            _ = tick.tick() => {
                fw.metrics.sync_transports(&transports);
                if fw.connected {
                    if let Err(e) = fw.token.refresh_if_stale() {
                        tracing::warn!(error = %e, "token file unreadable; keeping the last token");
                    }
                    // A history on its way goes in one window, at its
                    // confirmation (or when `max_batch` keys are buffered).
                    if !history.pending() {
                        fw.flush().await;
                    }
                    // An idle sidecar must still notice a restarted server:
                    // the open stream fails when the connection does.
                    if fw.connected && fw.stream.is_none() {
                        fw.stream = Some(ReportStream::open(&fw.client, fw.config.stream_buffer));
                    }
                    if fw.connected && fw.last_report.elapsed() >= HEARTBEAT {
                        let msg = fw.config.identity.heartbeat(state.block_size());
                        // Like stats, a heartbeat need not hold evictions back.
                        let dirty = fw.dirty;
                        match fw.send_report(msg).await {
                            Ok(()) => fw.dirty = dirty,
                            Err(e) => fw.disconnect(e),
                        }
                    }
                } else if Instant::now() >= fw.next_attempt {
                    fw.resync(&state).await;
                }
            }
            Some(signal) = stats.recv() => {
                let s = match signal {
                    StatsSignal::EngineDown => {
                        fw.withdraw().await;
                        continue;
                    }
                    StatsSignal::Sample(s) => s,
                };
                if fw.withdrawn {
                    fw.withdrawn = false;
                    // Back: the full state, as after a reconnect.
                    if fw.connected {
                        fw.resync(&state).await;
                    }
                }
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
        let timeout = fw.config.rpc_timeout;
        let drained = tokio::time::timeout(timeout, fw.evictions.drain_all()).await;
        if let Ok(Err(e)) = drained {
            tracing::warn!(rpc = e.rpc, reason = %e.reason, "final evictions failed");
        } else if drained.is_err() {
            tracing::warn!(left = fw.evictions.backlog(), "final evictions timed out");
        }
        if let Err(e) = fw.close_stream().await {
            tracing::warn!(rpc = e.rpc, reason = %e.reason, "final stream close failed");
        }
    }
    fw.metrics.set_server_up(false);
    Ok(())
}

/// Whether every rank's history (its first [`Delivery::CaughtUp`]) has
/// been applied, and whether the server has acknowledged it yet.
struct History {
    signal: Option<crate::sequence::CaughtUpSignal>,
    waiting: std::collections::BTreeSet<u32>,
}

impl History {
    fn new(
        signal: Option<crate::sequence::CaughtUpSignal>,
        ranks: impl Iterator<Item = u32>,
    ) -> Self {
        Self {
            signal: signal.filter(|s| !s.is_set()),
            waiting: ranks.collect(),
        }
    }

    fn delivered(&mut self, d: &Delivery) {
        if let Delivery::CaughtUp { rank } = d {
            self.waiting.remove(rank);
        }
    }

    /// The history is not confirmed yet: a router waits for the signal
    /// (and ignores this engine's claims until then). Not once the router
    /// gave up waiting and set the signal itself.
    fn pending(&self) -> bool {
        self.signal.as_ref().is_some_and(|s| !s.is_set())
    }

    /// Applied everywhere, not yet confirmed.
    fn due(&self) -> bool {
        self.waiting.is_empty() && self.pending()
    }
}

impl Forwarder {
    /// Sends what is buffered and waits for the server's acknowledgement of
    /// everything sent (evictions drained, the report stream's `Ack`): then
    /// the history is in the server's index and the signal is set. A
    /// failure disconnects; the resync that follows sends the whole state,
    /// and the next loop turn confirms again.
    async fn confirm_history(&mut self, history: &mut History) {
        self.flush().await;
        if !self.connected {
            return;
        }
        let acked = async {
            self.evictions.drain_all().await?;
            self.close_stream().await
        }
        .await;
        match acked {
            Ok(()) => {
                if let Some(s) = history.signal.take() {
                    s.set();
                }
            }
            Err(e) => self.disconnect(e),
        }
    }

    /// The engine is gone or hung (its metrics dead past the grace): the
    /// server drops every block of the replica (`ALL_CLEARED`, ordered after
    /// whatever is in flight), so no hint sends requests to it.
    async fn withdraw(&mut self) {
        if self.withdrawn {
            return;
        }
        self.withdrawn = true;
        if self.connected {
            self.outbox.discard();
            self.outbox.push(Update::AllCleared);
            self.flush().await;
        }
        // Unreachable: the reconnect's resync sends the clear alone.
    }

    fn disconnect(&mut self, why: SendFailed) {
        let discarded = self.outbox.len() as u64 + self.evictions.discard();
        self.outbox.discard();
        self.removal_received = None;
        self.stream = None;
        self.dirty = false;
        self.unacked = Some(HashSet::new());
        self.metrics
            .rpc_errors
            .get_or_create(&[("rpc", why.rpc)])
            .inc();
        if discarded > 0 {
            self.metrics.send_overflow.inc_by(discarded);
        }
        // An ingest limit's hint is a floor: retrying sooner is refused again.
        let delay = self
            .backoff
            .next_delay()
            .max(why.retry_after.unwrap_or_default());
        self.next_attempt = Instant::now() + delay;
        if why.retry_after.is_some() {
            self.metrics.throttled.inc();
        }
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
        self.evictions.discard();
        self.removal_received = None;
        let result = async {
            // A reconnect is when a rotated projected token is picked up.
            self.token
                .reload()
                .map_err(|reason| SendFailed::new("token", reason))?;
            // An ingest limit (the server's `grpc-retry-pushback-ms`) is
            // waited out and the refused part sent again: the state is the
            // buffer, so a throttled resync goes on where it stopped. Each
            // chunk is acknowledged before the next, which is where the
            // server's refusal (and its hint) arrives.
            let mut pushbacks = 0;
            while let Err(e) = self.publish(self.config.identity.all_cleared()).await {
                self.wait_pushback(e, &mut pushbacks).await?;
            }
            // Withdrawn: the clear alone; the engine's return resyncs.
            let reports = if self.withdrawn {
                Vec::new()
            } else {
                state.current_reports()
            };
            for chunk in reports.chunks(self.config.max_batch.max(1)) {
                loop {
                    let sent = async {
                        self.send_report(self.config.identity.update(chunk)).await?;
                        self.close_stream().await
                    }
                    .await;
                    match sent {
                        Ok(()) => break,
                        Err(e) => {
                            self.stream = None;
                            self.wait_pushback(e, &mut pushbacks).await?;
                        }
                    }
                }
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

    /// Waits out an ingest limit's retry hint during a resync; any other
    /// failure, or more than [`MAX_RESYNC_PUSHBACKS`], is returned.
    async fn wait_pushback(&self, e: SendFailed, waited: &mut u32) -> Result<(), SendFailed> {
        match e.retry_after {
            Some(hint) if *waited < MAX_RESYNC_PUSHBACKS => {
                *waited += 1;
                self.metrics.throttled.inc();
                tracing::debug!(
                    rpc = e.rpc,
                    retry_in_ms = hint.as_millis() as u64,
                    "resync throttled by the server's ingest limit"
                );
                tokio::time::sleep(hint).await;
                Ok(())
            }
            _ => Err(e),
        }
    }

    /// Sends the compacted window: clear → reports → evictions (queued).
    async fn flush(&mut self) {
        if self.outbox.is_empty() {
            return;
        }
        let f = self.outbox.take();
        let total = (f.evicts.len() + f.reports.len() + usize::from(f.clear)) as u64;
        if let Err(e) = self.send_flush(f).await {
            self.metrics.send_overflow.inc_by(total);
            self.disconnect(e);
        }
    }

    async fn send_flush(&mut self, f: Flush) -> Result<(), SendFailed> {
        // Taken by every flush: a clear-only flush must not leave its stamp
        // to a later eviction.
        let received = self.removal_received.take().unwrap_or_else(Instant::now);
        if f.clear {
            self.evictions.supersede_all();
            self.evictions.drain_in_flight().await?;
            self.close_stream().await?;
            self.publish(self.config.identity.all_cleared()).await?;
        }
        let mut wait = false;
        for r in &f.reports {
            wait |= self
                .evictions
                .supersede(&(r.prefix_hash, r.adapter.clone()));
        }
        if wait {
            self.evictions.drain_in_flight().await?;
        }
        if let Some(keys) = &mut self.unacked {
            keys.extend(f.reports.iter().map(|r| (r.prefix_hash, r.adapter.clone())));
            if keys.len() > MAX_UNACKED_KEYS {
                self.unacked = None;
            }
        }
        for chunk in f.reports.chunks(self.config.max_batch.max(1)) {
            let msg = self.config.identity.update(chunk);
            self.send_report(msg).await?;
        }
        if f.evicts.is_empty() {
            self.evictions.resume();
            return Ok(());
        }
        // Only an eviction of a key whose report may still be in flight on
        // the stream has to wait for the stream's Ack; the others (most: an
        // engine evicts other prompts' blocks) leave at once.
        let overtakes = self.unacked.as_ref().is_none_or(|keys| {
            f.evicts
                .iter()
                .any(|e| keys.contains(&(e.prefix_hash, e.adapter.clone())))
        });
        if self.dirty && overtakes {
            self.close_stream().await?;
        }
        self.evictions.extend(f.evicts, received);
        while self.evictions.backlog() > self.config.max_evict_backlog {
            self.evictions.next().await?;
        }
        Ok(())
    }

    async fn publish(&self, ev: CacheEvent) -> Result<(), SendFailed> {
        let started = Instant::now();
        check_ack(
            "PublishEvent",
            tokio::time::timeout(self.config.rpc_timeout, self.client.publish_event(ev)).await,
        )?;
        self.metrics.record_sent("PublishEvent", started);
        Ok(())
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
        stream.send(msg, self.config.rpc_timeout).await?;
        self.dirty = true;
        self.last_report = Instant::now();
        self.metrics.record_sent("ReportCacheState", started);
        Ok(())
    }

    /// Ends the stream and waits for its `Ack`: afterwards every report sent
    /// on it is ingested.
    async fn close_stream(&mut self) -> Result<(), SendFailed> {
        let Some(s) = self.stream.take() else {
            return Ok(());
        };
        let started = Instant::now();
        s.close(self.config.rpc_timeout).await?;
        self.dirty = false;
        self.unacked = Some(HashSet::new());
        self.metrics.record_sent("ReportCacheState_ack", started);
        Ok(())
    }
}

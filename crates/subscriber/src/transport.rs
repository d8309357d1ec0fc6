//! The ZMQ transport for one publisher (one data-parallel rank): a SUB socket
//! on the engine's PUB, a fresh DEALER per replay on its ROUTER, and the
//! [`Sequencer`] deciding what to apply.
//!
//! The caller receives [`Delivery`] values in order on a channel and must
//! handle each before reading the next: in particular it sends `ALL_CLEARED`
//! for [`Delivery::EngineRestarted`] and waits for the acknowledgement before
//! applying anything after it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::frames::{ReplayFrame, endpoint_for_rank, parse_live, parse_replay, replay_request};
use crate::sequence::{Action, ReplayId, Sequencer, SequencerConfig, payload_hash};

/// Transport settings for one data-parallel rank.
#[derive(Debug, Clone)]
pub struct TransportConfig {
    /// `--engine-endpoint` (rank 0's); the rank's port offset is applied here.
    pub engine_endpoint: String,
    /// `--replay-endpoint` (rank 0's); `None` disables replays.
    pub replay_endpoint: Option<String>,
    /// SUB subscription prefix; `""` for every topic.
    pub topic: String,
    /// Bind the SUB socket (the engine connects) instead of connecting.
    pub bind: bool,
    /// Data-parallel rank served by this transport.
    pub data_parallel_rank: u32,
    /// How long a replay may stay silent (connect, first reply, between
    /// replies) before it is given up: a malformed request gets no reply.
    pub replay_timeout: Duration,
    /// Pause between attempts to (re)connect or bind.
    pub retry_backoff: Duration,
    /// How long the engine's stream may stay disconnected before its blocks
    /// are withdrawn (`ALL_CLEARED`): past it the replica gets no hints
    /// until the engine is back and fully replayed. `None` keeps them.
    pub engine_down_grace: Option<Duration>,
    /// Sequencer bounds.
    pub sequencer: SequencerConfig,
    /// Live view of this rank's link and sequence counters, read by the
    /// sidecar's `/metrics` and `/readyz` while [`run`] updates it.
    pub status: Arc<TransportStatus>,
}

/// Default [`TransportConfig::engine_down_grace`]: long enough for a
/// reconnect after a network blip, short enough that a dead engine stops
/// getting hints within seconds.
pub const DEFAULT_ENGINE_DOWN_GRACE: Duration = Duration::from_secs(2);

/// What one rank's transport reports while it runs (lock-free, so the HTTP
/// endpoints never wait on the event path).
#[derive(Debug, Default)]
pub struct TransportStatus {
    /// The SUB socket has a live peer (connected or accepted, not since
    /// disconnected).
    pub connected: AtomicBool,
    /// Times the engine stayed disconnected past the grace and its blocks
    /// were withdrawn.
    pub withdrawals: AtomicU64,
    /// Messages applied (copied from [`SequenceStats`](crate::SequenceStats)).
    pub applied: AtomicU64,
    /// Messages lost for good.
    pub lost: AtomicU64,
    /// Engine restarts detected.
    pub restarts: AtomicU64,
    /// Replays requested.
    pub replays: AtomicU64,
    /// Replays that timed out.
    pub replay_timeouts: AtomicU64,
    /// Replayed duplicates skipped.
    pub duplicates: AtomicU64,
    /// Live messages dropped from the full replay buffer.
    pub buffer_overflow: AtomicU64,
    /// Gaps seen (live `seq > L+1`).
    pub gaps: AtomicU64,
    /// Live messages that were not `[topic, seq, payload]`.
    pub malformed: AtomicU64,
}

impl TransportStatus {
    fn copy_from(&self, s: &crate::SequenceStats) {
        self.applied.store(s.applied, Ordering::Relaxed);
        self.lost.store(s.lost, Ordering::Relaxed);
        self.restarts.store(s.restarts, Ordering::Relaxed);
        self.replays.store(s.replays, Ordering::Relaxed);
        self.replay_timeouts
            .store(s.replay_timeouts, Ordering::Relaxed);
        self.duplicates.store(s.duplicates, Ordering::Relaxed);
        self.buffer_overflow
            .store(s.buffer_overflow, Ordering::Relaxed);
    }
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            engine_endpoint: "tcp://127.0.0.1:5557".to_owned(),
            replay_endpoint: None,
            topic: String::new(),
            bind: false,
            data_parallel_rank: 0,
            replay_timeout: Duration::from_secs(5),
            retry_backoff: Duration::from_secs(1),
            engine_down_grace: Some(DEFAULT_ENGINE_DOWN_GRACE),
            sequencer: SequencerConfig::default(),
            status: Arc::default(),
        }
    }
}

/// What the caller must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// Decode and apply this batch.
    Apply {
        /// Data-parallel rank it came from.
        rank: u32,
        /// Its sequence number.
        seq: u64,
        /// msgpack `EventBatch`.
        payload: Bytes,
    },
    /// The engine restarted: send `ALL_CLEARED` (and wait for the ack), reset
    /// the mapping.
    EngineRestarted {
        /// Data-parallel rank.
        rank: u32,
    },
    /// Messages `from..=to` are unrecoverable.
    Lost {
        /// Data-parallel rank.
        rank: u32,
        /// First lost sequence number.
        from: u64,
        /// Last lost sequence number.
        to: u64,
    },
    /// No replay is running: held-back events can be dropped.
    CaughtUp {
        /// Data-parallel rank.
        rank: u32,
    },
}

/// Transport failures that end [`run`].
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// The endpoint cannot be offset for the rank.
    #[error("endpoint {endpoint:?} cannot be used for data-parallel rank {rank}")]
    Endpoint {
        /// The configured endpoint.
        endpoint: String,
        /// The rank.
        rank: u32,
    },
    /// The SUB socket could not be set up.
    #[error("zmq: {0}")]
    Zmq(#[from] zeromq::ZmqError),
    /// The receiver of deliveries went away.
    #[error("delivery channel closed")]
    Closed,
}

enum ReplayEvent {
    Frame(ReplayId, u64, Bytes),
    End(ReplayId),
    TimedOut(ReplayId),
}

/// Runs the transport for one rank until `cancel` fires or the delivery
/// channel closes. Reconnects are handled inside (the SUB socket retries by
/// itself; every reconnection triggers the sequencer's continuity check).
pub async fn run(
    config: TransportConfig,
    deliveries: mpsc::Sender<Delivery>,
    cancel: CancellationToken,
) -> Result<(), TransportError> {
    let rank = config.data_parallel_rank;
    let endpoint = endpoint_for_rank(&config.engine_endpoint, rank).ok_or_else(|| {
        TransportError::Endpoint {
            endpoint: config.engine_endpoint.clone(),
            rank,
        }
    })?;
    let replay_endpoint = match &config.replay_endpoint {
        Some(e) => Some(
            endpoint_for_rank(e, rank).ok_or_else(|| TransportError::Endpoint {
                endpoint: e.clone(),
                rank,
            })?,
        ),
        None => None,
    };

    let mut sub = SubSocket::new();
    let mut monitor = Some(sub.monitor());
    sub.subscribe(&config.topic).await?;
    loop {
        let attempt = if config.bind {
            sub.bind(&endpoint).await.map(|_| ())
        } else {
            sub.connect(&endpoint).await
        };
        match attempt {
            Ok(()) => break,
            Err(e) => {
                tracing::warn!(%endpoint, error = %e, bind = config.bind, "engine endpoint not ready; retrying");
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(config.retry_backoff) => {}
                }
            }
        }
    }
    tracing::info!(%endpoint, rank, bind = config.bind, "subscribed to engine KV events");
    let status = Arc::clone(&config.status);
    if !config.bind {
        // `connect` returns once the peer is there.
        status.connected.store(true, Ordering::Relaxed);
    }

    let mut seq_config = config.sequencer.clone();
    seq_config.replay_enabled = replay_endpoint.is_some();
    let mut sequencer: Sequencer<Bytes> = Sequencer::new(seq_config);
    let (replay_tx, mut replay_rx) = mpsc::channel::<ReplayEvent>(1024);
    let ctx = Ctx {
        rank,
        deliveries: &deliveries,
        replay_endpoint: replay_endpoint.as_deref(),
        replay_timeout: config.replay_timeout,
        replay_tx: &replay_tx,
        cancel: &cancel,
    };
    ctx.handle(sequencer.start()).await?;
    // Connect mode: `connect` returned connected, so the first Connected event
    // is the initial one. Bind mode: the first Accepted is.
    let mut seen_connection = false;
    // When a disconnected engine's blocks are withdrawn, unless it is back.
    let mut withdraw_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            () = sleep_until(withdraw_at) => {
                withdraw_at = None;
                tracing::warn!(%endpoint, rank, grace_ms = config.engine_down_grace.unwrap_or_default().as_millis() as u64, "engine unreachable past the grace: its blocks are withdrawn (ALL_CLEARED) until it is back and replayed");
                status.withdrawals.fetch_add(1, Ordering::Relaxed);
                ctx.handle(sequencer.engine_down()).await?;
            }
            msg = sub.recv() => match msg {
                Ok(msg) => {
                    let frames = msg.into_vec();
                    match parse_live(&frames) {
                        Some(f) => {
                            if sequencer.last_applied().is_some_and(|l| f.seq > l.saturating_add(1)) {
                                status.gaps.fetch_add(1, Ordering::Relaxed);
                            }
                            let hash = payload_hash(&f.payload);
                            ctx.handle(sequencer.live(f.seq, hash, f.payload)).await?;
                        }
                        None => {
                            status.malformed.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(frames = frames.len(), "malformed live message skipped");
                        }
                    }
                }
                Err(e) => {
                    // The peer went away; the socket reconnects by itself.
                    tracing::debug!(error = %e, "SUB receive failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            ev = next_event(&mut monitor) => match ev {
                Some(SocketEvent::Connected(..) | SocketEvent::Accepted(..)) => {
                    status.connected.store(true, Ordering::Relaxed);
                    withdraw_at = None;
                    if seen_connection {
                        tracing::info!(%endpoint, "reconnected to the engine; checking continuity");
                        ctx.handle(sequencer.reconnected()).await?;
                    }
                    seen_connection = true;
                }
                Some(SocketEvent::Disconnected(_)) => {
                    status.connected.store(false, Ordering::Relaxed);
                    tracing::info!(%endpoint, "engine disconnected");
                    if withdraw_at.is_none() {
                        withdraw_at = config
                            .engine_down_grace
                            .map(|g| tokio::time::Instant::now() + g);
                    }
                }
                Some(_) => {}
                None => monitor = None,
            },
            Some(ev) = replay_rx.recv() => {
                let actions = match ev {
                    ReplayEvent::Frame(id, seq, payload) => {
                        let hash = payload_hash(&payload);
                        sequencer.replayed(id, seq, hash, payload)
                    }
                    ReplayEvent::End(id) => sequencer.replay_ended(id),
                    ReplayEvent::TimedOut(id) => {
                        tracing::warn!(rank, replay = id, "replay timed out");
                        sequencer.replay_timed_out(id)
                    }
                };
                ctx.handle(actions).await?;
            }
        }
        status.copy_from(sequencer.stats());
    }
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn next_event(
    monitor: &mut Option<futures::channel::mpsc::Receiver<SocketEvent>>,
) -> Option<SocketEvent> {
    match monitor {
        Some(m) => m.next().await,
        None => std::future::pending().await,
    }
}

struct Ctx<'a> {
    rank: u32,
    deliveries: &'a mpsc::Sender<Delivery>,
    replay_endpoint: Option<&'a str>,
    replay_timeout: Duration,
    replay_tx: &'a mpsc::Sender<ReplayEvent>,
    cancel: &'a CancellationToken,
}

impl Ctx<'_> {
    async fn handle(&self, actions: Vec<Action<Bytes>>) -> Result<(), TransportError> {
        let rank = self.rank;
        for action in actions {
            let delivery = match action {
                Action::Apply { seq, payload } => Delivery::Apply { rank, seq, payload },
                Action::EngineRestarted => {
                    tracing::warn!(
                        rank,
                        "engine restart detected (sequence went backwards or continuity check failed)"
                    );
                    Delivery::EngineRestarted { rank }
                }
                Action::Lost { from, to } => {
                    tracing::warn!(rank, from, to, "engine messages lost (not replayable)");
                    Delivery::Lost { rank, from, to }
                }
                Action::CaughtUp => Delivery::CaughtUp { rank },
                Action::RequestReplay { id, from } => {
                    if let Some(endpoint) = self.replay_endpoint {
                        tokio::spawn(replay(
                            endpoint.to_owned(),
                            id,
                            from,
                            self.replay_timeout,
                            self.replay_tx.clone(),
                            self.cancel.clone(),
                        ));
                    }
                    continue;
                }
            };
            self.deliveries
                .send(delivery)
                .await
                .map_err(|_| TransportError::Closed)?;
        }
        Ok(())
    }
}

/// One replay on its own DEALER, so answers to an abandoned replay can never
/// mix with a newer one.
async fn replay(
    endpoint: String,
    id: ReplayId,
    from: u64,
    timeout: Duration,
    tx: mpsc::Sender<ReplayEvent>,
    cancel: CancellationToken,
) {
    let outcome = tokio::select! {
        _ = cancel.cancelled() => return,
        r = replay_inner(&endpoint, id, from, timeout, &tx) => r,
    };
    let ev = match outcome {
        Ok(()) => ReplayEvent::End(id),
        Err(reason) => {
            tracing::debug!(%endpoint, replay = id, from, %reason, "replay failed");
            ReplayEvent::TimedOut(id)
        }
    };
    let _ = tx.send(ev).await;
}

async fn replay_inner(
    endpoint: &str,
    id: ReplayId,
    from: u64,
    timeout: Duration,
    tx: &mpsc::Sender<ReplayEvent>,
) -> Result<(), String> {
    let mut dealer = DealerSocket::new();
    tokio::time::timeout(timeout, dealer.connect(endpoint))
        .await
        .map_err(|_| "connect timed out".to_owned())?
        .map_err(|e| e.to_string())?;
    let request = ZmqMessage::try_from(replay_request(from)).map_err(|e| e.to_string())?;
    dealer.send(request).await.map_err(|e| e.to_string())?;
    loop {
        let msg = tokio::time::timeout(timeout, dealer.recv())
            .await
            .map_err(|_| "no reply in time".to_owned())?
            .map_err(|e| e.to_string())?;
        match parse_replay(&msg.into_vec()) {
            Some(ReplayFrame::Message { seq, payload }) => {
                tx.send(ReplayEvent::Frame(id, seq, payload))
                    .await
                    .map_err(|_| "transport gone".to_owned())?;
            }
            Some(ReplayFrame::End) => return Ok(()),
            None => tracing::warn!(replay = id, "malformed replay message skipped"),
        }
    }
}

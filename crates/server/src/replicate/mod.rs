//! Active-active replicas and warm restarts: the server side of the bus
//! (`--nats-url`) and of the state directory (`--state-dir`).
//!
//! # Bus mode
//!
//! - **Relay.** `ReportCacheState` and `PublishEvent` publish what they
//!   receive to the stream ([`BusRelay`]) instead of applying it, so a
//!   sidecar that speaks only gRPC reaches every replica. When the relay may
//!   have lost something (buffer full, failed publish, a replica asked for a
//!   resync) the open report streams end with `UNAVAILABLE`, and the sidecars
//!   re-report their full state, as they do after any server failure.
//! - **Apply.** Every replica applies the stream in order ([`apply`]), its own
//!   updates included: one path, one order, identical indexes. A message's
//!   time 0 becomes the stream's receive time, the same on every replica.
//! - **Readiness.** `/readyz` is 503 ("bus: catching up ...") until the
//!   replica has applied the stream up to where it was at start. When the bus
//!   cannot be reached within [`CONNECT_GRACE`], the replica becomes ready
//!   anyway and serves from its local (possibly warm) index: fail-open. It
//!   catches up in the background when the bus appears.
//! - **One load view.** Every replica publishes the hints it delivered,
//!   coalesced per interval, and applies the others' ([`load_share`]), so
//!   the default ranking's load is the fleet's on every replica. Engine load
//!   reports travel inside the updates on the stream, like the rest of the
//!   stats.
//!
//! # State
//!
//! Loaded before anything is served; written every interval and after the
//! listeners have drained (then nothing else writes). In bus mode each
//! written snapshot is also published to the snapshot bucket, and a replica
//! that starts with no snapshot warms from the newest published one before
//! consuming the stream from that snapshot's sequence.

pub mod caller_load;
pub mod load_share;
pub mod metrics;

/// A core whose index knows `replicas` of scope ("t", "m"), each holding
/// one block (what the load-sharing tests apply counts to).
#[cfg(test)]
pub(crate) fn core_holding(replicas: &[&str]) -> Core {
    let core = Core::with_defaults();
    for r in replicas {
        core.ingest(&inferencecache_index::CacheUpdate {
            replica_id: (*r).into(),
            tenant_id: "t".into(),
            model_id: "m".into(),
            hash_scheme: "vllm".into(),
            prefixes: vec![inferencecache_index::PrefixEntry {
                block_hashes: vec![vec![1; 8]],
                block_token_counts: vec![16],
                ..Default::default()
            }],
            ..Default::default()
        });
    }
    core
}

pub use metrics::ReplicationMetrics;

use crate::core::Core;
use crate::grpc_error::GrpcError;
use crate::reserved_tenant::is_reserved;
use crate::state::{self, Restored, StateSettings};
use inferencecache_bus::{
    Applied, Bus, BusConfig, BusMessage, ConsumerStatus, Delivery, Producer, ProducerLimits,
    SkipReason, SnapshotBucket,
};
use inferencecache_proto::v1alpha1::{Ack, CacheEvent, CacheStateUpdate};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::{Response, Status};

/// How long a starting replica waits for the bus before serving without it.
pub const CONNECT_GRACE: Duration = Duration::from_secs(3);
/// Readiness key of the bus.
const READY_KEY: &str = "bus";

/// `--nats-url` and friends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusSettings {
    /// Stream, subjects, retention.
    pub config: BusConfig,
    /// Name under which this replica publishes snapshots.
    pub replica_name: String,
    /// Relay bounds.
    pub limits: ProducerLimits,
    /// `--bus-load-interval`: delivered hints are shared with the other
    /// replicas in one batch per interval; zero shares none (each replica's
    /// load then counts only its own deliveries, as before issue 36).
    pub load_interval: Duration,
}

/// Publishes gRPC-received updates to the stream.
#[derive(Clone)]
pub struct BusRelay {
    producer: Producer,
    metrics: Arc<ReplicationMetrics>,
    endpoint: String,
}

impl std::fmt::Debug for BusRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BusRelay").finish_non_exhaustive()
    }
}

impl BusRelay {
    /// `ReportCacheState` in bus mode (the decoded messages of the gRPC
    /// stream or of an in-process producer).
    pub async fn report_stream<S>(
        &self,
        mut stream: S,
        stop: &CancellationToken,
        check: impl Fn(&CacheStateUpdate) -> Result<(), GrpcError>,
    ) -> Result<Ack, Status>
    where
        S: futures::Stream<Item = Result<CacheStateUpdate, Status>> + Unpin,
    {
        let mut resyncs = self.producer.resyncs();
        resyncs.borrow_and_update();
        let mut denied: Option<GrpcError> = None;
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => {
                    return Err(GrpcError::ShuttingDown.into());
                }
                changed = resyncs.changed() => {
                    if changed.is_ok() {
                        self.metrics.bus_resyncs.inc();
                    }
                    return Err(GrpcError::BusResync("resync required").into());
                }
                next = futures::StreamExt::next(&mut stream) => next.transpose()?,
            };
            let Some(update) = next else { break };
            if is_reserved(&update.tenant_id) {
                continue;
            }
            // Refused before it reaches the stream: every replica would
            // otherwise apply (or refuse) what this one should have. As
            // without a bus, PERMISSION_DENIED skips the update and ends the
            // stream with the first refusal; any other refusal ends it now.
            if !crate::producer::admit_update(check(&update), &mut denied)? {
                continue;
            }
            if !self.producer.try_send(BusMessage::Update(update)) {
                return Err(GrpcError::BusResync("buffer full").into());
            }
        }
        if let Some(s) = denied {
            return Err(s.into());
        }
        Ok(Ack {
            accepted: true,
            reason_code: String::new(),
        })
    }

    /// The bus's address as configured (`--nats-url`), credentials and all.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bus and warm-restart metrics (the status page reads its gauges).
    pub fn metrics(&self) -> &ReplicationMetrics {
        &self.metrics
    }

    /// `PublishEvent` in bus mode.
    pub fn publish_event(&self, event: CacheEvent) -> Result<Response<Ack>, GrpcError> {
        if !is_reserved(&event.tenant_id) && !self.producer.try_send(BusMessage::Event(event)) {
            return Err(GrpcError::BusResync("buffer full"));
        }
        Ok(Response::new(Ack {
            accepted: true,
            reason_code: String::new(),
        }))
    }
}

/// Applies one stream message to the index; an engine load report's time
/// is noted in `reports` (remote deliveries made before it are in its counts).
pub fn apply(core: &Core, reports: &load_share::ReportTimes, d: Delivery) -> Applied {
    let stored_us = d.stored_ns / 1_000;
    match d.message {
        BusMessage::Update(mut u) => {
            if is_reserved(&u.tenant_id) {
                return Applied::Skipped(SkipReason::ProbeTenant);
            }
            if u.timestamp_us == 0 {
                u.timestamp_us = stored_us;
            }
            if u.stats.as_ref().is_some_and(|s| s.load.is_some()) {
                reports.note(&u.replica_id, u.timestamp_us.saturating_mul(1_000));
            }
            core.block_sizes.learn(&u);
            core.ingest(&crate::convert::update_from_proto(u));
        }
        BusMessage::Event(mut e) => {
            if is_reserved(&e.tenant_id) {
                return Applied::Skipped(SkipReason::ProbeTenant);
            }
            if e.timestamp_us == 0 {
                e.timestamp_us = stored_us;
            }
            let kind = inferencecache_proto::v1alpha1::cache_event::Type::try_from(e.r#type)
                .map_or("UNKNOWN", |t| t.as_str_name());
            core.metrics
                .events
                .get_or_create(&crate::metrics::Metrics::type_label(kind))
                .inc();
            if let Some(ev) = crate::convert::event_from_proto(e) {
                core.apply_event(&ev);
            }
        }
    }
    Applied::Ok
}

struct BusSide {
    settings: BusSettings,
    bus: Bus,
    producer: Producer,
    status: Arc<ConsumerStatus>,
    /// This process on the load subject.
    origin: String,
    /// Engine load reports applied, for the remote deliveries' check.
    reports: Arc<load_share::ReportTimes>,
}

/// The replication and persistence side of a server.
pub struct Replication {
    core: Core,
    metrics: Arc<ReplicationMetrics>,
    relay: Option<BusRelay>,
    state: Option<StateSettings>,
    bus: Option<BusSide>,
    restored: Option<Restored>,
    stop: CancellationToken,
    tasks: JoinSet<()>,
}

impl std::fmt::Debug for Replication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replication")
            .field("state", &self.state)
            .field("bus", &self.bus.as_ref().map(|b| &b.settings))
            .finish_non_exhaustive()
    }
}

impl Replication {
    /// Loads the state directory into `core` and connects the bus (in the
    /// background), building the relay. Nothing runs until [`Self::spawn`].
    pub async fn start(
        core: &Core,
        bus: Option<BusSettings>,
        state: Option<StateSettings>,
        metrics: Arc<ReplicationMetrics>,
    ) -> Result<Self, crate::ServeError> {
        let restored = match &state {
            Some(s) => state::load(core, &s.dir).map_err(crate::ServeError::State)?,
            None => None,
        };
        if let Some(r) = &restored {
            metrics.restored(r.entries);
        }
        let mut relay = None;
        let stop = CancellationToken::new();
        let bus = match bus {
            Some(settings) => {
                let b = Bus::connect(settings.config.clone())
                    .await
                    .map_err(crate::ServeError::Bus)?;
                let producer = Producer::start(b.clone(), settings.limits, stop.clone());
                relay = Some(BusRelay {
                    producer: producer.clone(),
                    metrics: Arc::clone(&metrics),
                    endpoint: b.config.url.clone(),
                });
                // Resume after the snapshot's position when it is a position
                // in this stream; otherwise replay the stream from its start
                // (replaying over a warm index converges).
                let after = restored
                    .as_ref()
                    .filter(|r| r.meta.stream == settings.config.stream)
                    .map_or(0, |r| r.meta.last_sequence);
                core.readiness.block(READY_KEY, "connecting to the bus");
                if !settings.load_interval.is_zero() {
                    core.pipeline.deliveries().enable();
                    core.caller_loads.share();
                }
                Some(BusSide {
                    origin: load_share::origin(&settings.replica_name),
                    settings,
                    bus: b,
                    producer,
                    status: Arc::new(ConsumerStatus::starting_after(after)),
                    reports: Arc::new(load_share::ReportTimes::default()),
                })
            }
            None => None,
        };
        Ok(Self {
            core: core.clone(),
            metrics,
            relay,
            state,
            bus,
            restored,
            stop,
            tasks: JoinSet::new(),
        })
    }

    /// The relay `ReportCacheState` and `PublishEvent` publish through, in
    /// bus mode.
    pub fn relay(&self) -> Option<&BusRelay> {
        self.relay.as_ref()
    }

    /// What the state directory held at start.
    pub fn restored(&self) -> Option<&Restored> {
        self.restored.as_ref()
    }

    /// Starts the consumer, readiness watcher, metrics mirror and snapshot
    /// loop.
    pub fn spawn(&mut self) {
        if let Some(side) = &self.bus {
            let core = self.core.clone();
            let bus = side.bus.clone();
            let status = Arc::clone(&side.status);
            let stop = self.stop.clone();
            let warm = self.restored.is_none();
            let metrics = Arc::clone(&self.metrics);
            let reports = Arc::clone(&side.reports);
            self.tasks.spawn(async move {
                if warm {
                    warm_from_bucket(&core, &metrics, &bus, &status, &stop).await;
                }
                let c = core.clone();
                let apply_one = move |d| apply(&c, &reports, d);
                inferencecache_bus::run_consumer(bus, status, apply_one, stop).await;
            });
            if !side.settings.load_interval.is_zero() {
                self.tasks.spawn(load_share::publish_loop(
                    side.bus.clone(),
                    self.core.pipeline.deliveries().clone(),
                    side.origin.clone(),
                    side.settings.load_interval,
                    Arc::clone(&self.metrics.load),
                    self.stop.clone(),
                ));
                self.tasks.spawn(load_share::publish_caller_loads(
                    side.bus.clone(),
                    self.core.clone(),
                    side.origin.clone(),
                    Arc::clone(&self.metrics.load),
                    self.stop.clone(),
                ));
                self.tasks.spawn(load_share::apply_loop(
                    side.bus.clone(),
                    self.core.clone(),
                    side.origin.clone(),
                    Arc::clone(&side.reports),
                    Arc::clone(&self.metrics.load),
                    self.stop.clone(),
                ));
            }
            let core = self.core.clone();
            let bus = side.bus.clone();
            let status = Arc::clone(&side.status);
            let stop = self.stop.clone();
            self.tasks
                .spawn(async move { readiness_loop(core, bus, status, stop).await });
        }
        {
            let metrics = Arc::clone(&self.metrics);
            let status = self.bus.as_ref().map(|b| Arc::clone(&b.status));
            let producer = self.bus.as_ref().map(|b| b.producer.clone());
            let stop = self.stop.clone();
            self.tasks.spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    metrics.sync(status.as_deref(), producer.as_ref().map(|p| p.stats()));
                }
            });
        }
        if let Some(st) = self.state.clone().filter(|s| !s.interval.is_zero()) {
            let core = self.core.clone();
            let metrics = Arc::clone(&self.metrics);
            let stop = self.stop.clone();
            let side = self.bus.as_ref().map(|b| {
                (
                    b.bus.clone(),
                    Arc::clone(&b.status),
                    b.settings.replica_name.clone(),
                )
            });
            self.tasks.spawn(async move {
                let mut tick = tokio::time::interval_at(
                    tokio::time::Instant::now() + st.interval,
                    st.interval,
                );
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    write_snapshot(&core, &metrics, &st, side.as_ref()).await;
                }
            });
        }
    }

    /// Stops the background tasks (the relay drains its buffer, bounded) and
    /// writes the final snapshot. Call after the listeners have drained.
    pub async fn finish(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
        if let Some(side) = &self.bus {
            self.metrics
                .sync(Some(&side.status), Some(side.producer.stats()));
        }
        if let Some(st) = &self.state {
            let side = self.bus.as_ref().map(|b| {
                (
                    b.bus.clone(),
                    Arc::clone(&b.status),
                    b.settings.replica_name.clone(),
                )
            });
            write_snapshot(&self.core, &self.metrics, st, side.as_ref()).await;
        }
    }
}

type SideRef = (Bus, Arc<ConsumerStatus>, String);

/// Writes one snapshot on the blocking pool; in bus mode also publishes it.
async fn write_snapshot(
    core: &Core,
    metrics: &ReplicationMetrics,
    st: &StateSettings,
    side: Option<&SideRef>,
) {
    // The position is read before the index: the snapshot then holds at
    // least everything up to it, and replaying after it converges.
    let (seq, stream) = side.map_or((0, String::new()), |(b, s, _)| {
        (s.applied.load(Ordering::SeqCst), b.config.stream.clone())
    });
    let c = core.clone();
    let dir = st.dir.clone();
    let written = tokio::task::spawn_blocking(move || state::save(&c, &dir, seq, &stream)).await;
    let bytes = match written {
        Ok(Ok(b)) => {
            metrics.written(Some(b.len()));
            b
        }
        Ok(Err(e)) => {
            metrics.written(None);
            tracing::error!(error = %e, "state_snapshot_write_failed");
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "state_snapshot_task_failed");
            return;
        }
    };
    let Some((bus, _, name)) = side else { return };
    if !bus.is_connected() {
        return;
    }
    let published = async {
        let bucket = SnapshotBucket::open(bus).await?;
        bucket.put(name, seq, &bytes).await
    };
    let ok = match tokio::time::timeout(Duration::from_secs(30), published).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "state_snapshot_publish_failed");
            false
        }
        Err(_) => {
            tracing::warn!("state_snapshot_publish_timed_out");
            false
        }
    };
    metrics.snapshot("bucket", ok);
}

/// An empty replica: load the newest published snapshot, then consume from
/// its sequence. Bounded: without a bus or a snapshot it starts from zero.
async fn warm_from_bucket(
    core: &Core,
    metrics: &ReplicationMetrics,
    bus: &Bus,
    status: &ConsumerStatus,
    stop: &CancellationToken,
) {
    let attempt = async {
        bus.wait_connected().await;
        let bucket = SnapshotBucket::open(bus).await?;
        let Some(newest) = bucket.newest().await? else {
            return Ok::<_, inferencecache_bus::BusError>(None);
        };
        let bytes = bucket.get(&newest.name, state::MAX_SNAPSHOT_BYTES).await?;
        Ok(Some((newest, bytes)))
    };
    let got = tokio::select! {
        () = stop.cancelled() => return,
        r = tokio::time::timeout(CONNECT_GRACE + Duration::from_secs(10), attempt) => r,
    };
    match got {
        Ok(Ok(Some((newest, bytes)))) => {
            let c = core.clone();
            let restored =
                tokio::task::spawn_blocking(move || state::restore(&c, &bytes, "bucket"))
                    .await
                    .ok()
                    .flatten();
            if let Some(r) = restored {
                metrics.restored(r.entries);
                if r.meta.stream == bus.config.stream {
                    status.applied.store(r.meta.last_sequence, Ordering::SeqCst);
                }
                tracing::info!(from = %newest.name, sequence = r.meta.last_sequence, "state_warmed_from_bucket");
            }
        }
        Ok(Ok(None)) => tracing::info!("state_bucket_empty; consuming the stream from its start"),
        Ok(Err(e)) => tracing::warn!(error = %e, "state_bucket_unavailable"),
        Err(_) => tracing::warn!("state_bucket_timed_out"),
    }
}

async fn readiness_loop(
    core: Core,
    bus: Bus,
    status: Arc<ConsumerStatus>,
    stop: CancellationToken,
) {
    let started = Instant::now();
    loop {
        if status.caught_up.load(Ordering::SeqCst) {
            core.readiness.clear(READY_KEY);
            return;
        }
        if !bus.is_connected() && started.elapsed() >= CONNECT_GRACE {
            tracing::warn!(
                url = %bus.config.url,
                "bus_unreachable_at_start; ready and serving from the local index (fail-open); will catch up when it appears"
            );
            core.readiness.clear(READY_KEY);
            return;
        }
        let applied = status.applied.load(Ordering::SeqCst);
        let target = status.target.load(Ordering::SeqCst);
        let reason = if bus.is_connected() {
            format!("catching up with the stream: applied {applied} of {target}")
        } else {
            "connecting to the bus".to_owned()
        };
        core.readiness.block(READY_KEY, reason);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
}

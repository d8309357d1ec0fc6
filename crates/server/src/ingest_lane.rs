//! Ingest and events run on dedicated threads, never on the async runtime's
//! workers, so lookups are not queued behind them.
//!
//! Measured (BENCHMARKS.md, "Lookups under an ingest flood"): applying a
//! large `CacheStateUpdate` inline in the `ReportCacheState` handler kept a
//! runtime worker busy for the whole update, and a stream whose next message
//! was already buffered never yielded between messages; with two flooding
//! producers both workers of a 2-core host were taken, and LookupRoute calls
//! (whose own index time stayed in microseconds) waited for a worker for
//! hundreds of milliseconds. Here the handler decodes a message, hands it to a
//! lane and awaits the outcome (which also yields between messages and gives
//! the producer back-pressure through a bounded queue); the lane thread applies
//! it. With one lane (the default on a 2-core host) ingest can take at most one
//! core, whatever the number of producers.
//!
//! Work is routed to a lane by replica id, so one replica's reports and events
//! are applied in the order they arrived, as before.
//!
//! Work that costs about as much as the hop itself (one `PublishEvent`
//! eviction: an index probe or two) goes through [`IngestLanes::run_light`]:
//! inline when its replica's lane has nothing queued, which is the same order a
//! lane would give, without the two thread wake-ups (measured: 11.5 of the 33 µs
//! of server CPU per `PublishEvent`, BENCHMARKS.md).

use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::{mpsc, oneshot};

type Job = Box<dyn FnOnce() + Send>;

fn hashing_key(replica_id: &str) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    replica_id.hash(&mut h);
    h.finish()
}

/// Jobs queued per lane before a producer waits.
const LANE_QUEUE: usize = 32;

/// The ingest threads; cheap to clone. Threads end when the last clone is
/// dropped.
#[derive(Clone)]
pub struct IngestLanes {
    lanes: Arc<[Lane]>,
}

struct Lane {
    tx: mpsc::Sender<Job>,
    /// Jobs sent and not yet finished.
    queued: Arc<AtomicUsize>,
}

impl std::fmt::Debug for IngestLanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IngestLanes")
            .field("lanes", &self.lanes.len())
            .finish()
    }
}

/// Default lane count: half the cores (at least one), leaving the rest to
/// the runtime that serves lookups.
pub fn default_lanes() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

impl IngestLanes {
    /// Starts `n` lane threads; 0 applies work inline on the calling task
    /// (the old behaviour, kept to measure against: `--ingest-lanes 0`).
    pub fn new(n: usize) -> Self {
        let lanes: Vec<Lane> = (0..n)
            .filter_map(|i| {
                let (tx, mut rx) = mpsc::channel::<Job>(LANE_QUEUE);
                let spawned = std::thread::Builder::new()
                    .name(format!("ingest-{i}"))
                    .spawn(move || {
                        while let Some(job) = rx.blocking_recv() {
                            // A panicking job must not take the lane down;
                            // its caller sees its result channel dropped.
                            if std::panic::catch_unwind(AssertUnwindSafe(job)).is_err() {
                                tracing::error!("ingest_job_panicked");
                            }
                        }
                    });
                match spawned {
                    Ok(_) => Some(Lane {
                        tx,
                        queued: Arc::new(AtomicUsize::new(0)),
                    }),
                    Err(e) => {
                        tracing::error!(error = %e, "ingest_lane_spawn_failed");
                        None
                    }
                }
            })
            .collect();
        Self {
            lanes: lanes.into(),
        }
    }

    /// Number of lanes running.
    pub fn len(&self) -> usize {
        self.lanes.len()
    }

    /// True when work runs inline (no lanes).
    pub fn is_empty(&self) -> bool {
        self.lanes.is_empty()
    }

    /// The lane that applies `replica_id`'s work.
    pub fn lane_of(&self, replica_id: &str) -> LaneId {
        LaneId(match self.lanes.len() {
            0 => 0,
            n => hashing_key(replica_id) as usize % n,
        })
    }

    /// Runs `f` on `lane` and returns its result; `None` if the lane stopped
    /// or `f` panicked. With no lanes, `f` runs inline.
    pub async fn run<T, F>(&self, lane: LaneId, f: F) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let Some(lane) = self.lanes.get(lane.0) else {
            return Some(f());
        };
        let (tx, rx) = oneshot::channel();
        lane.queued.fetch_add(1, Ordering::AcqRel);
        let queued = Arc::clone(&lane.queued);
        let job: Job = Box::new(move || {
            // The count drops before the caller can see the result (so its
            // next light job finds the lane idle), and also when `f` panics
            // (else the lane would look busy forever).
            let out = {
                let _finished = Finished(queued);
                f()
            };
            let _ = tx.send(out);
        });
        if lane.tx.send(job).await.is_err() {
            lane.queued.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        rx.await.ok()
    }

    /// Runs cheap work (about the cost of the hop to a lane) inline when
    /// `lane` has nothing queued or running, else on the lane behind the
    /// work queued before it: either way after everything that arrived
    /// before it for the replica.
    pub async fn run_light<T, F>(&self, lane: LaneId, f: F) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        match self.lanes.get(lane.0) {
            Some(l) if l.queued.load(Ordering::Acquire) > 0 => self.run(lane, f).await,
            _ => Some(f()),
        }
    }
}

/// Takes a job off its lane's count when the job ends, normally or by panic.
struct Finished(Arc<AtomicUsize>);

impl Drop for Finished {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One ingest lane, from [`IngestLanes::lane_of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneId(usize);

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_off_the_runtime_in_order_per_replica() {
        let lanes = IngestLanes::new(2);
        assert_eq!(lanes.len(), 2);
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        // Submitted concurrently from many tasks, one replica: applied in
        // submission order, all on a lane thread.
        let mut waits = Vec::new();
        for i in 0..50 {
            let log = Arc::clone(&log);
            let lanes = lanes.clone();
            waits.push(tokio::spawn(async move {
                lanes
                    .run(lanes.lane_of("r1"), move || {
                        log.lock().unwrap().push(i);
                        std::thread::current().name().map(str::to_owned)
                    })
                    .await
            }));
            tokio::task::yield_now().await;
        }
        for w in waits {
            let name = w.await.unwrap().expect("ran");
            assert!(name.is_some_and(|n| n.starts_with("ingest-")));
        }
        let mut sorted = log.lock().unwrap().clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn light_work_runs_inline_when_idle_and_behind_queued_work_otherwise() {
        let lanes = IngestLanes::new(1);
        let here = std::thread::current().id();
        // Idle lane: inline, on the calling thread.
        let ran_on = lanes
            .run_light(lanes.lane_of("r1"), || std::thread::current().id())
            .await;
        assert_eq!(ran_on, Some(here));
        // Busy lane: the light job waits behind the queued one, on the lane.
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let heavy = {
            let (lanes, log) = (lanes.clone(), Arc::clone(&log));
            tokio::spawn(async move {
                lanes
                    .run(lanes.lane_of("r1"), move || {
                        let _ = wait.recv();
                        log.lock().unwrap().push("heavy");
                    })
                    .await
            })
        };
        while lanes.lanes[lanes.lane_of("r1").0]
            .queued
            .load(Ordering::Acquire)
            == 0
        {
            tokio::task::yield_now().await;
        }
        let light = {
            let (lanes, log) = (lanes.clone(), Arc::clone(&log));
            tokio::spawn(async move {
                lanes
                    .run_light(lanes.lane_of("r1"), move || {
                        log.lock().unwrap().push("light");
                        std::thread::current().id()
                    })
                    .await
            })
        };
        // Both jobs queued before the first is released.
        while lanes.lanes[lanes.lane_of("r1").0]
            .queued
            .load(Ordering::Acquire)
            < 2
        {
            tokio::task::yield_now().await;
        }
        release.send(()).unwrap();
        heavy.await.unwrap().expect("heavy ran");
        assert_ne!(light.await.unwrap(), Some(here));
        assert_eq!(*log.lock().unwrap(), ["heavy", "light"]);
        assert_eq!(
            lanes.lanes[lanes.lane_of("r1").0]
                .queued
                .load(Ordering::Acquire),
            0
        );
    }

    #[tokio::test]
    async fn a_panicking_job_leaves_the_lane_running() {
        let lanes = IngestLanes::new(1);
        assert_eq!(
            lanes
                .run(lanes.lane_of("r"), || -> u8 { panic!("boom") })
                .await,
            None
        );
        assert_eq!(lanes.run(lanes.lane_of("r"), || 7).await, Some(7));
        // The panicked job no longer counts as queued: light work runs
        // inline again.
        assert_eq!(
            lanes.lanes[lanes.lane_of("r").0]
                .queued
                .load(Ordering::Acquire),
            0
        );
        let here = std::thread::current().id();
        assert_eq!(
            lanes
                .run_light(lanes.lane_of("r"), || std::thread::current().id())
                .await,
            Some(here)
        );
    }
}

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

use std::hash::{Hash, Hasher};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
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
    lanes: Arc<[mpsc::Sender<Job>]>,
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
        let lanes: Vec<mpsc::Sender<Job>> = (0..n)
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
                    Ok(_) => Some(tx),
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

    /// Runs `f` on the lane of `replica_id` and returns its result; `None`
    /// if the lane stopped or `f` panicked. With no lanes, `f` runs inline.
    pub async fn run<T, F>(&self, replica_id: &str, f: F) -> Option<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        if self.lanes.is_empty() {
            return Some(f());
        }
        let lane = &self.lanes[hashing_key(replica_id) as usize % self.lanes.len()];
        let (tx, rx) = oneshot::channel();
        lane.send(Box::new(move || {
            let _ = tx.send(f());
        }))
        .await
        .ok()?;
        rx.await.ok()
    }
}

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
                    .run("r1", move || {
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
    async fn a_panicking_job_leaves_the_lane_running() {
        let lanes = IngestLanes::new(1);
        assert_eq!(lanes.run("r", || -> u8 { panic!("boom") }).await, None);
        assert_eq!(lanes.run("r", || 7).await, Some(7));
    }
}

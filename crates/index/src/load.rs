//! The delivered-hint window: the server's own, report-free estimate of each
//! replica's queued prefill work.
//!
//! Stats arrive only every scrape interval (10 s by default), far too stale to
//! balance on. So every hint the estimated-TTFT ranking delivers adds the
//! request's estimated prefill work (request overhead + uncached tokens ×
//! per-token cost, in µs) to the chosen replica's queue, and the queue drains
//! at one µs of work per µs of time, as an engine that prefills one request
//! at a time does. Reading it gives "how long a request sent there now would
//! wait before its own prefill starts". A hint counts for exactly as long as
//! the work it stands for, so the window is short and self-timed: a replica
//! idle for longer than its queued work reads as empty.
//!
//! What it cannot know: requests the gateway sent elsewhere than hinted, and
//! the work other server replicas hinted. Reported pressure (a separate term
//! of the estimate) corrects for those at the scrape interval.

use crate::hashing::FoldBuild;
use crate::shard::{read, write};
use std::collections::HashMap;
use std::sync::RwLock;

#[derive(Debug, Clone, Copy, Default)]
struct Queue {
    /// Work queued at `at_ns`, µs.
    work_us: f64,
    at_ns: i64,
    /// Hints delivered so far (metrics and tests).
    delivered: u64,
}

impl Queue {
    fn at(&self, now_ns: i64) -> f64 {
        let elapsed_us = now_ns.saturating_sub(self.at_ns).max(0) as f64 / 1_000.0;
        (self.work_us - elapsed_us).max(0.0)
    }
}

/// Per replica id queued work (a replica's queue is physical: every tenant
/// and model it serves shares it).
#[derive(Default)]
pub(crate) struct LoadTracker {
    queues: RwLock<HashMap<u32, Queue, FoldBuild>>,
}

impl LoadTracker {
    /// Queued work of a replica at `now`, µs.
    pub(crate) fn queued_us(&self, replica: u32, now_ns: i64) -> f64 {
        read(&self.queues)
            .get(&replica)
            .map_or(0.0, |q| q.at(now_ns))
    }

    /// A hint for `work_us` of prefill was delivered to the replica.
    pub(crate) fn add(&self, replica: u32, work_us: f64, now_ns: i64) {
        let mut queues = write(&self.queues);
        let q = queues.entry(replica).or_default();
        let left = q.at(now_ns);
        q.work_us = left + work_us.max(0.0);
        q.at_ns = now_ns.max(q.at_ns);
        q.delivered += 1;
    }

    /// Hints delivered to a replica so far.
    pub(crate) fn delivered(&self, replica: u32) -> u64 {
        read(&self.queues).get(&replica).map_or(0, |q| q.delivered)
    }

    /// Drops a released replica's queue, so an id reused for another
    /// replica starts with none (`replicas.rs`).
    pub(crate) fn forget(&self, replica: u32) {
        write(&self.queues).remove(&replica);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_work_drains_in_real_time() {
        let t = LoadTracker::default();
        t.add(1, 1_000.0, 0);
        t.add(1, 500.0, 200_000); // 200 µs later: 800 left + 500
        assert_eq!(t.queued_us(1, 200_000), 1_300.0);
        assert_eq!(t.queued_us(1, 1_200_000), 300.0);
        assert_eq!(t.queued_us(1, 9_000_000), 0.0);
        assert_eq!(t.queued_us(2, 0), 0.0);
        assert_eq!(t.delivered(1), 2);
    }
}

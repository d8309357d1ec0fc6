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
//! Beside the work, each replica keeps a decaying count of the hints it was
//! delivered (half-life [`RECENT_HALF_LIFE`]): the bounded-load rule of the
//! ranking (`routing.rs`) compares it with the fleet's mean. Work cannot
//! serve for that rule: the replicas that attract the most requests are the
//! ones holding the shared prefixes, whose requests cost the least work.
//!
//! # The engine's own load (issue 33)
//!
//! When the replica's producer reports the engine's load (the sidecar scrapes
//! running and waiting requests every second, [`crate::EngineLoad`]), each
//! report **restarts** the queue from what the engine says: its requests
//! turned into work ([`REPORTED_REQUEST_TOKENS`] prompt tokens each at the
//! default weights, or the replica's mean delivered hint work once it has
//! one; a running request counts half: it is past part of its prefill),
//! stamped at the report's time. Hints delivered after the report queue
//! behind it as before, and everything drains at 1 µs/µs, so the queue is
//! "the last report's work drained since the report + the work of hints
//! delivered since that report". Hints delivered before the report are in
//! the engine's counts already (or done), so they are dropped with the old
//! queue. The recent-hint count of the bounded-load rule restarts at each
//! report as well: with reports, a replica is over the bound only for the
//! hints it was sent since its engine last counted. Without reports (an older sidecar, a producer that cannot scrape)
//! the queue is the delivered-hint window alone, as before; when reports
//! stop, the last one drains and hints keep adding.
//!
//! What it cannot know: requests the gateway sent elsewhere than hinted, and
//! the work other server replicas hinted, until the next report counts them.
//! Reported pressure (a separate term of the estimate) still applies.

use crate::sync::{read, write};
use std::sync::{RwLock, RwLockReadGuard};

/// Half-life of the recent-hint count: long enough that a replica's count
/// spans tens of requests at a few requests per second over the fleet (so
/// the bound's one-request slack is small), short enough to follow a shift of
/// the traffic within minutes.
pub(crate) const RECENT_HALF_LIFE_NS: i64 = 120_000_000_000;

/// Prompt tokens one reported request stands for before the replica has
/// been delivered any hint (then its mean delivered work is used): a
/// conversation turn's order of magnitude (the Mooncake trace's median
/// request is ~7 k tokens, chat traffic's far fewer).
pub(crate) const REPORTED_REQUEST_TOKENS: f64 = 1_024.0;

/// One reported request's work before any hint: [`REPORTED_REQUEST_TOKENS`]
/// at the default weights (`TtftWeights::default()`: 5,000 µs + 50 µs per
/// token; a test in `routing.rs` holds the two equal), µs.
pub(crate) const DEFAULT_REQUEST_WORK_US: f64 = 5_000.0 + 50.0 * REPORTED_REQUEST_TOKENS;

/// Weight of the newest hint in a replica's mean delivered work.
const MEAN_WEIGHT: f64 = 0.1;

#[derive(Debug, Clone, Copy, Default)]
struct Queue {
    /// Work queued at `at_ns`, µs.
    work_us: f64,
    at_ns: i64,
    /// Hints delivered, decayed with [`RECENT_HALF_LIFE_NS`], as of `at_ns`.
    recent: f64,
    /// Hints delivered so far (metrics and tests).
    delivered: u64,
    /// Mean work of the hints delivered (exponentially weighted), µs.
    mean_work_us: f64,
    /// Time of the last engine load report applied, ns (0: none).
    reported_ns: i64,
}

impl Queue {
    fn at(&self, now_ns: i64) -> f64 {
        let elapsed_us = now_ns.saturating_sub(self.at_ns).max(0) as f64 / 1_000.0;
        (self.work_us - elapsed_us).max(0.0)
    }

    fn recent_at(&self, now_ns: i64) -> f64 {
        let elapsed = now_ns.saturating_sub(self.at_ns).max(0) as f64;
        self.recent * (-elapsed * std::f64::consts::LN_2 / RECENT_HALF_LIFE_NS as f64).exp()
    }
}

/// Per replica id queued work (a replica's queue is physical: every tenant
/// and model it serves shares it). Indexed by the dense replica id: a lookup
/// reads every live replica's queue under one read lock.
#[derive(Default)]
pub(crate) struct LoadTracker {
    queues: RwLock<Vec<Queue>>,
}

/// The queues read-locked, for one lookup's whole fleet.
pub(crate) struct LoadView<'a>(RwLockReadGuard<'a, Vec<Queue>>);

impl LoadView<'_> {
    /// Queued work of a replica at `now`, µs.
    pub(crate) fn queued_us(&self, replica: u32, now_ns: i64) -> f64 {
        self.0.get(replica as usize).map_or(0.0, |q| q.at(now_ns))
    }

    /// Hints delivered to a replica recently (decayed count, see
    /// [`RECENT_HALF_LIFE_NS`]).
    pub(crate) fn recent_hints(&self, replica: u32, now_ns: i64) -> f64 {
        self.0
            .get(replica as usize)
            .map_or(0.0, |q| q.recent_at(now_ns))
    }
}

impl LoadTracker {
    /// The queues, read-locked.
    pub(crate) fn view(&self) -> LoadView<'_> {
        LoadView(read(&self.queues))
    }

    /// Queued work of a replica at `now`, µs.
    pub(crate) fn queued_us(&self, replica: u32, now_ns: i64) -> f64 {
        self.view().queued_us(replica, now_ns)
    }

    /// A hint for `work_us` of prefill was delivered to the replica.
    pub(crate) fn add(&self, replica: u32, work_us: f64, now_ns: i64) {
        let mut queues = write(&self.queues);
        let i = replica as usize;
        if queues.len() <= i {
            queues.resize(i + 1, Queue::default());
        }
        let q = &mut queues[i];
        let left = q.at(now_ns);
        q.recent = q.recent_at(now_ns) + 1.0;
        q.work_us = left + work_us.max(0.0);
        q.at_ns = now_ns.max(q.at_ns);
        q.mean_work_us = if q.delivered == 0 {
            work_us.max(0.0)
        } else {
            q.mean_work_us + MEAN_WEIGHT * (work_us.max(0.0) - q.mean_work_us)
        };
        q.delivered += 1;
    }

    /// The engine reported `running` and `waiting` requests at `at_ns`: the
    /// queue restarts from that (module docs). A report older than the last
    /// one applied is ignored.
    pub(crate) fn report(&self, replica: u32, running: u32, waiting: u32, at_ns: i64) {
        let mut queues = write(&self.queues);
        let i = replica as usize;
        if queues.len() <= i {
            queues.resize(i + 1, Queue::default());
        }
        let q = &mut queues[i];
        if at_ns < q.reported_ns {
            return;
        }
        let per_request = if q.delivered > 0 {
            q.mean_work_us
        } else {
            DEFAULT_REQUEST_WORK_US
        };
        q.work_us = per_request * (f64::from(waiting) + 0.5 * f64::from(running));
        // The bounded-load rule's count restarts too: the engine's counts
        // are the load now, not the hints of the last 120 s.
        q.recent = 0.0;
        q.at_ns = at_ns;
        q.reported_ns = at_ns;
    }

    /// Hints delivered to a replica recently (decayed count, see
    /// [`RECENT_HALF_LIFE_NS`]).
    #[cfg(test)]
    pub(crate) fn recent_hints(&self, replica: u32, now_ns: i64) -> f64 {
        self.view().recent_hints(replica, now_ns)
    }

    /// Hints delivered to a replica so far.
    pub(crate) fn delivered(&self, replica: u32) -> u64 {
        read(&self.queues)
            .get(replica as usize)
            .map_or(0, |q| q.delivered)
    }

    /// Drops a released replica's queue, so an id reused for another
    /// replica starts with none (`replicas.rs`).
    pub(crate) fn forget(&self, replica: u32) {
        if let Some(q) = write(&self.queues).get_mut(replica as usize) {
            *q = Queue::default();
        }
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

    #[test]
    fn a_load_report_restarts_the_queue_and_later_hints_queue_behind_it() {
        let t = LoadTracker::default();
        // Hints before the report: in the engine's counts once it reports.
        t.add(1, 10_000.0, 0);
        t.add(1, 10_000.0, 0);
        t.report(1, 0, 0, 1_000_000);
        assert_eq!(t.queued_us(1, 1_000_000), 0.0, "an idle engine is idle");
        // Two waiting + two running requests at the mean delivered work.
        t.report(1, 2, 2, 2_000_000);
        assert_eq!(t.queued_us(1, 2_000_000), 30_000.0);
        assert_eq!(t.queued_us(1, 3_000_000), 29_000.0, "drains in real time");
        t.add(1, 500.0, 3_000_000);
        assert_eq!(t.queued_us(1, 3_000_000), 29_500.0);
        // An older report (reordered) changes nothing.
        t.report(1, 0, 0, 1_500_000);
        assert_eq!(t.queued_us(1, 3_000_000), 29_500.0);
        // Before any hint, a request stands for the default weights' work.
        t.report(2, 0, 1, 0);
        assert_eq!(t.queued_us(2, 0), DEFAULT_REQUEST_WORK_US);
        assert_eq!(t.delivered(1), 3);
    }

    #[test]
    fn recent_hints_halve_every_half_life() {
        let t = LoadTracker::default();
        t.add(1, 0.0, 0);
        t.add(1, 0.0, 0);
        assert!((t.recent_hints(1, 0) - 2.0).abs() < 1e-9);
        assert!((t.recent_hints(1, RECENT_HALF_LIFE_NS) - 1.0).abs() < 1e-9);
        t.add(1, 0.0, 2 * RECENT_HALF_LIFE_NS); // 0.5 left + 1
        assert!((t.recent_hints(1, 2 * RECENT_HALF_LIFE_NS) - 1.5).abs() < 1e-9);
        assert_eq!(t.recent_hints(2, 0), 0.0);
    }
}

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
//! hints it was sent since its engine last counted, and it restarts when a
//! hint finds the replica's queue run dry (the work of every hint before it
//! done, as far as this server knows), and a lookup reads it so from the
//! moment that work is done (not only once the next hint is delivered: a
//! count of hints whose work is all done is no load): a sequential client's follow-ups to
//! the idle replica holding their prefix are not load to spread, whatever
//! their number between two reports (issue 33, session 44: a holder over the
//! bound sent the fourth follow-up in a row to a cold replica, a full miss). Without reports (an older sidecar, a producer that cannot scrape)
//! the queue is the delivered-hint window alone, as before; when reports
//! stop, the last one drains and hints keep adding.
//!
//! Callers that count their requests exactly (a gateway asking this server,
//! `ReportCallerLoad`) restart the queue the same way with their count
//! (`remote_load.rs`), fresher than the engine's scrape.
//!
//! What it cannot know: requests a caller that does not report sent
//! elsewhere than hinted, and the work other server replicas hinted, until
//! the next report counts them.
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

/// Fewest entries of the busy list before a write prunes it.
const MIN_PRUNE: usize = 16;

/// Weight of the newest hint in a replica's mean delivered work.
const MEAN_WEIGHT: f64 = 0.1;

/// Fractional bits of a fixed-point recent count: one hint delivered at the
/// epoch is `1 << RECENT_FRAC`.
const RECENT_FRAC: i32 = 24;

/// Half-lives after which the epoch moves forward (counts shift right by
/// as many bits): a hint then adds at most `2^(RECENT_FRAC + 16)`, so a
/// replica's `u64` count holds millions of hints within its decay.
const REBASE_HALF_LIVES: i64 = 16;

/// One hint delivered at `now`, in fixed point relative to `epoch`.
fn hint_at(now_ns: i64, epoch_ns: i64) -> u64 {
    let x = now_ns.saturating_sub(epoch_ns) as f64 / RECENT_HALF_LIFE_NS as f64;
    (f64::from(RECENT_FRAC) + x).exp2() as u64
}

#[derive(Debug, Clone, Copy, Default)]
struct Queue {
    /// When the queued work is done, ns (work drains at 1 µs/µs).
    finish_ns: i64,
    /// Hints delivered, each weighted `2^((t - epoch) / half-life)` in
    /// fixed point ([`RECENT_FRAC`]): the decayed count at `now` is this
    /// times `2^(-(now - epoch) / half-life)`, the same factor for every
    /// replica, so counts compare and sum exactly, with one `exp2` per
    /// lookup instead of one per replica.
    recent: u64,
    /// Hints delivered so far (metrics and tests).
    delivered: u64,
    /// Mean work of the hints delivered (exponentially weighted), µs.
    mean_work_us: f64,
    /// Time of the last engine load report applied, ns (0: none).
    reported_ns: i64,
    /// The queue does not drain before this (a caller's count holds until
    /// its next, [`LoadTracker::restart`]); 0: it drains from now.
    hold_until_ns: i64,
}

impl Queue {
    /// The bounded-load count at `now`: with the engine's reports, the
    /// hints of the current busy period only, none once its work is done
    /// (what the next hint restarts from, [`LoadTracker::add_n`]).
    fn count_at(&self, now_ns: i64) -> u64 {
        if self.ran_dry(now_ns) { 0 } else { self.recent }
    }

    /// With the engine's reports, whether the work of every hint is done
    /// by `now` (the busy period is over).
    fn ran_dry(&self, now_ns: i64) -> bool {
        self.reported_ns > 0 && self.finish_ns <= now_ns
    }

    fn at(&self, now_ns: i64) -> f64 {
        let from = self.hold_until_ns.max(now_ns);
        // Without a branch: whether a replica's queue ran dry is a coin
        // toss per replica, and a lookup reads every matched one's.
        self.finish_ns.saturating_sub(from).max(0) as f64 / 1_000.0
    }
}

/// A fleet whose recent counts are summed as they change
/// (`cold.rs`: the bounded-load mean without a pass over the fleet).
#[derive(Default)]
struct Group {
    /// Members, one bit per replica id.
    members: Vec<u64>,
    /// Σ `recent` over the members whose engine never reported: their
    /// counts only decay. A reporting member's count is zero once its
    /// queue runs dry, a change no write sees: those are summed at the
    /// lookup from the busy list ([`LoadView::group_sum`]).
    unreported: u128,
}

impl Group {
    fn has(&self, id: u32) -> bool {
        self.members
            .get(id as usize / 64)
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }
}

/// Everything under the tracker's lock.
#[derive(Default)]
struct State {
    queues: Vec<Queue>,
    /// Time the fixed-point counts are relative to (set by the first hint).
    epoch_ns: Option<i64>,
    /// Every replica whose work may not be done, unordered (a lookup skips
    /// those done; writes prune them). Few: the replicas hinted within
    /// about one request's work.
    busy: Vec<u32>,
    /// By replica: 1 + its position in `busy`; 0: not there.
    busy_at: Vec<u32>,
    /// `busy`'s length at which the next write prunes it.
    prune_at: usize,
    /// (recent, replica) of every replica with a non-zero count.
    by_recent: SortedPairs,
    /// Registered fleets' sums, by slot.
    groups: Vec<Group>,
    /// Replicas whose engine has reported (a lookup sums their busy
    /// members' counts only when there are any).
    reported: usize,
}

impl State {
    fn queue(&mut self, i: u32) -> &mut Queue {
        let i = i as usize;
        if self.queues.len() <= i {
            self.queues.resize(i + 1, Queue::default());
        }
        &mut self.queues[i]
    }

    /// Moves `replica`'s finish time to `finish`, keeping `busy` in step.
    fn set_finish(&mut self, replica: u32, finish: i64, now_ns: i64) {
        self.queue(replica).finish_ns = finish;
        let r = replica as usize;
        if self.busy_at.len() <= r {
            self.busy_at.resize(r + 1, 0);
        }
        if finish > now_ns && self.busy_at[r] == 0 {
            self.busy.push(replica);
            self.busy_at[r] = self.busy.len() as u32;
        }
        // Prune the replicas done by now (this one too, if it is), once
        // the list has doubled since the last prune: amortised O(1) a
        // hint (readers skip the done ones, `LoadView::busy`).
        if self.busy.len() < self.prune_at {
            return;
        }
        let mut i = 0;
        while i < self.busy.len() {
            let x = self.busy[i];
            if self.queues[x as usize].finish_ns > now_ns {
                i += 1;
                continue;
            }
            self.unbusy(x);
        }
        self.prune_at = (2 * self.busy.len()).max(MIN_PRUNE);
    }

    /// Takes `replica` out of `busy`.
    fn unbusy(&mut self, replica: u32) {
        let Some(at) = self.busy_at.get(replica as usize).copied() else {
            return;
        };
        if at == 0 {
            return;
        }
        let i = at as usize - 1;
        self.busy.swap_remove(i);
        self.busy_at[replica as usize] = 0;
        if let Some(&moved) = self.busy.get(i) {
            self.busy_at[moved as usize] = at;
        }
    }

    /// Sets `replica`'s fixed-point count, keeping the order and the sums
    /// in step.
    fn set_recent(&mut self, replica: u32, recent: u64) {
        let q = self.queue(replica);
        let old = std::mem::replace(&mut q.recent, recent);
        if old == recent {
            return;
        }
        match (old > 0, recent > 0) {
            (true, true) => self.by_recent.replace((old, replica), (recent, replica)),
            (true, false) => self.by_recent.remove((old, replica)),
            (false, true) => self.by_recent.insert((recent, replica)),
            (false, false) => {}
        }
        if self.queues[replica as usize].reported_ns > 0 {
            // Summed at the lookup (`Group::unreported`).
            return;
        }
        for g in &mut self.groups {
            if g.has(replica) {
                g.unreported = g.unreported - u128::from(old) + u128::from(recent);
            }
        }
    }

    /// The epoch for a hint at `now`: set by the first, moved forward by
    /// whole half-lives (every count shifted right) once far behind.
    fn epoch(&mut self, now_ns: i64) -> i64 {
        let Some(e) = self.epoch_ns else {
            self.epoch_ns = Some(now_ns);
            return now_ns;
        };
        let k = now_ns.saturating_sub(e) / RECENT_HALF_LIFE_NS;
        if k < REBASE_HALF_LIVES {
            return e;
        }
        let e = e + k * RECENT_HALF_LIFE_NS;
        self.epoch_ns = Some(e);
        let shift = u32::try_from(k).unwrap_or(u32::MAX).min(63);
        self.by_recent.0.clear();
        for (i, q) in self.queues.iter_mut().enumerate() {
            q.recent >>= shift;
            if q.recent > 0 {
                self.by_recent.0.push((q.recent, i as u32));
            }
        }
        self.by_recent.0.sort_unstable();
        for g in &mut self.groups {
            g.unreported = sum_of(&self.queues, &g.members);
        }
        e
    }
}

/// A set of (count, replica) kept as a sorted vector: a fleet's worth of
/// pairs, where a delivery's remove and insert are a binary search and a
/// short move each (a `BTreeSet`'s were a sixth of a delivery).
#[derive(Default)]
struct SortedPairs(Vec<(u64, u32)>);

impl SortedPairs {
    fn insert(&mut self, x: (u64, u32)) {
        if let Err(i) = self.0.binary_search(&x) {
            self.0.insert(i, x);
        }
    }

    fn remove(&mut self, x: (u64, u32)) {
        if let Ok(i) = self.0.binary_search(&x) {
            self.0.remove(i);
        }
    }

    /// `old` becomes `new`: the pairs between the two places move by one
    /// (a hint moves its replica up past the few counts it overtakes,
    /// where a remove and an insert moved the whole tail twice).
    fn replace(&mut self, old: (u64, u32), new: (u64, u32)) {
        let Ok(i) = self.0.binary_search(&old) else {
            self.insert(new);
            return;
        };
        let v = &mut self.0;
        if new > old {
            // First place after `i` whose pair is not below `new`.
            let j = i + 1 + v[i + 1..].partition_point(|p| *p < new);
            v[i..j].rotate_left(1);
            v[j - 1] = new;
        } else {
            let j = v[..i].partition_point(|p| *p < new);
            v[j..=i].rotate_right(1);
            v[j] = new;
        }
    }
}

/// Σ `recent` of the `members` whose engine never reported.
fn sum_of(queues: &[Queue], members: &[u64]) -> u128 {
    let mut s = 0;
    for (w, &word) in members.iter().enumerate() {
        let mut word = word;
        while word != 0 {
            let i = w * 64 + word.trailing_zeros() as usize;
            word &= word - 1;
            s += queues
                .get(i)
                .filter(|q| q.reported_ns == 0)
                .map_or(0, |q| u128::from(q.recent));
        }
    }
    s
}

/// Per replica id queued work (a replica's queue is physical: every tenant
/// and model it serves shares it). Indexed by the dense replica id: a lookup
/// reads every queue it needs under one read lock.
#[derive(Default)]
pub(crate) struct LoadTracker {
    state: RwLock<State>,
}

/// The queues read-locked at one instant, for one lookup.
pub(crate) struct LoadView<'a> {
    s: RwLockReadGuard<'a, State>,
    now_ns: i64,
    /// Decay of the fixed-point counts from the epoch to `now`, with the
    /// fixed point's scale.
    scale: f64,
}

impl LoadView<'_> {
    /// Queued work of a replica, µs.
    pub(crate) fn queued_us(&self, replica: u32) -> f64 {
        self.s
            .queues
            .get(replica as usize)
            .map_or(0.0, |q| q.at(self.now_ns))
    }

    /// A replica's recent count in fixed point (sums exactly), as the
    /// bounded-load rule reads it now ([`Queue::count_at`]).
    pub(crate) fn raw_recent(&self, replica: u32) -> u64 {
        self.s
            .queues
            .get(replica as usize)
            .map_or(0, |q| q.count_at(self.now_ns))
    }

    /// Hints delivered to a replica recently (decayed count, see
    /// [`RECENT_HALF_LIFE_NS`]).
    #[cfg(test)]
    pub(crate) fn recent_hints(&self, replica: u32) -> f64 {
        self.recent_of(self.raw_recent(replica))
    }

    /// The decayed count of fixed-point count `raw`.
    #[inline]
    pub(crate) fn recent_of(&self, raw: u64) -> f64 {
        raw as f64 * self.scale
    }

    /// The mean decayed count of `n` replicas whose fixed-point counts sum
    /// to `sum` (every ranking computes it this way, so they agree).
    pub(crate) fn mean_recent(&self, sum: u128, n: usize) -> f64 {
        sum as f64 * self.scale / n as f64
    }

    /// Replicas whose queue is not empty at `now`, in no particular order.
    pub(crate) fn busy(&self) -> impl Iterator<Item = u32> + '_ {
        self.s
            .busy
            .iter()
            .copied()
            .filter(|&r| self.s.queues[r as usize].finish_ns > self.now_ns)
    }

    /// Replicas whose decayed count is over `limit`, highest first.
    pub(crate) fn over(&self, limit: f64) -> impl Iterator<Item = u32> + '_ {
        self.s
            .by_recent
            .0
            .iter()
            .rev()
            .take_while(move |&&(raw, _)| self.recent_of(raw) > limit)
            // A count whose work is all done reads zero (`Queue::count_at`).
            .filter(move |&&(_, r)| self.recent_of(self.raw_recent(r)) > limit)
            .map(|&(_, r)| r)
    }

    /// Σ fixed-point counts of the fleet registered in `slot`, as
    /// [`Self::raw_recent`] reads each: the members that never reported,
    /// summed as they change, and the busy ones that did (a reporting
    /// member that is not busy counts zero).
    pub(crate) fn group_sum(&self, slot: usize) -> u128 {
        let Some(g) = self.s.groups.get(slot) else {
            return 0;
        };
        if self.s.reported == 0 {
            return g.unreported;
        }
        let reporting_busy: u128 = self
            .busy()
            .filter(|&r| g.has(r) && self.s.queues[r as usize].reported_ns > 0)
            .map(|r| u128::from(self.s.queues[r as usize].recent))
            .sum();
        g.unreported + reporting_busy
    }
}

impl LoadTracker {
    /// The queues read-locked at `now`.
    pub(crate) fn view(&self, now_ns: i64) -> LoadView<'_> {
        let s = read(&self.state);
        let scale = s.epoch_ns.map_or(0.0, |e| {
            let x = now_ns.saturating_sub(e) as f64 / RECENT_HALF_LIFE_NS as f64;
            (-x - f64::from(RECENT_FRAC)).exp2()
        });
        LoadView { s, now_ns, scale }
    }

    /// Queued work of a replica at `now`, µs.
    pub(crate) fn queued_us(&self, replica: u32, now_ns: i64) -> f64 {
        self.view(now_ns).queued_us(replica)
    }

    /// Registers the fleet `members` (a bitset by replica id) in `slot`:
    /// its recent counts are summed from now on as they change.
    pub(crate) fn register_group(&self, slot: usize, members: Vec<u64>) {
        let mut s = write(&self.state);
        if s.groups.len() <= slot {
            s.groups.resize_with(slot + 1, Group::default);
        }
        let unreported = sum_of(&s.queues, &members);
        s.groups[slot] = Group {
            members,
            unreported,
        };
    }

    /// Drops every registered fleet.
    pub(crate) fn clear_groups(&self) {
        write(&self.state).groups.clear();
    }

    /// A hint for `work_us` of prefill was delivered to the replica.
    pub(crate) fn add(&self, replica: u32, work_us: f64, now_ns: i64) {
        self.add_n(replica, work_us, 1, now_ns);
    }

    /// `n` hints of `work_us` each were delivered to the replica (another
    /// server's batch, `remote_load.rs`): the same as `n` calls of
    /// [`Self::add`], under one lock and with the ordered sets written once.
    pub(crate) fn add_n(&self, replica: u32, work_us: f64, n: u32, now_ns: i64) {
        if n == 0 {
            return;
        }
        let mut s = write(&self.state);
        let epoch = s.epoch(now_ns);
        let mut q = *s.queue(replica);
        if q.ran_dry(now_ns) {
            // A new busy period: with the engine's counts, the bounded-load
            // count is the hints sent since the engine last counted or since
            // the replica's queue last ran dry (module docs).
            q.recent = 0;
        }
        let work_us = work_us.max(0.0);
        let step = (work_us * 1_000.0).round() as i64;
        let hint = hint_at(now_ns, epoch);
        for _ in 0..n {
            q.finish_ns = q.finish_ns.max(now_ns).saturating_add(step);
            q.recent = q.recent.saturating_add(hint);
            q.mean_work_us = if q.delivered == 0 {
                work_us
            } else {
                q.mean_work_us + MEAN_WEIGHT * (work_us - q.mean_work_us)
            };
            q.delivered += 1;
        }
        s.set_finish(replica, q.finish_ns, now_ns);
        s.set_recent(replica, q.recent);
        let slot = s.queue(replica);
        slot.mean_work_us = q.mean_work_us;
        slot.delivered = q.delivered;
    }

    /// The engine reported `running` and `waiting` requests at `at_ns`: the
    /// queue restarts from that (module docs). A report older than the last
    /// one applied is ignored.
    pub(crate) fn report(&self, replica: u32, running: u32, waiting: u32, at_ns: i64) {
        let mut s = write(&self.state);
        let q = *s.queue(replica);
        if at_ns < q.reported_ns {
            return;
        }
        let per_request = if q.delivered > 0 {
            q.mean_work_us
        } else {
            DEFAULT_REQUEST_WORK_US
        };
        let work = per_request * (f64::from(waiting) + 0.5 * f64::from(running));
        Self::restart_locked(&mut s, replica, work, at_ns, at_ns);
    }

    /// Callers (gateways) counted `work_us` of work on the replica at
    /// `at_ns` and count again by `hold_until_ns` (`remote_load.rs`): the
    /// queue restarts from it, as from an engine report, and holds it (no
    /// draining) until then: requests in flight are not done because time
    /// passed; the caller's next count says what is left. Older than the
    /// last restart: ignored.
    pub(crate) fn restart(&self, replica: u32, work_us: f64, at_ns: i64, hold_until_ns: i64) {
        let mut s = write(&self.state);
        if at_ns < s.queue(replica).reported_ns {
            return;
        }
        Self::restart_locked(&mut s, replica, work_us, at_ns, hold_until_ns);
    }

    fn restart_locked(s: &mut State, replica: u32, work: f64, at_ns: i64, hold_until_ns: i64) {
        let from = if work > 0.0 {
            hold_until_ns.max(at_ns)
        } else {
            at_ns
        };
        s.queue(replica).hold_until_ns = from;
        s.set_finish(
            replica,
            from.saturating_add((work * 1_000.0).round() as i64),
            at_ns,
        );
        // The bounded-load rule's count restarts too: the engine's counts
        // are the load now, not the hints of the last 120 s. (Before the
        // replica counts as reporting: its count leaves the unreported sums.)
        s.set_recent(replica, 0);
        if s.queue(replica).reported_ns == 0 {
            s.reported += 1;
        }
        s.queue(replica).reported_ns = at_ns;
    }

    /// Hints delivered to a replica recently (decayed count, see
    /// [`RECENT_HALF_LIFE_NS`]).
    #[cfg(test)]
    pub(crate) fn recent_hints(&self, replica: u32, now_ns: i64) -> f64 {
        self.view(now_ns).recent_hints(replica)
    }

    /// Hints delivered to a replica so far.
    pub(crate) fn delivered(&self, replica: u32) -> u64 {
        read(&self.state)
            .queues
            .get(replica as usize)
            .map_or(0, |q| q.delivered)
    }

    /// Drops a released replica's queue, so an id reused for another
    /// replica starts with none (`replicas.rs`).
    pub(crate) fn forget(&self, replica: u32) {
        let mut s = write(&self.state);
        if (replica as usize) < s.queues.len() {
            s.unbusy(replica);
            s.set_recent(replica, 0);
            if s.queue(replica).reported_ns > 0 {
                s.reported -= 1;
            }
            *s.queue(replica) = Queue::default();
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
    fn counts_survive_the_epoch_moving_forward_and_sums_follow_them() {
        let t = LoadTracker::default();
        t.register_group(0, vec![0b110]);
        t.add(1, 0.0, 0);
        t.add(2, 0.0, 0);
        t.add(2, 0.0, RECENT_HALF_LIFE_NS);
        // Twenty half-lives on: the epoch moves, every count shifts.
        let late = 20 * RECENT_HALF_LIFE_NS;
        t.add(1, 0.0, late);
        let v = t.view(late);
        assert!((v.recent_hints(1) - 1.0).abs() < 1e-5);
        assert!((v.recent_hints(2) - 0.0).abs() < 1e-5);
        let members = u128::from(v.raw_recent(1)) + u128::from(v.raw_recent(2));
        assert_eq!(v.group_sum(0), members);
        // Highest first; a report restarts a count and the sum follows.
        assert_eq!(v.over(0.5).collect::<Vec<_>>(), vec![1]);
        drop(v);
        t.report(1, 0, 0, late);
        let v = t.view(late);
        assert_eq!(v.group_sum(0), u128::from(v.raw_recent(2)));
        assert_eq!(v.over(0.0).count(), usize::from(v.raw_recent(2) > 0));
    }

    #[test]
    fn with_reports_the_recent_count_restarts_when_the_queue_ran_dry() {
        let t = LoadTracker::default();
        t.report(1, 0, 0, 1_000);
        // Three sequential hints, each 1 ms of work, 100 ms apart: each
        // finds the queue dry, so the count is the busy period's, one.
        for k in 1..=3 {
            t.add(1, 1_000.0, k * 100_000_000);
        }
        assert!((t.recent_hints(1, 300_000_000) - 1.0).abs() < 1e-3);
        // Hints that overlap (the queue still busy) add up.
        t.add(1, 1_000.0, 300_500_000);
        t.add(1, 1_000.0, 300_600_000);
        assert!((t.recent_hints(1, 300_600_000) - 3.0).abs() < 1e-3);
        // Without reports the count is the hints' alone, as before.
        t.add(2, 1_000.0, 100_000_000);
        t.add(2, 1_000.0, 200_000_000);
        assert!((t.recent_hints(2, 200_000_000) - 2.0).abs() < 1e-3);
    }

    #[test]
    fn a_lookup_reads_a_count_whose_work_is_done_as_zero() {
        // real_vllm's idle-holder step: three hints in one busy period,
        // then a lookup once their work is done (before any new hint).
        let t = LoadTracker::default();
        t.register_group(0, vec![0b110]);
        t.report(1, 0, 0, 1_000);
        for k in 0..3 {
            t.add(1, 35_000.0, k * 20_000_000);
        }
        t.add(2, 0.0, 0); // no reports: its count only decays
        let at = |now| {
            let v = t.view(now);
            (
                v.recent_hints(1),
                v.group_sum(0),
                v.over(0.5).collect::<Vec<_>>(),
            )
        };
        let (busy, sum, over) = at(100_000_000);
        assert!((busy - 3.0).abs() < 1e-2, "{busy}");
        assert_eq!(over, vec![1, 2]);
        let v = t.view(100_000_000);
        assert_eq!(
            sum,
            u128::from(v.raw_recent(1)) + u128::from(v.raw_recent(2))
        );
        drop(v);
        // 3 x 35 ms from the report: done just after 105 ms.
        let (done, sum, over) = at(106_000_000);
        assert_eq!(done, 0.0);
        assert_eq!(over, vec![2]);
        assert_eq!(sum, u128::from(t.view(106_000_000).raw_recent(2)));
        // The next hint starts the count from one, as the lookup read it.
        t.add(1, 1_000.0, 200_000_000);
        assert!((t.recent_hints(1, 200_000_000) - 1.0).abs() < 1e-3);
        // A first report takes the count out of the unreported sum.
        t.report(2, 0, 0, 300_000_000);
        assert_eq!(t.view(300_000_000).group_sum(0), 0);
        t.forget(2);
        t.add(2, 0.0, 400_000_000);
        let v = t.view(400_000_000);
        assert_eq!(v.group_sum(0), u128::from(v.raw_recent(2)));
    }

    #[test]
    fn busy_lists_the_replicas_with_work_left() {
        let t = LoadTracker::default();
        t.add(1, 1_000.0, 0);
        t.add(2, 3_000.0, 0);
        let busy = |now| {
            let mut b: Vec<u32> = t.view(now).busy().collect();
            b.sort_unstable();
            b
        };
        assert_eq!(busy(0), vec![1, 2]);
        assert_eq!(busy(1_000_000), vec![2], "done at its finish time");
        assert_eq!(busy(3_000_000), Vec::<u32>::new());
        t.forget(2);
        assert_eq!(busy(0), vec![1]);
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

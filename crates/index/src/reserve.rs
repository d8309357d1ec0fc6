//! The victim reserve shared by the global cap (`cap.rs`, one reserve of
//! (key, replica) entries) and the tenant quotas (`quota.rs`, one reserve of
//! whole keys per tenant).
//!
//! Both follow a total victim order and must evict exactly in that order
//! without a full scan per over-budget write. One scan (read locks only)
//! gathers the `k` smallest candidates ([`Gather`]); the largest becomes the
//! *threshold*. The reserve then keeps this invariant, maintained by write
//! hooks under the shard lock of the changed key:
//!
//! > every live candidate whose current key is `<= threshold` has an item in
//! > the reserve whose key is `<=` its current key.
//!
//! A popped item is either exact (item key == current key: the global
//! minimum) or stale (re-pushed with its current key if still admitted).
//!
//! Storage: the scan's candidates are sorted once, largest first, and
//! consumed from the end (no heap pop per victim); only items pushed after
//! the scan (hooks, stale re-pushes) go through a small heap. [`Reserve::take`]
//! hands out the next `n` victims in order under one lock, so a batch of
//! evictions takes the reserve lock once, not once per victim.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

/// No reserve: hooks do nothing, the next enforcement scans.
pub(crate) const IDLE: u8 = 0;
/// A scan is running: hooks record their items, merged when it completes.
pub(crate) const RECORDING: u8 = 1;
/// The invariant holds: hooks push admitted items.
pub(crate) const ACTIVE: u8 = 2;

/// What a hook did to the reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hooked {
    /// Recorded, pushed or not admitted.
    Kept,
    /// The reserve outgrew its bound and was dropped (mode is now [`IDLE`]).
    Dropped,
}

/// A victim reserve over items of type `V` (ordered by victim order).
pub(crate) struct Reserve<V> {
    pub(crate) mode: u8,
    /// The scan's candidates, largest first: the next victim is at the end.
    sorted: Vec<V>,
    /// Items pushed since the scan (hooks, stale re-pushes).
    pushed: BinaryHeap<Reverse<V>>,
    threshold: Option<V>,
    /// Hook items recorded while a scan runs.
    recorded: Vec<V>,
    /// Item bound: past it (many writes below the threshold while nothing
    /// is evicted) the reserve is dropped and rebuilt on demand.
    limit: usize,
}

impl<V: Ord + Clone> Reserve<V> {
    pub(crate) fn new() -> Self {
        Self {
            mode: IDLE,
            sorted: Vec::new(),
            pushed: BinaryHeap::new(),
            threshold: None,
            recorded: Vec::new(),
            limit: 0,
        }
    }

    /// Whether a candidate is at or below the threshold; `cmp` compares the
    /// candidate with the threshold item.
    pub(crate) fn admits(&self, cmp: impl FnOnce(&V) -> Ordering) -> bool {
        self.threshold
            .as_ref()
            .is_some_and(|t| cmp(t) != Ordering::Greater)
    }

    /// Drop every item and enter `mode`.
    pub(crate) fn reset(&mut self, mode: u8) {
        self.mode = mode;
        self.sorted.clear();
        self.pushed.clear();
        self.recorded.clear();
        self.threshold = None;
    }

    /// The write hook: record during a scan, push an admitted item while
    /// active. `cmp` compares the candidate with the threshold; `make`
    /// builds the item only when it is kept.
    pub(crate) fn hook(
        &mut self,
        cmp: impl FnOnce(&V) -> Ordering,
        make: impl FnOnce() -> V,
    ) -> Hooked {
        match self.mode {
            RECORDING => self.recorded.push(make()),
            ACTIVE if self.admits(cmp) => {
                if self.len() >= self.limit {
                    self.reset(IDLE);
                    return Hooked::Dropped;
                }
                self.pushed.push(Reverse(make()));
            }
            _ => {}
        }
        Hooked::Kept
    }

    fn len(&self) -> usize {
        self.sorted.len() + self.pushed.len()
    }

    fn pop(&mut self) -> Option<V> {
        let from_sorted = match (self.sorted.last(), self.pushed.peek()) {
            (Some(a), Some(Reverse(b))) => a <= b,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if from_sorted {
            self.sorted.pop()
        } else {
            self.pushed.pop().map(|r| r.0)
        }
    }

    /// Move the next `n` victims (fewer if the reserve runs dry), smallest
    /// first, into `out`. Nothing while not active.
    pub(crate) fn take(&mut self, n: usize, out: &mut Vec<V>) {
        if self.mode != ACTIVE {
            return;
        }
        for _ in 0..n {
            match self.pop() {
                Some(v) => out.push(v),
                None => break,
            }
        }
    }

    /// Give back taken items that were not examined (ascending, as taken):
    /// they are still the smallest items, so they go back to the end of the
    /// sorted run in O(1) each.
    pub(crate) fn give_back(&mut self, rest: impl DoubleEndedIterator<Item = V>) {
        if self.mode != ACTIVE {
            return;
        }
        for v in rest.rev() {
            self.sorted.push(v);
        }
    }

    /// Push a stale item with its current key if it is still admitted.
    pub(crate) fn repush(&mut self, v: V) {
        if self.mode == ACTIVE && self.admits(|t| v.cmp(t)) {
            self.pushed.push(Reverse(v));
        }
    }

    /// Install a scan's candidates (the `k` smallest, any order) and merge
    /// what the hooks recorded meanwhile. False (and idle) when the scan
    /// found nothing.
    pub(crate) fn install(&mut self, mut gathered: Vec<V>, limit: usize) -> bool {
        gathered.sort_unstable_by(|a, b| b.cmp(a));
        let Some(max) = gathered.first().cloned() else {
            self.reset(IDLE);
            return false;
        };
        self.threshold = Some(max);
        self.limit = limit;
        self.sorted = gathered;
        self.pushed.clear();
        let recorded = std::mem::take(&mut self.recorded);
        self.mode = ACTIVE;
        for r in recorded {
            if self.admits(|t| r.cmp(t)) {
                self.pushed.push(Reverse(r));
            }
        }
        true
    }
}

/// Keeps the `k` smallest offered candidates: kept ones are appended to a
/// buffer, and when it holds half as many again as `k` a selection
/// (`select_nth_unstable`, linear) keeps the `k` smallest, the largest of
/// which then turns away every later candidate not below it without
/// building it. A scan's gather costs about a comparison per candidate,
/// not the max-heap's pop and push (log `k` comparisons each) per kept
/// one: with the heap, gathering was 40 % of an ingest at the cap
/// (BENCHMARKS.md, "Index at its cap").
pub(crate) struct Gather<V> {
    k: usize,
    buf: Vec<V>,
    /// `buf[k - 1]` is the largest of the last selection (the bound).
    bounded: bool,
}

impl<V: Ord> Gather<V> {
    pub(crate) fn new(k: usize) -> Self {
        Self {
            k,
            buf: Vec::with_capacity(Self::room(k).min(1 << 20)),
            bounded: false,
        }
    }

    /// Buffer length that triggers a selection.
    fn room(k: usize) -> usize {
        k.saturating_add(k / 2).max(k.saturating_add(16))
    }

    /// Offer a candidate: `cmp` compares it with the current bound; `make`
    /// builds it only when it is kept.
    #[inline]
    pub(crate) fn offer(&mut self, cmp: impl FnOnce(&V) -> Ordering, make: impl FnOnce() -> V) {
        if self.k == 0 {
            return;
        }
        if self.bounded {
            if let Some(b) = self.buf.get(self.k - 1) {
                if cmp(b) != Ordering::Less {
                    return;
                }
            }
        }
        self.buf.push(make());
        if self.buf.len() >= Self::room(self.k) {
            self.select();
        }
    }

    /// Keep the `k` smallest, the largest of them at `k - 1`.
    fn select(&mut self) {
        if self.buf.len() > self.k {
            self.buf.select_nth_unstable(self.k - 1);
            self.buf.truncate(self.k);
            self.bounded = true;
        }
    }

    /// The largest kept candidate once a selection has run (every later
    /// candidate not below it is turned away), else `None` (all are kept).
    pub(crate) fn bound(&self) -> Option<&V> {
        self.buf
            .get(self.k.wrapping_sub(1))
            .filter(|_| self.bounded)
    }

    pub(crate) fn into_vec(mut self) -> Vec<V> {
        self.select();
        self.buf
    }
}

/// The smallest of `later` (re-pushed items of this batch) is below `next`:
/// the batch must stop and let the reserve order them.
pub(crate) fn overtaken<V: Ord>(later: &[V], next: &V) -> bool {
    later.iter().any(|l| l < next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_merges_sorted_and_pushed_in_order() {
        let mut r: Reserve<u32> = Reserve::new();
        r.mode = RECORDING;
        assert!(r.install(vec![5, 1, 9, 3], 100));
        // 9 is the threshold: 4 is admitted, 10 is not.
        assert_eq!(r.hook(|t| 4.cmp(t), || 4), Hooked::Kept);
        assert_eq!(r.hook(|t| 10.cmp(t), || 10), Hooked::Kept);
        let mut out = Vec::new();
        r.take(3, &mut out);
        assert_eq!(out, vec![1, 3, 4]);
        r.give_back(out.drain(1..));
        r.take(10, &mut out);
        assert_eq!(out, vec![1, 3, 4, 5, 9]);
    }

    #[test]
    fn gather_keeps_the_k_smallest() {
        let mut g = Gather::new(2);
        for x in [7u32, 3, 9, 1, 4] {
            g.offer(|top| x.cmp(top), || x);
        }
        let mut v = g.into_vec();
        v.sort_unstable();
        assert_eq!(v, vec![1, 3]);
    }

    #[test]
    fn a_reserve_past_its_limit_is_dropped() {
        let mut r: Reserve<u32> = Reserve::new();
        assert!(r.install(vec![2, 8], 3));
        assert_eq!(r.hook(|t| 1.cmp(t), || 1), Hooked::Kept);
        assert_eq!(r.hook(|t| 1.cmp(t), || 1), Hooked::Dropped);
        assert_eq!(r.mode, IDLE);
    }
}

//! The order requests end in, which the server does not see: when each
//! request the model saw start started, and the eviction order a claim is
//! checked against while that order is unknown.
//!
//! vLLM frees a request's blocks when it *ends* (tail first, to the back of
//! the free queue), and a block shared by requests when the last of them
//! ends. The model places blocks by when their last request *started*.
//! The two agree while requests end in the order they start; under
//! concurrency a short cache hit that started after a long miss ends
//! first, so the engine evicts the hit's blocks (a prefix the next hint
//! claims) before the miss's, while the model had the miss's blocks in
//! front, and claimed one block too many (issue 33's 4-client `after`
//! over-claim, session 48; the miss's blocks are not even free while it
//! runs). Which of two overlapping requests ends first depends on their
//! lengths and the engine's batching, neither of which the server sees, so
//! a claim is checked pessimistically where it depends on it: the blocks of
//! a claimed block's start are checked as if freed before everything that
//! started within [`END_ORDER_WINDOW`] before it. Blocks that started
//! earlier than that keep their place in front, and the rest of the order
//! (what the requests waiting pop) is unchanged. An under-claim at worst.

use inferencecache_foresight::FreeQueue;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// How long a request is taken to possibly outlive one that started after
/// it: blocks that started within this of a claimed block's start may be
/// freed after it. Past it the model trusts the start order.
pub(crate) const END_ORDER_WINDOW: Duration = Duration::from_secs(2);

/// The starts that placed blocks in the eviction order: (first key, when),
/// oldest first. Keys and times both only grow.
#[derive(Debug, Default)]
pub(crate) struct Starts {
    log: VecDeque<(u64, Instant)>,
}

impl Starts {
    /// A start whose blocks take keys from `key` on, at `at`.
    pub(crate) fn push(&mut self, key: u64, at: Instant) {
        // A caller's clock read before another's may arrive later: keep the
        // log sorted by time as well as by key.
        let at = self.log.back().map_or(at, |&(_, last)| at.max(last));
        if self.log.back().is_some_and(|&(k, _)| k == key) {
            self.log.pop_back();
        }
        self.log.push_back((key, at));
    }

    pub(crate) fn clear(&mut self) {
        self.log.clear();
    }

    /// Forgets starts whose keys are all older than `oldest` (the oldest
    /// key still held), keeping the one that placed it.
    pub(crate) fn forget_before(&mut self, oldest: u64) {
        while self.log.get(1).is_some_and(|&(k, _)| k <= oldest) {
            self.log.pop_front();
        }
    }

    /// Entries kept (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.log.len()
    }

    /// The start that placed `key`: its keys `[first, next)` and its time.
    fn group(&self, key: u64) -> Option<(u64, u64, Instant)> {
        let i = self
            .log
            .partition_point(|&(k, _)| k <= key)
            .checked_sub(1)?;
        let (first, at) = self.log[i];
        let next = self.log.get(i + 1).map_or(u64::MAX, |&(k, _)| k);
        Some((first, next, at))
    }

    /// The first key of the oldest start at or after `t`.
    fn first_since(&self, t: Option<Instant>) -> Option<u64> {
        let i = match t {
            Some(t) => self.log.partition_point(|&(_, at)| at < t),
            None => 0,
        };
        self.log.get(i).map(|&(k, _)| k)
    }
}

/// A model's free queue with the claim's starts moved forward as far as
/// the end order could put them ([`crate::foresight`]'s dry run checks the
/// claim against it).
pub(crate) struct EndOrder<'a, Q> {
    inner: &'a Q,
    /// Held blocks, key → hash, in the model's order.
    lru: &'a BTreeMap<u64, u64>,
    /// Moved blocks: (place: the key they go in front of, key, hash),
    /// sorted.
    moved: Vec<(u64, u64, u64)>,
    moved_keys: HashSet<u64>,
}

impl<'a, Q: FreeQueue<Block = u64>> EndOrder<'a, Q> {
    /// The order `claim` is checked against: `key_of` gives a held block's
    /// key.
    pub(crate) fn new(
        inner: &'a Q,
        lru: &'a BTreeMap<u64, u64>,
        starts: &Starts,
        claim: &[u64],
        key_of: impl Fn(u64) -> Option<u64>,
    ) -> Self {
        let mut moved = Vec::new();
        let mut groups: HashSet<u64> = HashSet::new();
        for key in claim.iter().filter_map(|&h| key_of(h)) {
            let Some((first, next, at)) = starts.group(key) else {
                continue;
            };
            if !groups.insert(first) {
                continue;
            }
            let place = starts
                .first_since(at.checked_sub(END_ORDER_WINDOW))
                .unwrap_or(first);
            if place >= first {
                continue;
            }
            // The whole start moves, its other blocks too: they are freed
            // with the claimed ones, tail first.
            moved.extend(lru.range(first..next).map(|(&k, &h)| (place, k, h)));
        }
        moved.sort_unstable();
        let moved_keys = moved.iter().map(|m| m.1).collect();
        Self {
            inner,
            lru,
            moved,
            moved_keys,
        }
    }
}

impl<Q: FreeQueue<Block = u64>> FreeQueue for EndOrder<'_, Q> {
    type Block = u64;

    fn blank_free(&self) -> usize {
        self.inner.blank_free()
    }

    fn eviction_order(&self) -> impl Iterator<Item = u64> + '_ {
        let mut rest = self
            .lru
            .iter()
            .filter(|(k, _)| !self.moved_keys.contains(k))
            .peekable();
        let mut moved = self.moved.iter().peekable();
        std::iter::from_fn(move || match (moved.peek(), rest.peek()) {
            (Some(m), Some((k, _))) if m.0 <= **k => moved.next().map(|m| m.2),
            (Some(_), None) => moved.next().map(|m| m.2),
            _ => rest.next().map(|(_, &h)| h),
        })
    }

    fn copies(&self, hash: u64) -> &[u64] {
        self.inner.copies(hash)
    }

    fn is_free(&self, block: u64) -> bool {
        self.inner.is_free(block)
    }

    fn gone(&self, hash: u64) -> bool {
        self.inner.gone(hash)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_within_the_window_goes_in_front_of_what_started_before_it() {
        let t0 = Instant::now();
        let mut s = Starts::default();
        s.push(0, t0);
        s.push(10, t0 + Duration::from_secs(5));
        s.push(20, t0 + Duration::from_secs(6));
        assert_eq!(s.group(15), Some((10, 20, t0 + Duration::from_secs(5))));
        assert_eq!(s.group(25).map(|g| g.0), Some(20));
        // 2 s before the start at key 20: the start at key 10 (5 s), not 0.
        assert_eq!(s.first_since(Some(t0 + Duration::from_secs(4))), Some(10));
        s.forget_before(12);
        assert_eq!(s.len(), 2);
        assert_eq!(s.group(12).map(|g| g.0), Some(10));
    }
}

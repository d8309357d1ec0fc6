//! Tentative holdings (approximate mode): what the server believes a replica
//! is about to hold because it has just sent it a request.
//!
//! When a hint is delivered in the estimated-TTFT ranking, the request's chain
//! is recorded on the chosen replica with a short TTL (CachePolicy v8
//! `routing.tentativeTTLSeconds`, default 120 s). A follow-up request that
//! arrives before the engine's KV events (or from an engine that publishes
//! none) then matches the replica it was sent to.
//!
//! Rules, each tested:
//! - a tentative holding counts in the estimated-TTFT ranking only (never in
//!   the contract ranking, the serving scope, the miss classifier, quotas, the
//!   cap, aggregates or `prefixCount`); it is counted separately
//!   (`/snapshot` `tentativeCount` / `tentativeEntries`, metrics);
//! - it expires after its TTL (checked on read, removed by the sweep);
//! - a real report of the same (key, replica) replaces it (the real entry
//!   carries the engine's own tier and timestamps);
//! - a real removal (`PREFIX_EVICTED` of that key, `ALL_CLEARED` of the
//!   replica) removes it too, so it never outlives what the engine says;
//! - the overlay is bounded (as many holdings as the index's entry cap): past the bound new
//!   holdings are dropped and counted, never grown.
//!
//! Keys are the index's 64-bit entry hash of (partition, hash bytes): a
//! collision would only make an approximate holding slightly more
//! approximate, and it saves an allocation per block.

use crate::hashing::FoldBuild;
use crate::shard::{read, write};
use std::collections::HashMap;
use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// key hash → expiry (Unix ns).
type Blocks = HashMap<u64, i64, FoldBuild>;

/// partition id → replica id → blocks.
type Parts = HashMap<u32, HashMap<u32, Blocks, FoldBuild>, FoldBuild>;

/// The tentative overlay. Lock order: never taken while a shard lock is held
/// by the same thread except after it (shard → tentative), like the counters.
pub(crate) struct Tentative {
    parts: RwLock<Parts>,
    len: AtomicUsize,
    cap: usize,
}

impl Tentative {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            parts: RwLock::new(Parts::default()),
            len: AtomicUsize::new(0),
            cap: cap.max(1),
        }
    }

    /// Holdings stored (expired ones included until the next sweep).
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// True when anything is stored: the ingest and event hooks skip all
    /// work otherwise.
    pub(crate) fn active(&self) -> bool {
        self.len() > 0
    }

    /// Records `keys` on `replica` until `expires`. Returns (inserted or
    /// renewed, dropped at the cap).
    pub(crate) fn insert(&self, part: u32, replica: u32, keys: &[u64], expires: i64) -> (u64, u64) {
        let mut parts = write(&self.parts);
        let blocks = parts.entry(part).or_default().entry(replica).or_default();
        let (mut stored, mut dropped) = (0, 0);
        for &k in keys {
            if let Some(e) = blocks.get_mut(&k) {
                *e = (*e).max(expires);
                stored += 1;
            } else if self.len.load(Ordering::Relaxed) < self.cap {
                blocks.insert(k, expires);
                self.len.fetch_add(1, Ordering::Relaxed);
                stored += 1;
            } else {
                dropped += 1;
            }
        }
        (stored, dropped)
    }

    /// Replicas with at least one holding in `part`.
    pub(crate) fn replicas(&self, part: u32) -> Vec<u32> {
        read(&self.parts)
            .get(&part)
            .map(|m| {
                m.iter()
                    .filter(|(_, b)| !b.is_empty())
                    .map(|(&r, _)| r)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// How many consecutive keys from `start` the replica holds unexpired.
    pub(crate) fn run_from(
        &self,
        part: u32,
        replica: u32,
        keys: &[u64],
        start: usize,
        now: i64,
    ) -> usize {
        let parts = read(&self.parts);
        let Some(blocks) = parts.get(&part).and_then(|m| m.get(&replica)) else {
            return 0;
        };
        keys.iter()
            .skip(start)
            .take_while(|k| blocks.get(k).is_some_and(|&e| e > now))
            .count()
    }

    /// Real reports of `(part, key)` by `replica` replace the tentative ones.
    pub(crate) fn confirm(&self, replica: u32, keys: &[(u32, u64)]) -> u64 {
        self.remove_many(replica, keys)
    }

    /// A real removal of `(part, key)` on `replica` removes the tentative one.
    pub(crate) fn remove_many(&self, replica: u32, keys: &[(u32, u64)]) -> u64 {
        if keys.is_empty() {
            return 0;
        }
        let mut parts = write(&self.parts);
        let mut n = 0;
        for &(part, k) in keys {
            if let Some(blocks) = parts.get_mut(&part).and_then(|m| m.get_mut(&replica)) {
                if blocks.remove(&k).is_some() {
                    n += 1;
                }
            }
        }
        self.len.fetch_sub(n as usize, Ordering::Relaxed);
        n
    }

    /// `ALL_CLEARED`: every holding of `replica` in the given partitions.
    pub(crate) fn clear(&self, parts_of: &[u32], replica: u32) -> u64 {
        let mut parts = write(&self.parts);
        let mut n = 0;
        for p in parts_of {
            if let Some(blocks) = parts.get_mut(p).and_then(|m| m.remove(&replica)) {
                n += blocks.len() as u64;
            }
        }
        self.len.fetch_sub(n as usize, Ordering::Relaxed);
        n
    }

    /// Removes expired holdings; returns how many.
    pub(crate) fn sweep(&self, now: i64) -> u64 {
        if !self.active() {
            return 0;
        }
        let mut parts = write(&self.parts);
        let mut n = 0u64;
        parts.retain(|_, m| {
            m.retain(|_, blocks| {
                let before = blocks.len();
                blocks.retain(|_, e| *e > now);
                n += (before - blocks.len()) as u64;
                !blocks.is_empty()
            });
            !m.is_empty()
        });
        self.len.fetch_sub(n as usize, Ordering::Relaxed);
        n
    }

    /// Unexpired holdings per (partition, replica).
    pub(crate) fn counts(&self, now: i64) -> Vec<(u32, u32, u64)> {
        let parts = read(&self.parts);
        let mut out = Vec::new();
        for (&p, m) in parts.iter() {
            for (&r, blocks) in m {
                let n = blocks.values().filter(|&&e| e > now).count() as u64;
                if n > 0 {
                    out.push((p, r, n));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_drops_and_counts() {
        let t = Tentative::new(3);
        assert_eq!(t.insert(1, 7, &[1, 2, 3, 4], 100), (3, 1));
        assert_eq!(t.len(), 3);
        // Renewing an existing key is not growth.
        assert_eq!(t.insert(1, 7, &[1], 200), (1, 0));
        assert_eq!(t.run_from(1, 7, &[1, 2, 3, 4], 0, 150), 1);
        assert_eq!(t.run_from(1, 7, &[1, 2, 3, 4], 0, 50), 3);
        assert_eq!(t.sweep(150), 2);
        assert_eq!(t.len(), 1);
        assert_eq!(t.clear(&[1], 7), 1);
        assert!(!t.active());
    }
}

//! Tentative holdings (approximate mode): what the server believes a replica
//! is about to hold because it has just sent it a request.
//!
//! When a hint is delivered in the estimated-TTFT ranking, the request's chain
//! is recorded on the chosen replica with a short TTL (CachePolicy v8
//! `routing.tentativeTTLSeconds`, default 120 s). A follow-up request that
//! arrives before the engine's KV events (or from an engine that publishes
//! none) then matches the replica it was sent to.
//!
//! Two lifetimes, chosen by what else the server knows about the replica:
//! - on a replica that **publishes KV events** (any real upsert, eviction or
//!   clear ever ingested from it), a holding only has to cover the sidecar's
//!   batching delay until the real report replaces it: the short TTL above;
//! - on a replica that **has never published one**, the holdings are the
//!   server's only source of truth about its cache, so they live as long as
//!   a real entry would (the tenant's TTL, at least the short one), bounded
//!   like everything else by the overlay's cap. A conversation's next turn
//!   typically comes minutes later (median gap 123 s on the Mooncake trace,
//!   BENCHMARKS.md), past the 120 s default.
//!
//! Every holding carries both expiries; which one counts is decided on read,
//! so a replica that starts publishing falls back to the short one at once.
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
use crate::sync::{read, write};
use std::collections::{HashMap, HashSet};
use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Both expiries of a holding (Unix ns): on a replica that publishes KV
/// events, on one that never has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expiry {
    /// Replica publishes events: the policy's `tentativeTTLSeconds`.
    pub(crate) publishing: i64,
    /// Replica never published: the tenant's TTL.
    pub(crate) silent: i64,
}

impl Expiry {
    fn of(&self, publishes: bool) -> i64 {
        if publishes {
            self.publishing
        } else {
            self.silent
        }
    }
}

/// key hash → expiries.
type Blocks = HashMap<u64, Expiry, FoldBuild>;

/// partition id → replica id → blocks.
type Parts = HashMap<u32, HashMap<u32, Blocks, FoldBuild>, FoldBuild>;

/// The tentative overlay. Lock order: never taken while a shard lock is held
/// by the same thread except after it (shard → tentative), like the counters.
pub(crate) struct Tentative {
    parts: RwLock<Parts>,
    /// Replicas that have published at least one KV event.
    publishers: RwLock<HashSet<u32, FoldBuild>>,
    len: AtomicUsize,
    cap: usize,
}

impl Tentative {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            parts: RwLock::new(Parts::default()),
            publishers: RwLock::new(HashSet::default()),
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

    /// The replica published a KV event (upsert, eviction or clear): its
    /// holdings count with their short expiry from now on.
    pub(crate) fn mark_publisher(&self, replica: u32) {
        if !read(&self.publishers).contains(&replica) {
            write(&self.publishers).insert(replica);
        }
    }

    /// Drops everything known about a released replica id (its publisher
    /// mark and any expired holdings left), so an id reused for another
    /// replica starts as a silent one with nothing (`replicas.rs`).
    pub(crate) fn forget_replica(&self, replica: u32) {
        write(&self.publishers).remove(&replica);
        let mut parts = write(&self.parts);
        let mut removed = 0;
        parts.retain(|_, m| {
            if let Some(blocks) = m.remove(&replica) {
                removed += blocks.len();
            }
            !m.is_empty()
        });
        self.len.fetch_sub(removed, Ordering::Relaxed);
    }

    /// Whether the replica has ever published a KV event.
    pub(crate) fn publishes(&self, replica: u32) -> bool {
        read(&self.publishers).contains(&replica)
    }

    /// Records `keys` on `replica` until `expires`. Returns (inserted or
    /// renewed, dropped at the cap).
    pub(crate) fn insert(
        &self,
        part: u32,
        replica: u32,
        keys: impl IntoIterator<Item = u64>,
        expires: Expiry,
    ) -> (u64, u64) {
        let mut parts = write(&self.parts);
        let blocks = parts.entry(part).or_default().entry(replica).or_default();
        let (mut stored, mut dropped) = (0, 0);
        for k in keys {
            if let Some(e) = blocks.get_mut(&k) {
                e.publishing = e.publishing.max(expires.publishing);
                e.silent = e.silent.max(expires.silent);
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
        let publishes = self.publishes(replica);
        let parts = read(&self.parts);
        let Some(blocks) = parts.get(&part).and_then(|m| m.get(&replica)) else {
            return 0;
        };
        keys.iter()
            .skip(start)
            .take_while(|k| blocks.get(k).is_some_and(|e| e.of(publishes) > now))
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
        let publishers = read(&self.publishers).clone();
        let mut parts = write(&self.parts);
        let mut n = 0u64;
        parts.retain(|_, m| {
            m.retain(|r, blocks| {
                let publishes = publishers.contains(r);
                let before = blocks.len();
                blocks.retain(|_, e| e.of(publishes) > now);
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
        let publishers = read(&self.publishers).clone();
        let parts = read(&self.parts);
        let mut out = Vec::new();
        for (&p, m) in parts.iter() {
            for (&r, blocks) in m {
                let publishes = publishers.contains(&r);
                let n = blocks.values().filter(|e| e.of(publishes) > now).count() as u64;
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

    fn both(at: i64) -> Expiry {
        Expiry {
            publishing: at,
            silent: at,
        }
    }

    #[test]
    fn cap_drops_and_counts() {
        let t = Tentative::new(3);
        assert_eq!(t.insert(1, 7, [1, 2, 3, 4], both(100)), (3, 1));
        assert_eq!(t.len(), 3);
        // Renewing an existing key is not growth.
        assert_eq!(t.insert(1, 7, [1], both(200)), (1, 0));
        assert_eq!(t.run_from(1, 7, &[1, 2, 3, 4], 0, 150), 1);
        assert_eq!(t.run_from(1, 7, &[1, 2, 3, 4], 0, 50), 3);
        assert_eq!(t.sweep(150), 2);
        assert_eq!(t.len(), 1);
        assert_eq!(t.clear(&[1], 7), 1);
        assert!(!t.active());
    }

    #[test]
    fn a_publishing_replica_reads_the_short_expiry() {
        let t = Tentative::new(10);
        let e = Expiry {
            publishing: 100,
            silent: 1_000,
        };
        t.insert(1, 7, [1, 2], e);
        t.insert(1, 8, [1, 2], e);
        // Neither has published: both hold until the long expiry.
        assert_eq!(t.run_from(1, 7, &[1, 2], 0, 500), 2);
        assert_eq!(t.counts(500).len(), 2);
        // 7 starts publishing: its holdings fall back to the short expiry.
        t.mark_publisher(7);
        assert!(t.publishes(7) && !t.publishes(8));
        assert_eq!(t.run_from(1, 7, &[1, 2], 0, 500), 0);
        assert_eq!(t.run_from(1, 8, &[1, 2], 0, 500), 2);
        assert_eq!(t.counts(500), vec![(1, 8, 2)]);
        assert_eq!(t.sweep(500), 2);
        assert_eq!(t.sweep(1_000), 2);
        assert!(!t.active());
    }
}

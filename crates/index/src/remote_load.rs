//! Deliveries another server replica made: the one entry point through which
//! the server applies the hints its peers delivered (received over the bus,
//! `crates/server` `replicate/load_share.rs`), so the ranking's load
//! (`load.rs`) counts the whole fleet's deliveries.
//!
//! A remote hint joins the replica's queue exactly as a local one does
//! (`LoadTracker::add`: its work queued, the bounded-load count bumped); only
//! the tentative holdings stay with the replica that delivered it (they are a
//! guess about a chain, kept where the guess was made). Unknown replicas are
//! not created: a peer's delivery names a replica this index knows from the
//! same stream, or one it has already released.

use crate::index::Index;
use crate::sync::read;

/// Hints applied per call at most (a peer's one-interval batch; anything
/// larger is garbage or a flood and is clamped).
pub const MAX_REMOTE_HINTS: u32 = 65_536;

impl Index {
    /// Applies `hints` hints another server replica delivered to
    /// `replica_id`, each standing for `work_us_each` µs of prefill work
    /// still queued now. False when the replica is unknown here (nothing
    /// applied).
    pub fn record_remote_deliveries(
        &self,
        replica_id: &str,
        hints: u32,
        work_us_each: f64,
    ) -> bool {
        // Shared with ingest, as in `record_delivery`: the idle-replica
        // release cannot run between resolving the id and queueing under it.
        let _gate = read(&self.store.gate);
        let Some(replica) = read(&self.store.catalog).find_replica(replica_id) else {
            return false;
        };
        let now = self.now();
        let work = if work_us_each.is_finite() {
            work_us_each.max(0.0)
        } else {
            0.0
        };
        self.routing
            .load
            .add_n(replica, work, hints.min(MAX_REMOTE_HINTS), now);
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::{CacheUpdate, IndexConfig, ManualClock, PrefixEntry};
    use std::sync::Arc;

    #[test]
    fn remote_hints_join_a_known_replicas_queue_and_unknown_ones_are_refused() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let idx = IndexConfig::new().clock(clock).build();
        idx.ingest(&CacheUpdate {
            replica_id: "r1".into(),
            model_id: "m".into(),
            tenant_id: "t".into(),
            hash_scheme: "vllm".into(),
            prefixes: vec![PrefixEntry {
                block_hashes: vec![vec![1u8; 8]],
                block_token_counts: vec![16],
                ..Default::default()
            }],
            ..Default::default()
        });
        assert!(idx.record_remote_deliveries("r1", 3, 1_000.0));
        assert_eq!(idx.delivered_hints("r1"), 3);
        assert!(!idx.record_remote_deliveries("nobody", 3, 1_000.0));
        assert_eq!(idx.delivered_hints("nobody"), 0);
        // Non-finite work counts as none; the hints still count.
        assert!(idx.record_remote_deliveries("r1", 1, f64::NAN));
        assert_eq!(idx.delivered_hints("r1"), 4);
    }
}

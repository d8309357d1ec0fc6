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
        let work = if work_us_each.is_finite() {
            work_us_each.max(0.0)
        } else {
            0.0
        };
        self.on_known_replica(replica_id, |replica| {
            let now = self.now();
            self.routing
                .load
                .add_n(replica, work, hints.min(MAX_REMOTE_HINTS), now);
        })
    }

    /// Callers (gateways) have `in_flight` requests on `replica_id`, with
    /// `prefill_tokens` of their prompt tokens still to prefill, as counted
    /// at `at_ns` (the server sums every caller's last count), and count
    /// again by `hold_until_ns`: the replica's queue restarts from that work,
    /// as from an engine load report (`load.rs`; the hints delivered before
    /// it are in the count), held undrained until then, priced at
    /// the default weights: each token's prefill, and half a request's
    /// overhead per request (some are past their prefill, as a reported
    /// running request). False when the replica is unknown (nothing
    /// applied); a count older than the replica's last report is ignored.
    pub fn record_caller_load(
        &self,
        replica_id: &str,
        in_flight: u32,
        prefill_tokens: u64,
        at_ns: i64,
        hold_until_ns: i64,
    ) -> bool {
        let w = crate::TtftWeights::default();
        let work = w.prefill_us_per_token * prefill_tokens as f64
            + 0.5 * w.request_overhead_us * f64::from(in_flight);
        self.on_known_replica(replica_id, |replica| {
            self.routing
                .load
                .restart(replica, work, at_ns, hold_until_ns);
        })
    }

    /// Runs `f` on `replica_id`'s interned id; false (nothing run) when the
    /// replica is unknown. Under the store's gate, shared with ingest as in
    /// `record_delivery`: the idle-replica release cannot run between
    /// resolving the id and queueing under it.
    fn on_known_replica(&self, replica_id: &str, f: impl FnOnce(u32)) -> bool {
        let _gate = read(&self.store.gate);
        let Some(replica) = read(&self.store.catalog).find_replica(replica_id) else {
            return false;
        };
        f(replica);
        true
    }
}

#[cfg(test)]
mod tests {
    use crate::{CacheUpdate, IndexConfig, ManualClock, PrefixEntry};
    use std::sync::Arc;

    /// `r1` of scope ("t", "m") holds one block.
    fn holds_r1(idx: &crate::Index) {
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
    }

    #[test]
    fn a_callers_count_restarts_the_queue_and_an_older_one_is_ignored() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let idx = IndexConfig::new().clock(clock.clone()).build();
        holds_r1(&idx);
        let now = 1_000_000_000;
        // 2 requests, 1,000 tokens to prefill: 50 ms + 5 ms.
        let hold = now + 500_000_000;
        assert!(idx.record_caller_load("r1", 2, 1_000, now, hold));
        let q = |t: i64| idx.routing.load.queued_us(0, t);
        assert!((q(now) - 55_000.0).abs() < 1.0, "{}", q(now));
        // Held until the caller's next count is due, then drained.
        assert!((q(hold - 1) - 55_000.0).abs() < 1.0, "{}", q(hold - 1));
        assert!((q(hold + 5_000_000) - 50_000.0).abs() < 1.0);
        assert!(q(hold + 55_000_000) < 1.0);
        // A hint delivered meanwhile queues behind the held work.
        idx.routing.load.add(0, 1_000.0, now + 1);
        assert!((q(now + 2) - 56_000.0).abs() < 1.0, "{}", q(now + 2));
        // An older count says nothing new; a newer idle one empties it.
        assert!(idx.record_caller_load("r1", 0, 0, now - 1, hold));
        assert!((q(now + 2) - 56_000.0).abs() < 1.0);
        assert!(idx.record_caller_load("r1", 0, 0, now + 3, hold));
        assert!(q(now + 3) < 1.0);
        assert!(!idx.record_caller_load("nobody", 1, 1, now, hold));
    }

    #[test]
    fn remote_hints_join_a_known_replicas_queue_and_unknown_ones_are_refused() {
        let clock = Arc::new(ManualClock::new(1_000_000_000));
        let idx = IndexConfig::new().clock(clock).build();
        holds_r1(&idx);
        assert!(idx.record_remote_deliveries("r1", 3, 1_000.0));
        assert_eq!(idx.delivered_hints("r1"), 3);
        assert!(!idx.record_remote_deliveries("nobody", 3, 1_000.0));
        assert_eq!(idx.delivered_hints("nobody"), 0);
        // Non-finite work counts as none; the hints still count.
        assert!(idx.record_remote_deliveries("r1", 1, f64::NAN));
        assert_eq!(idx.delivered_hints("r1"), 4);
    }
}

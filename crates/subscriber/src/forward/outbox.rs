//! The updates of one `--window`, compacted into what must reach the server.
//!
//! Within a window only the last operation on a key matters: a block stored
//! and evicted in the same window needs only its eviction, a block evicted and
//! stored again needs only its report, and an `ALL_CLEARED` supersedes
//! everything before it. After compaction the reports and evictions of a
//! window name disjoint keys, so they can be sent on different gRPC streams
//! without any ordering between them; the only order left is
//! clear → evictions → reports, and evictions/clears of this window after the
//! reports of earlier windows (see [`super::Forwarder`]).

use std::collections::HashMap;
use std::sync::Arc;

use crate::mapping::{PrefixEviction, PrefixReport, Update};

/// One key at the server: the fingerprint within an adapter partition.
pub(crate) type Key = (u64, Arc<str>);

#[derive(Debug)]
enum Op {
    Report(PrefixReport),
    Evict(PrefixEviction),
}

/// Buffered updates of the current window.
#[derive(Debug, Default)]
pub struct Outbox {
    cleared: bool,
    /// Last operation per key, with the order it was first seen in, so
    /// reports keep engine order inside a batch.
    ops: HashMap<Key, (u64, Op)>,
    next: u64,
}

/// A compacted window, ready to send in this order.
#[derive(Debug, Default, PartialEq)]
pub struct Flush {
    /// Send `ALL_CLEARED` first and wait for its acknowledgement.
    pub clear: bool,
    /// Then these evictions.
    pub evicts: Vec<PrefixEviction>,
    /// Then these reports.
    pub reports: Vec<PrefixReport>,
}

impl Outbox {
    /// Adds the updates of one delivery, in order.
    pub fn push_all(&mut self, updates: impl IntoIterator<Item = Update>) {
        for u in updates {
            self.push(u);
        }
    }

    /// Adds one update.
    pub fn push(&mut self, update: Update) {
        let (key, op) = match update {
            Update::AllCleared => {
                self.ops.clear();
                self.cleared = true;
                return;
            }
            Update::Report(r) => ((r.prefix_hash, r.adapter.clone()), Op::Report(r)),
            Update::Evict(e) => ((e.prefix_hash, e.adapter.clone()), Op::Evict(e)),
        };
        match self.ops.get_mut(&key) {
            Some(slot) => slot.1 = op,
            None => {
                self.ops.insert(key, (self.next, op));
                self.next += 1;
            }
        }
    }

    /// Distinct keys buffered (the size cap counts these).
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether nothing is buffered.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && !self.cleared
    }

    /// Forgets everything (a resync will send the full state instead).
    pub fn discard(&mut self) {
        *self = Self::default();
    }

    /// Takes the window, compacted.
    pub fn take(&mut self) -> Flush {
        let this = std::mem::take(self);
        let mut ops: Vec<(u64, Op)> = this.ops.into_values().collect();
        ops.sort_unstable_by_key(|(order, _)| *order);
        let mut flush = Flush {
            clear: this.cleared,
            ..Flush::default()
        };
        for (_, op) in ops {
            match op {
                Op::Report(r) => flush.reports.push(r),
                Op::Evict(e) => flush.evicts.push(e),
            }
        }
        flush
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::Tier;

    fn report(h: u64) -> Update {
        Update::Report(PrefixReport {
            prefix_hash: h,
            token_count: 16,
            tier: Tier::T1,
            adapter: Arc::from(""),
            block_size: 16,
            no_match_end: false,
        })
    }

    fn evict(h: u64) -> Update {
        Update::Evict(PrefixEviction {
            prefix_hash: h,
            token_count: 16,
            adapter: Arc::from(""),
        })
    }

    fn hashes(f: &Flush) -> (Vec<u64>, Vec<u64>) {
        (
            f.evicts.iter().map(|e| e.prefix_hash).collect(),
            f.reports.iter().map(|r| r.prefix_hash).collect(),
        )
    }

    #[test]
    fn last_operation_per_key_wins_and_reports_keep_their_order() {
        let mut o = Outbox::default();
        o.push_all([
            report(3),
            report(1),
            evict(3),
            report(2),
            evict(4),
            report(4),
        ]);
        let f = o.take();
        assert!(!f.clear);
        assert_eq!(hashes(&f), (vec![3], vec![1, 2, 4]));
        assert!(o.is_empty());
    }

    #[test]
    fn a_clear_supersedes_what_came_before_it() {
        let mut o = Outbox::default();
        o.push_all([report(1), evict(2), Update::AllCleared, report(3)]);
        let f = o.take();
        assert!(f.clear);
        assert_eq!(hashes(&f), (vec![], vec![3]));
    }

    #[test]
    fn adapters_are_separate_keys() {
        let mut o = Outbox::default();
        o.push(report(1));
        o.push(Update::Evict(PrefixEviction {
            prefix_hash: 1,
            token_count: 16,
            adapter: Arc::from("lora-a"),
        }));
        assert_eq!(o.len(), 2);
    }
}

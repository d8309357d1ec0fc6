//! A run's holder spans: which replica holds which stretch of the run, with
//! the stretch's last-seen time and tier.
//!
//! Spans are kept sorted by (replica, from); one replica's spans never
//! overlap, and adjacent spans of one replica with the same time and tier
//! are one span. A store of a stretch is one edit of the replica's spans,
//! however long the stretch.

use super::Run;
use crate::types::Tier;
use std::ops::Range;

/// `replica` holds blocks `from..to` of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Span {
    pub(super) replica: u32,
    pub(super) from: u32,
    pub(super) to: u32,
    pub(super) tier: Tier,
    pub(super) last_seen: i64,
}

impl Span {
    pub(super) fn same_state(&self, o: &Span) -> bool {
        self.last_seen == o.last_seen && self.tier == o.tier
    }
}

impl Run {
    /// The positions of `replica`'s spans in `spans`.
    fn of(&self, replica: u32) -> Range<usize> {
        let lo = self.spans.partition_point(|s| s.replica < replica);
        let hi = lo + self.spans[lo..].partition_point(|s| s.replica == replica);
        lo..hi
    }

    /// The position of `replica`'s span that covers block `off`.
    #[inline]
    pub(super) fn covering(&self, replica: u32, off: u32) -> Option<usize> {
        let i = self
            .spans
            .partition_point(|s| (s.replica, s.from) <= (replica, off));
        let i = i.checked_sub(1)?;
        let s = self.spans.get(i)?;
        (s.replica == replica && s.to > off).then_some(i)
    }

    /// From position `cur` on, the first span that is `replica`'s and ends
    /// after block `off`, or the first span of a later replica (a merge
    /// cursor: `live` stretches come in replica order).
    #[inline]
    pub(super) fn next_at(&self, mut cur: usize, replica: u32, off: u32) -> usize {
        while let Some(s) = self.spans.get(cur) {
            if s.replica > replica || (s.replica == replica && s.to > off) {
                break;
            }
            cur += 1;
        }
        cur
    }

    /// `replica` holds `from..to` with `last_seen` and `tier` (replacing
    /// what it held there).
    pub(super) fn set(&mut self, replica: u32, from: u32, to: u32, last_seen: i64, tier: Tier) {
        let new = Span {
            replica,
            from,
            to,
            tier,
            last_seen,
        };
        let r = self.of(replica);
        // The usual store: the replica's chain grows at the run's end.
        if let Some(last) = self
            .spans
            .get_mut(r.end.wrapping_sub(1))
            .filter(|_| !r.is_empty())
        {
            if last.to == from && last.same_state(&new) {
                last.to = to;
                return;
            }
            if last.to < from || (last.to == from && !last.same_state(&new)) {
                self.spans.insert(r.end, new);
                return;
            }
        }
        self.edit(r, from, to, Some(new));
    }

    /// `replica` no longer holds `from..to`; `false` when it held none of it.
    pub(super) fn clear(&mut self, replica: u32, from: u32, to: u32) -> bool {
        let r = self.of(replica);
        let held = self.spans[r.clone()]
            .iter()
            .any(|s| s.from < to && s.to > from);
        if held {
            self.edit(r, from, to, None);
        }
        held
    }

    /// Rewrites the replica's spans (`r`) with `from..to` cut out and `fill`
    /// put in its place, merging equal neighbours.
    fn edit(&mut self, r: Range<usize>, from: u32, to: u32, fill: Option<Span>) {
        let mut out: Vec<Span> = Vec::with_capacity(r.len() + 2);
        for s in &self.spans[r.clone()] {
            if s.to <= from || s.from >= to {
                out.push(*s);
                continue;
            }
            if s.from < from {
                out.push(Span { to: from, ..*s });
            }
            if s.to > to {
                out.push(Span { from: to, ..*s });
            }
        }
        out.extend(fill);
        out.sort_unstable_by_key(|s| s.from);
        let mut merged: Vec<Span> = Vec::with_capacity(out.len());
        for s in out {
            match merged.last_mut() {
                Some(l) if l.to == s.from && l.same_state(&s) => l.to = s.to,
                _ => merged.push(s),
            }
        }
        self.spans.splice(r, merged);
    }
}

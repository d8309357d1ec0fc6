//! A run's holder spans: which replica holds which stretch of the run, with
//! the stretch's last-seen time and tier.
//!
//! Spans are kept sorted by (replica, from); one replica's spans never
//! overlap, and adjacent spans of one replica with the same time and tier
//! are one span. A store of a stretch is one edit of the replica's spans,
//! however long the stretch.

use super::Run;
use super::store::BlockStored;
use super::word::{pack_word, word_replica, word_tier};
use crate::types::Tier;
use std::ops::Range;

/// A replica holds blocks `from..to` of the run: 24 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Span {
    /// Replica id and tier, packed in one word (`word.rs`).
    word: u32,
    pub(super) from: u32,
    pub(super) to: u32,
    /// The holder's token counts minus the run's (`Run::toks`).
    pub(super) delta: i32,
    pub(super) last_seen: i64,
}

impl Span {
    pub(super) fn new(
        replica: u32,
        from: u32,
        to: u32,
        tier: Tier,
        delta: i32,
        last_seen: i64,
    ) -> Self {
        Self {
            word: pack_word(replica, tier),
            from,
            to,
            delta,
            last_seen,
        }
    }

    #[inline]
    pub(super) fn replica(&self) -> u32 {
        word_replica(self.word)
    }

    #[inline]
    pub(super) fn tier(&self) -> Tier {
        word_tier(self.word)
    }

    /// Same time, tier and token offset (the replica aside).
    pub(super) fn same_state(&self, o: &Span) -> bool {
        self.last_seen == o.last_seen && self.word == o.word && self.delta == o.delta
    }
}

impl Run {
    /// The positions of `replica`'s spans in `spans`.
    fn of(&self, replica: u32) -> Range<usize> {
        let lo = self.spans.partition_point(|s| s.replica() < replica);
        let hi = lo + self.spans[lo..].partition_point(|s| s.replica() == replica);
        lo..hi
    }

    /// The position of `replica`'s span that covers block `off`.
    #[inline]
    pub(super) fn covering(&self, replica: u32, off: u32) -> Option<usize> {
        let i = self
            .spans
            .partition_point(|s| (s.replica(), s.from) <= (replica, off));
        let i = i.checked_sub(1)?;
        let s = self.spans.get(i)?;
        (s.replica() == replica && s.to > off).then_some(i)
    }

    /// How many of blocks `from..to` `replica` holds.
    pub(super) fn covered(&self, replica: u32, from: u32, to: u32) -> u32 {
        self.spans[self.of(replica)]
            .iter()
            .map(|s| s.to.min(to).saturating_sub(s.from.max(from)))
            .sum()
    }

    /// What a store of `replica` over blocks `from..from + each.len()`
    /// finds there before it edits them, into `each`: per block,
    /// [`BlockStored::Refreshed`] when the replica holds it,
    /// [`BlockStored::Added`] when only others do, else
    /// [`BlockStored::NewKey`]. One pass over the run's spans (only a
    /// `store_each` pays it).
    pub(super) fn outcomes(&self, replica: u32, from: u32, each: &mut [BlockStored]) {
        each.fill(BlockStored::NewKey);
        let to = from.saturating_add(each.len() as u32);
        for s in &self.spans {
            let (lo, hi) = (s.from.max(from), s.to.min(to));
            if lo >= hi {
                continue;
            }
            let mine = s.replica() == replica;
            for e in each
                .get_mut((lo - from) as usize..(hi - from) as usize)
                .into_iter()
                .flatten()
            {
                if mine {
                    *e = BlockStored::Refreshed;
                } else if *e == BlockStored::NewKey {
                    *e = BlockStored::Added;
                }
            }
        }
    }

    /// From position `cur` on, the first span that is `replica`'s and ends
    /// after block `off`, or the first span of a later replica (a merge
    /// cursor: `live` stretches come in replica order).
    #[inline]
    pub(super) fn next_at(&self, mut cur: usize, replica: u32, off: u32) -> usize {
        while let Some(s) = self.spans.get(cur) {
            if s.replica() > replica || (s.replica() == replica && s.to > off) {
                break;
            }
            cur += 1;
        }
        cur
    }

    /// `replica` holds `from..to` with `last_seen`, `tier` and token offset
    /// `delta` (replacing what it held there).
    pub(super) fn set(
        &mut self,
        replica: u32,
        from: u32,
        to: u32,
        last_seen: i64,
        tier: Tier,
        delta: i32,
    ) {
        let new = Span::new(replica, from, to, tier, delta, last_seen);
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
                super::grow(&mut self.spans, 1, 1);
                self.spans.insert(r.end, new);
                return;
            }
        }
        // A refresh that changes nothing (one span already covers the
        // stretch in the same state).
        if let Some(i) = self.covering(replica, from) {
            let s = &self.spans[i];
            if s.to >= to && s.same_state(&new) {
                return;
            }
        }
        self.edit(r, from, to, Some(new));
    }

    /// `replica` no longer holds `from..to`; `false` when it held none of it.
    pub(super) fn clear(&mut self, replica: u32, from: u32, to: u32) -> bool {
        // The usual removal: one span covers the stretch and shrinks, goes
        // or splits in place.
        if let Some(i) = self.covering(replica, from) {
            let s = self.spans[i];
            if s.to >= to {
                match (s.from == from, s.to == to) {
                    (true, true) => {
                        self.spans.remove(i);
                    }
                    (true, false) => self.spans[i].from = to,
                    (false, true) => self.spans[i].to = from,
                    (false, false) => {
                        self.spans[i].to = from;
                        super::grow(&mut self.spans, 1, 1);
                        self.spans.insert(i + 1, Span { from: to, ..s });
                    }
                }
                return true;
            }
        }
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
        super::grow(&mut self.spans, merged.len().saturating_sub(r.len()), 1);
        self.spans.splice(r, merged);
    }
}

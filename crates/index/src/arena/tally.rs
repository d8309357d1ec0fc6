//! LFU counts of a run's holdings (the delivered-hit counter, §2.5.5), kept
//! per run as a piecewise-constant count per replica: `(replica, from..to,
//! n)` pieces. A delivered chain hit credits a prefix of the chain, which
//! in a run is one stretch per replica, so a credit is one edit of the
//! replica's pieces (one +1 on an existing piece when the same prefix was
//! credited before) instead of one table update per (block, replica): with
//! 64 replicas deep in a 32-block chain, the per-block side table was half
//! of a server's lookup (issue 36).
//!
//! Invariant: a replica's pieces lie inside its spans. Every path that
//! removes a holding clears its count in the same write-locked step
//! (`store.rs` `take`, `take_block`, `views.rs` `retain`), and a credit
//! covers only what the replica holds when it is applied (under the run's
//! read lock), so a count never outlives its holding nor carries over to a
//! later holding of the same block, and a run's trimmed tail has no counts.

use super::Run;
use crate::hashing::FoldBuild;
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `replica` was credited `n` times (n > 0) over blocks `from..to` of a
/// run: 16 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Piece {
    pub(super) replica: u32,
    pub(super) from: u32,
    pub(super) to: u32,
    pub(super) n: u32,
}

/// The counts of one shard's runs, by local run id: only credited runs
/// have an entry. Behind a mutex in the run shard ([`TallyTable`]):
/// credits arrive under the run read lock, removals clear under its
/// write lock.
pub(super) type Tallies = HashMap<u32, Vec<Piece>, FoldBuild>;

/// The count of `replica` at block `off` in `pieces` (0: none).
#[inline]
pub(super) fn count(pieces: &[Piece], replica: u32, off: u32) -> u32 {
    let i = pieces.partition_point(|p| (p.replica, p.from) <= (replica, off));
    match i.checked_sub(1).and_then(|i| pieces.get(i)) {
        Some(p) if p.replica == replica && p.to > off => p.n,
        _ => 0,
    }
}

/// Replaces the count of `replica` over blocks `a..b` by `f(count)` (0
/// where it had none; a result of 0 leaves no piece), merging neighbours
/// that end up equal. The usual credit (the same stretch credited again)
/// is one increment in place.
pub(super) fn map_range(
    pieces: &mut Vec<Piece>,
    replica: u32,
    a: u32,
    b: u32,
    f: impl Fn(u32) -> u32,
) {
    if a >= b {
        return;
    }
    // The replica's pieces that overlap or touch a..b.
    let lo = pieces.partition_point(|p| (p.replica, p.to) < (replica, a));
    let hi = lo
        + pieces[lo..]
            .iter()
            .take_while(|p| p.replica == replica && p.from <= b)
            .count();
    if let Some(p) = pieces
        .get_mut(lo)
        .filter(|p| p.replica == replica && p.from == a && p.to == b && hi == lo + 1)
    {
        let n = f(p.n);
        if n > 0 {
            p.n = n;
            return;
        }
    }
    let mut out: Vec<Piece> = Vec::with_capacity(hi - lo + 3);
    let push = |out: &mut Vec<Piece>, from: u32, to: u32, n: u32| {
        if from >= to || n == 0 {
            return;
        }
        match out.last_mut() {
            Some(l) if l.to == from && l.n == n => l.to = to,
            _ => out.push(Piece {
                replica,
                from,
                to,
                n,
            }),
        }
    };
    let mut cursor = a;
    for p in &pieces[lo..hi] {
        push(&mut out, p.from, p.to.min(a), p.n);
        push(&mut out, cursor, p.from.min(b), f(0));
        push(&mut out, p.from.max(a), p.to.min(b), f(p.n));
        cursor = cursor.max(p.to.min(b));
        push(&mut out, p.from.max(b), p.to, p.n);
    }
    push(&mut out, cursor, b, f(0));
    pieces.splice(lo..hi, out);
}

/// +1 for `replica` over `a..b` (saturating at `u32::MAX`).
#[inline]
pub(super) fn credit(pieces: &mut Vec<Piece>, replica: u32, a: u32, b: u32) {
    map_range(pieces, replica, a, b, |n| n.saturating_add(1));
}

/// Where a credit pass over one run stands ([`Run::credit_held_from`]):
/// lower bounds on the next replica's first span and first piece.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Cursor {
    span: usize,
    piece: usize,
}

/// [`credit`] with `at` a lower bound on the position of `replica`'s
/// pieces at `a` (moved up to it): the same stretch credited again is an
/// increment in place without a search; anything else is [`credit`]'s
/// edit, which leaves the pieces before `at` as they were.
fn credit_from(pieces: &mut Vec<Piece>, at: &mut usize, replica: u32, a: u32, b: u32) {
    while pieces
        .get(*at)
        .is_some_and(|p| (p.replica, p.to) < (replica, a))
    {
        *at += 1;
    }
    let lo = *at;
    let alone = !pieces
        .get(lo + 1)
        .is_some_and(|q| q.replica == replica && q.from <= b);
    if let Some(p) = pieces.get_mut(lo) {
        if p.replica == replica && p.from == a && p.to == b && alone && p.n < u32::MAX {
            p.n += 1;
            return;
        }
    }
    credit(pieces, replica, a, b);
}

/// No count for `replica` over `a..b` any more.
#[inline]
pub(super) fn clear(pieces: &mut Vec<Piece>, replica: u32, a: u32, b: u32) {
    map_range(pieces, replica, a, b, |_| 0);
}

/// A shard's counts ([`Tallies`]) behind their lock, with how many runs
/// have counts, so that a reader of holdings skips the lock while none
/// has (an index without delivered hits never takes it).
#[derive(Default)]
pub(super) struct TallyTable {
    map: Mutex<Tallies>,
    /// Entries in `map`: changed under its lock or the run write lock.
    len: AtomicUsize,
}

impl TallyTable {
    /// `f` of run `local`'s pieces (empty when it has none); under the
    /// lock when any run has counts (`f` must take no lock).
    #[inline]
    pub(super) fn with<T>(&self, local: u32, f: impl FnOnce(&[Piece]) -> T) -> T {
        if self.len.load(Ordering::Relaxed) == 0 {
            return f(&[]);
        }
        let t = lock(&self.map);
        f(t.get(&local).map_or(&[], |v| v.as_slice()))
    }

    /// `f` of run `local`'s pieces to edit (created if missing; dropped
    /// again if `f` leaves them empty), under the lock; the caller holds
    /// the run's read lock.
    pub(super) fn edit<T>(&self, local: u32, f: impl FnOnce(&mut Vec<Piece>) -> T) -> T {
        let mut t = lock(&self.map);
        let pieces = t.entry(local).or_default();
        let out = f(pieces);
        if pieces.is_empty() {
            t.remove(&local);
        }
        self.len.store(t.len(), Ordering::Relaxed);
        out
    }

    /// The pieces of run `local` (under the run's write lock).
    pub(super) fn of_mut(&mut self, local: u32) -> &[Piece] {
        let t = self.map.get_mut().unwrap_or_else(|e| e.into_inner());
        t.get(&local).map_or(&[], |v| v.as_slice())
    }

    /// Clears `replica`'s counts over `a..b` of run `local`, dropping the
    /// run's entry when nothing is left (under the run's write lock, with
    /// the removal of the holdings).
    pub(super) fn clear(&mut self, local: u32, replica: u32, a: u32, b: u32) {
        if *self.len.get_mut() == 0 {
            return;
        }
        let t = self.map.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(pieces) = t.get_mut(&local) {
            clear(pieces, replica, a, b);
            if pieces.is_empty() {
                t.remove(&local);
            }
        }
        *self.len.get_mut() = t.len();
    }

    /// Run `local` was retired: no counts (it holds nothing, so it has
    /// none already; this keeps a reused id from ever seeing any).
    pub(super) fn forget(&mut self, local: u32) {
        let t = self.map.get_mut().unwrap_or_else(|e| e.into_inner());
        t.remove(&local);
        *self.len.get_mut() = t.len();
    }
}

impl Run {
    /// +1 for `replica` over the blocks of `a..b` it holds (a credit under
    /// the run's read lock, `pieces` the run's from [`TallyTable::edit`]),
    /// for hits taken in replica order: `cur` carries
    /// where the previous hit's spans and pieces were found, so crediting
    /// every replica of a run is one forward pass over its spans and pieces
    /// (sequential reads) instead of two binary searches per replica, and
    /// a stretch credited before is one increment where the cursor stands.
    pub(super) fn credit_held_from(
        &self,
        cur: &mut Cursor,
        pieces: &mut Vec<Piece>,
        replica: u32,
        a: u32,
        b: u32,
    ) {
        if a >= b {
            return;
        }
        let spans = &self.spans;
        while spans
            .get(cur.span)
            .is_some_and(|s| (s.replica(), s.to) <= (replica, a))
        {
            cur.span += 1;
        }
        for s in spans[cur.span..]
            .iter()
            .take_while(|s| s.replica() == replica && s.from < b)
        {
            credit_from(pieces, &mut cur.piece, replica, s.from.max(a), s.to.min(b));
        }
    }

    /// Sets `replica`'s count at block `off` to `n` (a restore) if it holds
    /// the block (as for a credit).
    pub(super) fn set_held(&self, pieces: &mut Vec<Piece>, replica: u32, off: u32, n: u32) {
        if self.covering(replica, off).is_some() {
            map_range(pieces, replica, off, off + 1, |_| n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The pieces as one count per (replica, block), as a model keeps them.
    fn flat(pieces: &[Piece]) -> HashMap<(u32, u32), u32> {
        let mut m = HashMap::new();
        for p in pieces {
            for off in p.from..p.to {
                assert!(m.insert((p.replica, off), p.n).is_none(), "overlap");
            }
        }
        m
    }

    fn well_formed(pieces: &[Piece]) {
        for w in pieces.windows(2) {
            let (x, y) = (w[0], w[1]);
            assert!((x.replica, x.from) < (y.replica, y.from), "order");
            assert!(x.replica != y.replica || x.to <= y.from, "overlap");
            assert!(
                x.replica != y.replica || x.to < y.from || x.n != y.n,
                "unmerged"
            );
        }
        assert!(pieces.iter().all(|p| p.from < p.to && p.n > 0));
    }

    proptest! {
        #[test]
        fn pieces_count_like_a_map(ops in proptest::collection::vec(
            (0u32..3, 0u32..12, 0u32..12, 0u8..4), 0..60)) {
            let mut pieces = Vec::new();
            let mut model: HashMap<(u32, u32), u32> = HashMap::new();
            for (replica, x, y, op) in ops {
                let (a, b) = (x.min(y), x.max(y));
                match op {
                    0 | 1 => {
                        credit(&mut pieces, replica, a, b);
                        for off in a..b {
                            *model.entry((replica, off)).or_default() += 1;
                        }
                    }
                    2 => {
                        clear(&mut pieces, replica, a, b);
                        for off in a..b {
                            model.remove(&(replica, off));
                        }
                    }
                    _ => {
                        map_range(&mut pieces, replica, a, b, |_| 7);
                        for off in a..b {
                            model.insert((replica, off), 7);
                        }
                    }
                }
                well_formed(&pieces);
                prop_assert_eq!(&flat(&pieces), &model);
                for r in 0..3 {
                    for off in 0..13 {
                        let want = model.get(&(r, off)).copied().unwrap_or(0);
                        prop_assert_eq!(count(&pieces, r, off), want);
                    }
                }
            }
        }
    }

    #[test]
    fn the_same_stretch_credited_again_is_one_piece() {
        let mut p = Vec::new();
        for _ in 0..5 {
            credit(&mut p, 3, 0, 32);
        }
        credit(&mut p, 1, 0, 8);
        assert_eq!(
            p,
            vec![
                Piece {
                    replica: 1,
                    from: 0,
                    to: 8,
                    n: 1
                },
                Piece {
                    replica: 3,
                    from: 0,
                    to: 32,
                    n: 5
                },
            ]
        );
    }
}

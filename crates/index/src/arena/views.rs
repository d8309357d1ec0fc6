//! Reads and bulk edits beside the walk: one block's holders (an exact
//! lookup), every holding (exports), and a sweep that keeps holdings by
//! replica, time and tier (TTL, a replica's removal).

use super::tally::{self, Piece};
use super::{ChainArena, Run, RunPos, Runs};
use crate::sync::{read_spinning as read, write_spinning as write};
use crate::types::Tier;

/// One (block, replica) holding as the facade reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holding {
    /// Interned replica id.
    pub replica: u32,
    /// The token count the holder reported for the block.
    pub tokens: i32,
    /// When the holder last reported the block.
    pub last_seen: i64,
    /// The holder's tier for the block.
    pub tier: Tier,
    /// Delivered hits credited to the holding (the LFU count, `tally.rs`).
    pub access: u32,
}

/// A holding a sweep removed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Swept {
    /// Partition id.
    pub part: u32,
    /// Block hash.
    pub hash: u64,
    /// What was held.
    pub holding: Holding,
}

impl Run {
    /// Span `s`'s holding of block `off`, its LFU count read in `counts`
    /// (the run's pieces, `tally.rs`).
    pub(super) fn holding(&self, s: &super::Span, off: u32, counts: &[Piece]) -> Holding {
        Holding {
            replica: s.replica(),
            tokens: self.toks.get(off as usize).wrapping_add(s.delta),
            last_seen: s.last_seen,
            tier: s.tier(),
            access: if counts.is_empty() {
                0
            } else {
                tally::count(counts, s.replica(), off)
            },
        }
    }

    /// The holders of block `off` in replica order (the spans' order),
    /// appended to `out`.
    pub(super) fn holders_at(&self, off: u32, counts: &[Piece], out: &mut Vec<Holding>) {
        out.extend(
            self.spans
                .iter()
                .filter(|s| s.from <= off && off < s.to)
                .map(|s| self.holding(s, off, counts)),
        );
    }
}

impl Runs {
    /// Copies the count pieces of run `local` into `out` (cleared first).
    pub(super) fn copy_counts(&self, local: u32, out: &mut Vec<Piece>) {
        out.clear();
        self.tallies.with(local, |c| out.extend_from_slice(c));
    }
}

impl ChainArena {
    /// The holders of block (`part`, `hash`) in replica order, into `out`
    /// (cleared first).
    pub fn holders(&self, part: u32, hash: u64, out: &mut Vec<Holding>) {
        out.clear();
        let Some((pos, g)) = self.locate(part, hash) else {
            return;
        };
        if let Some(run) = g.get(pos) {
            g.tallies
                .with(pos.local() as u32, |c| run.holders_at(pos.off, c, out));
        }
    }

    /// `f` of `replica`'s holding of block (`part`, `hash`), or `None` when
    /// it does not hold it. `f` runs under the read lock of the block's run
    /// shard and must take no arena lock (a writer queued on that shard
    /// would wait for `f` while `f` waits for it).
    pub fn with_holding<T>(
        &self,
        part: u32,
        hash: u64,
        replica: u32,
        f: impl FnOnce(&Holding) -> T,
    ) -> Option<T> {
        let (pos, g) = self.locate(part, hash)?;
        let run = g.get(pos)?;
        let i = run.covering(replica, pos.off)?;
        let held = g.tallies.with(pos.local() as u32, |c| {
            run.holding(&run.spans[i], pos.off, c)
        });
        Some(f(&held))
    }

    /// Every block some replica holds as `f(partition, hash, holders)`,
    /// the holders in replica order; shard by shard (each under its run
    /// read lock, which `f` runs under: it must take no arena lock) and
    /// run by run, a run's blocks in order. Blocks kept in a run that no
    /// replica holds are skipped.
    pub fn for_each_block(&self, f: impl FnMut(u32, u64, &[Holding])) {
        self.for_each_block_where(|_, _| true, f);
    }

    /// [`ChainArena::for_each_block`] over the spans `span_ok(partition,
    /// last_seen)` accepts, asked once per span as the sweep reaches it: a
    /// scan that wants only holdings older than a bound (the cap's victim
    /// gather) skips a span's blocks unread. A block none of whose
    /// accepted spans covers it is not visited.
    pub fn for_each_block_where(
        &self,
        mut span_ok: impl FnMut(u32, i64) -> bool,
        mut f: impl FnMut(u32, u64, &[Holding]),
    ) {
        // Reused across runs: a run's spans by start, the spans over the
        // current block by replica (a replica's spans never overlap, so
        // one each), and the holders handed to `f`.
        let mut order: Vec<usize> = Vec::new();
        let mut active: Vec<usize> = Vec::new();
        let mut buf: Vec<Holding> = Vec::new();
        // The run's LFU counts, copied out so that `f` runs without the
        // tally lock.
        let mut counts: Vec<Piece> = Vec::new();
        for shard in self.shards.iter() {
            let g = read(&shard.runs.0);
            for (local, run) in g.runs.iter().enumerate() {
                g.copy_counts(local as u32, &mut counts);
                let spans = &run.spans;
                order.clear();
                order.extend(0..spans.len());
                order.sort_unstable_by_key(|&i| spans[i].from);
                active.clear();
                // A sweep over the run's blocks: spans join at their start
                // and leave at their end, so a block costs its holders, not
                // the run's spans.
                let mut next = 0;
                let mut off = 0u32;
                loop {
                    active.retain(|&i| spans[i].to > off);
                    if active.is_empty() {
                        // Skip a stretch no replica holds.
                        match order.get(next) {
                            Some(&i) => off = off.max(spans[i].from),
                            None => break,
                        }
                    }
                    while let Some(&i) = order.get(next).filter(|&&i| spans[i].from <= off) {
                        if spans[i].to > off && span_ok(run.part, spans[i].last_seen) {
                            let r = spans[i].replica();
                            let at = active.partition_point(|&j| spans[j].replica() < r);
                            active.insert(at, i);
                        }
                        next += 1;
                    }
                    buf.clear();
                    buf.extend(active.iter().map(|&i| run.holding(&spans[i], off, &counts)));
                    if let (Some(&h), false) = (run.hashes().get(off as usize), buf.is_empty()) {
                        f(run.part, h, &buf);
                    }
                    off += 1;
                }
            }
        }
    }

    /// Every holding as `f(partition, hash, holding)`, shard by shard and
    /// run by run (each shard under its read lock).
    pub fn for_each(&self, mut f: impl FnMut(u32, u64, Holding)) {
        let mut counts: Vec<Piece> = Vec::new();
        for shard in self.shards.iter() {
            let g = read(&shard.runs.0);
            for (local, run) in g.runs.iter().enumerate() {
                g.copy_counts(local as u32, &mut counts);
                for s in &run.spans {
                    for off in s.from..s.to {
                        if let Some(&h) = run.hashes().get(off as usize) {
                            f(run.part, h, run.holding(s, off, &counts));
                        }
                    }
                }
            }
        }
    }

    /// Keeps the holdings for which `keep(partition, replica, last_seen,
    /// tier)` is true (decided once per span: a TTL sweep or a replica's
    /// removal decides on nothing else); each removed holding goes to
    /// `gone(swept, empty)`, `empty` true when after the sweep no replica
    /// holds that block any more. Runs left without holders are retired,
    /// unheld run tails trimmed (an emptied block elsewhere in a run keeps
    /// its place). Returns the number of holdings removed.
    ///
    /// `keep` and `gone` run under the write lock of the run's shard, so a
    /// caller can clear its side tables for a holding (or an emptied block)
    /// in step with the arena; they must take no arena lock.
    pub fn retain(
        &self,
        mut keep: impl FnMut(u32, u32, i64, Tier) -> bool,
        mut gone: impl FnMut(Swept, bool),
    ) -> usize {
        let mut removed = 0;
        // Reused across runs: the spans a run lost, and the blocks its
        // remaining spans cover (merged, sorted, disjoint), so whether a
        // removed holding emptied its block is one search per span and a
        // step per block, whatever the number of spans.
        let mut dropped: Vec<super::Span> = Vec::new();
        let mut cover: Vec<(u32, u32)> = Vec::new();
        for (si, shard) in self.shards.iter().enumerate() {
            let mut g = write(&shard.runs.0);
            let mut edited = Vec::new();
            let Runs { runs, tallies, .. } = &mut *g;
            for (local, run) in runs.iter_mut().enumerate() {
                dropped.clear();
                let part = run.part;
                run.spans.retain(|s| {
                    let k = keep(part, s.replica(), s.last_seen, s.tier());
                    if !k {
                        dropped.push(*s);
                    }
                    k
                });
                if dropped.is_empty() {
                    continue;
                }
                cover.clear();
                cover.extend(run.spans.iter().map(|s| (s.from, s.to)));
                cover.sort_unstable();
                let mut n: usize = 0;
                for k in 0..cover.len() {
                    let c = cover[k];
                    match n.checked_sub(1).and_then(|l| cover.get_mut(l)) {
                        Some(l) if l.1 >= c.0 => l.1 = l.1.max(c.1),
                        _ => {
                            cover[n] = c;
                            n += 1;
                        }
                    }
                }
                cover.truncate(n);
                let counts = tallies.of_mut(local as u32);
                for s in &dropped {
                    let mut c = cover.partition_point(|&(_, to)| to <= s.from);
                    for off in s.from..s.to {
                        while cover.get(c).is_some_and(|&(_, to)| to <= off) {
                            c += 1;
                        }
                        let held = cover.get(c).is_some_and(|&(from, _)| from <= off);
                        gone(
                            Swept {
                                part,
                                hash: run.hashes().get(off as usize).copied().unwrap_or(0),
                                holding: run.holding(s, off, counts),
                            },
                            !held,
                        );
                        removed += 1;
                    }
                }
                // The dropped holdings' counts go with them.
                for s in &dropped {
                    tallies.clear(local as u32, s.replica(), s.from, s.to);
                }
                edited.push(RunPos {
                    run: ((local as u32) << super::SHARD_BITS) | si as u32,
                    off: 0,
                });
            }
            for pos in edited {
                self.tidy(&mut g, pos.run);
            }
        }
        removed
    }
}

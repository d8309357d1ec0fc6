//! The chain walk on runs: every replica's longest leading stretch of fresh
//! blocks, with its weakest-link `last_seen` and coldest tier (the same
//! answer as the facade's block-by-block walk, `chain.rs`).

use super::{ChainArena, Run};
use crate::types::Tier;
use std::cell::RefCell;

/// A walk's buffers, reused by every walk on the thread (never shrunk).
#[derive(Default)]
struct Scratch {
    /// The stretches still going.
    live: Vec<RunMatch>,
    /// `sums[k]`: the request's counts over blocks `0..k`, summed
    /// (wrapping), filled as far as the walk got. A stretch over blocks
    /// `a..b` matched `sums[b] - sums[a]` tokens: one subtraction per
    /// stretch and segment, not one addition per block and replica (with
    /// 64 replicas deep in one run, the additions were a third of the
    /// lookup).
    sums: Vec<i32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// One replica's leading stretch of a request's chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunMatch {
    /// Interned replica id.
    pub replica: u32,
    /// Leading blocks matched.
    pub blocks: u32,
    /// The request's token counts over those blocks, summed (wrapping).
    pub matched: i32,
    /// Oldest `last_seen` over them.
    pub oldest: i64,
    /// Coldest tier over them.
    pub tier: Tier,
}

impl ChainArena {
    /// Every replica whose stretch has at least the request's first block,
    /// in replica order, into `out` (cleared first). A holder is fresh when
    /// its `last_seen >= cutoff`.
    pub fn walk(
        &self,
        part: u32,
        hashes: &[u64],
        counts: &[i32],
        cutoff: i64,
        out: &mut Vec<RunMatch>,
    ) {
        self.walk_by(part, hashes.len(), |i| hashes[i], counts, cutoff, out);
    }

    /// [`ChainArena::walk`] over `n` request blocks whose hashes `key`
    /// gives (`key(i)` for `i < n`): read only as far as the walk goes, so
    /// a caller whose hashes are bytes converts no more than that (a
    /// lookup usually stops within its first two runs, and converting a
    /// long request up front wrote a buffer line per eight blocks).
    pub fn walk_by(
        &self,
        part: u32,
        n: usize,
        key: impl Fn(usize) -> u64 + Copy,
        counts: &[i32],
        cutoff: i64,
        out: &mut Vec<RunMatch>,
    ) {
        out.clear();
        let n = n.min(counts.len());
        let counts = &counts[..n];
        crate::scratch::with(&SCRATCH, |s| {
            s.sums.clear();
            s.sums.push(0);
            self.walk_with(part, n, key, counts, cutoff, out, s)
        });
    }

    /// [`ChainArena::walk`] with the thread's buffers (`out` holds the
    /// ended stretches).
    #[allow(clippy::too_many_arguments)]
    fn walk_with(
        &self,
        part: u32,
        n: usize,
        key: impl Fn(usize) -> u64 + Copy,
        counts: &[i32],
        cutoff: i64,
        out: &mut Vec<RunMatch>,
        s: &mut Scratch,
    ) {
        let Scratch { live, sums } = s;
        live.clear();
        let mut pos = 0;
        while pos < n {
            // A block whose run changed since the probe (a concurrent
            // removal retired or trimmed it) is gone: the match ends there.
            let Some((at, g)) = self.locate(part, key(pos)) else {
                break;
            };
            let Some(run) = g.get(at) else {
                break;
            };
            let off = at.off as usize;
            if pos + 1 < n {
                // Most lookups end one block later, at a block this run
                // does not hold: that block's table line is asked for now
                // (if its shard is free), so that its miss overlaps the
                // run's own instead of following it.
                self.touch(part, key(pos + 1));
            }
            // The request and the run agree on `m` blocks from here.
            let m = run.agreeing(off, pos, n, key);
            let seg = &counts[pos..pos + m.min(n - pos)];
            let mut total = sums.last().copied().unwrap_or(0);
            sums.extend(seg.iter().map(|&c| {
                total = total.wrapping_add(c);
                total
            }));
            // The segment's sums, from its start: `seg.len() + 1` of them.
            let seg = &sums[pos..];
            if pos == 0 {
                start(run, at.off, cutoff, seg, live);
                // Stretches that did not cover the first segment ended in it.
                let mut kept = 0;
                for k in 0..live.len() {
                    let r = live[k];
                    if r.blocks as usize + 1 == seg.len() {
                        live[kept] = r;
                        kept += 1;
                    } else {
                        out.push(r);
                    }
                }
                live.truncate(kept);
            } else {
                // Few live stretches in a run with many spans: a binary
                // search each; otherwise one merge over the sorted spans.
                let search = live.len() * 8 < run.spans.len();
                let mut cur = 0;
                let mut kept = 0;
                for k in 0..live.len() {
                    let mut r = live[k];
                    let span = if search {
                        run.covering(r.replica, at.off)
                    } else {
                        cur = run.next_at(cur, r.replica, at.off);
                        run.spans
                            .get(cur)
                            .filter(|s| s.replica() == r.replica && s.from <= at.off)
                            .map(|_| cur)
                    };
                    let full = match span {
                        Some(i) => extend(run, i, at.off, cutoff, seg, &mut r),
                        None => false,
                    };
                    if full {
                        live[kept] = r;
                        kept += 1;
                    } else {
                        out.push(r);
                    }
                }
                live.truncate(kept);
            }
            drop(g);
            if live.is_empty() {
                break;
            }
            pos += seg.len() - 1;
        }
        if out.is_empty() {
            // Every stretch went on to the end: `live` kept the spans'
            // replica order.
            std::mem::swap(out, live);
        } else {
            out.append(live);
            out.sort_unstable_by_key(|r| r.replica);
        }
    }
}

/// The stretches that start at the request's first block: every replica
/// with a fresh span over `off`, extended over the first segment (`sums`:
/// its prefix sums, see [`Scratch::sums`]).
fn start(run: &Run, off: u32, cutoff: i64, sums: &[i32], live: &mut Vec<RunMatch>) {
    for (i, s) in run.spans.iter().enumerate() {
        if s.from <= off && off < s.to && s.last_seen >= cutoff {
            let mut r = RunMatch {
                replica: s.replica(),
                blocks: 0,
                matched: 0,
                oldest: s.last_seen,
                tier: s.tier(),
            };
            extend(run, i, off, cutoff, sums, &mut r);
            live.push(r);
        }
    }
}

/// Extends `r` over the segment starting at block `off` of `run` whose
/// prefix sums are `sums` (one more than its blocks), from its span `i`
/// (which covers `off`) through the replica's adjacent spans. `true` when
/// the whole segment is covered.
#[inline]
fn extend(run: &Run, mut i: usize, off: u32, cutoff: i64, sums: &[i32], r: &mut RunMatch) -> bool {
    let end = off + sums.len() as u32 - 1;
    let mut at = off;
    while let Some(s) = run.spans.get(i) {
        if s.replica() != r.replica || s.from > at || s.to <= at || s.last_seen < cutoff {
            break;
        }
        let upto = s.to.min(end);
        let (a, b) = ((at - off) as usize, (upto - off) as usize);
        r.matched = r.matched.wrapping_add(sums[b].wrapping_sub(sums[a]));
        r.blocks += upto - at;
        r.oldest = r.oldest.min(s.last_seen);
        r.tier = Tier::worst(r.tier, s.tier());
        at = upto;
        if at == end {
            return true;
        }
        i += 1;
    }
    false
}

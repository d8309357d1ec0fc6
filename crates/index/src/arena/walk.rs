//! The chain walk on runs: every replica's longest leading stretch of fresh
//! blocks, with its weakest-link `last_seen` and coldest tier (the same
//! answer as the slot table's walk, `chain.rs`).

use super::{ChainArena, Run};
use crate::types::Tier;
use std::cell::RefCell;

thread_local! {
    /// The live stretches of the thread's walks (reused, never shrunk).
    static LIVE: RefCell<Vec<RunMatch>> = const { RefCell::new(Vec::new()) };
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
        out.clear();
        let n = hashes.len().min(counts.len());
        let (hashes, counts) = (&hashes[..n], &counts[..n]);
        crate::scratch::with(&LIVE, |live| {
            self.walk_with(part, hashes, counts, cutoff, out, live)
        });
    }

    /// [`ChainArena::walk`] with `live` as the buffer of stretches still
    /// going (`out` holds the ended ones).
    fn walk_with(
        &self,
        part: u32,
        hashes: &[u64],
        counts: &[i32],
        cutoff: i64,
        out: &mut Vec<RunMatch>,
        live: &mut Vec<RunMatch>,
    ) {
        let n = hashes.len();
        live.clear();
        let mut pos = 0;
        while pos < n {
            // A block whose run changed since the probe (a concurrent
            // removal retired or trimmed it) is gone: the match ends there.
            let Some((at, g)) = self.locate(part, hashes[pos]) else {
                break;
            };
            let Some(run) = g.get(at) else {
                break;
            };
            let off = at.off as usize;
            // The request and the run agree on `m` blocks from here.
            let stored = run.hashes.get(off..).unwrap_or(&[]);
            let m = stored
                .iter()
                .zip(&hashes[pos..])
                .take_while(|(a, b)| a == b)
                .count()
                .max(1);
            let seg = &counts[pos..pos + m.min(n - pos)];
            if pos == 0 {
                start(run, at.off, cutoff, seg, live);
                // Stretches that did not cover the first segment ended in it.
                let mut kept = 0;
                for k in 0..live.len() {
                    let r = live[k];
                    if r.blocks as usize == seg.len() {
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
            pos += seg.len();
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
/// with a fresh span over `off`, extended over the first segment.
fn start(run: &Run, off: u32, cutoff: i64, seg: &[i32], live: &mut Vec<RunMatch>) {
    for (i, s) in run.spans.iter().enumerate() {
        if s.from <= off && off < s.to && s.last_seen >= cutoff {
            let mut r = RunMatch {
                replica: s.replica(),
                blocks: 0,
                matched: 0,
                oldest: s.last_seen,
                tier: s.tier(),
            };
            extend(run, i, off, cutoff, seg, &mut r);
            live.push(r);
        }
    }
}

/// Extends `r` over the segment `seg` starting at block `off` of `run`,
/// from its span `i` (which covers `off`) through the replica's adjacent
/// spans. `true` when the whole segment is covered.
#[inline]
fn extend(run: &Run, mut i: usize, off: u32, cutoff: i64, seg: &[i32], r: &mut RunMatch) -> bool {
    let end = off + seg.len() as u32;
    let mut at = off;
    while let Some(s) = run.spans.get(i) {
        if s.replica() != r.replica || s.from > at || s.to <= at || s.last_seen < cutoff {
            break;
        }
        let upto = s.to.min(end);
        for &c in &seg[(at - off) as usize..(upto - off) as usize] {
            r.matched = r.matched.wrapping_add(c);
        }
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

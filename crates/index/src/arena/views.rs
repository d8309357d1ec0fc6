//! Reads and bulk edits beside the walk: one block's holders (an exact
//! lookup), every holding (exports), and a sweep that keeps holdings by
//! replica, time and tier (TTL, a replica's removal).

use super::{ChainArena, Run, RunPos};
use crate::shard::{read_spinning as read, write_spinning as write};
use crate::types::Tier;

/// One (block, replica) holding as the slot table reports it.
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
    pub(super) fn holding(&self, s: &super::Span, off: u32) -> Holding {
        Holding {
            replica: s.replica(),
            tokens: self.toks.get(off as usize).wrapping_add(s.delta),
            last_seen: s.last_seen,
            tier: s.tier(),
        }
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
        let Some(run) = g.get(pos) else {
            return;
        };
        out.extend(
            run.spans
                .iter()
                .filter(|s| s.from <= pos.off && pos.off < s.to)
                .map(|s| run.holding(s, pos.off)),
        );
    }

    /// Every holding as `f(partition, hash, holding)`, shard by shard and
    /// run by run (each shard under its read lock).
    pub fn for_each(&self, mut f: impl FnMut(u32, u64, Holding)) {
        for shard in self.shards.iter() {
            let g = read(&shard.runs.0);
            for run in &g.runs {
                for s in &run.spans {
                    for off in s.from..s.to {
                        if let Some(&h) = run.hashes.get(off as usize) {
                            f(run.part, h, run.holding(s, off));
                        }
                    }
                }
            }
        }
    }

    /// Keeps the holdings for which `keep(partition, replica, last_seen,
    /// tier)` is true (decided once per span: a TTL sweep or a replica's
    /// removal decides on nothing else); each removed holding goes to
    /// `gone`. Runs left without holders are retired, unheld run tails
    /// trimmed. Returns the number of holdings removed.
    pub fn retain(
        &self,
        mut keep: impl FnMut(u32, u32, i64, Tier) -> bool,
        mut gone: impl FnMut(Swept),
    ) -> usize {
        let mut removed = 0;
        for (si, shard) in self.shards.iter().enumerate() {
            let mut g = write(&shard.runs.0);
            let mut edited = Vec::new();
            for (local, run) in g.runs.iter_mut().enumerate() {
                let before = run.spans.len();
                let mut spans = std::mem::take(&mut run.spans);
                spans.retain(|s| {
                    if keep(run.part, s.replica(), s.last_seen, s.tier()) {
                        return true;
                    }
                    for off in s.from..s.to {
                        gone(Swept {
                            part: run.part,
                            hash: run.hashes.get(off as usize).copied().unwrap_or(0),
                            holding: run.holding(s, off),
                        });
                        removed += 1;
                    }
                    false
                });
                run.spans = spans;
                if run.spans.len() != before {
                    edited.push(RunPos {
                        run: ((local as u32) << super::SHARD_BITS) | si as u32,
                        off: 0,
                    });
                }
            }
            for pos in edited {
                self.tidy(&mut g, pos.run);
            }
        }
        removed
    }
}

//! A chain-run arena: the storage issue 14 plans for chain keys, built and
//! tested on its own before the index moves onto it (crate README, "Next:
//! a chain-run arena"). Nothing in [`crate::Index`] uses it yet; it is
//! public (hidden) so that `benches/arena.rs` can measure it against the
//! slot table on the same shapes.
//!
//! ```text
//!  blocks (hash table, one entry per distinct (partition, block hash))
//!    (part, hash) ──► RunPos { run, off }
//!                        │ probed only where a run ends
//!                        ▼
//!  runs: Vec<Run>        hashes [h0 h1 h2 h3 ...]    one u64 per block, contiguous
//!                        spans  [(replica, from..to, last_seen, tier) ...]
//!                                 sorted by (replica, from); a replica's
//!                                 spans never overlap and two adjacent
//!                                 spans with the same time and tier merge
//! ```
//!
//! A store of a chain by one replica walks its blocks: a block already
//! known keeps its place; a new one is appended to its parent's run when
//! the parent ends that run (a chain growing turn by turn stays one run),
//! otherwise it starts a run. The replica's holding is then one span edit
//! per run the chain touched, not one per block. A chain lookup probes the
//! first request block, compares the following request hashes against the
//! run's hash array in one loop, and extends every live replica by the
//! span that covers the run segment: one probe and one span search per run
//! instead of a bucket, a slot and a holder merge per block.
//!
//! A block no replica holds any more keeps its place in its run (a later
//! store finds it there); a run no replica holds at all is retired and its
//! blocks leave the table.

mod spans;
mod walk;

use crate::key::key_hash;
use crate::types::Tier;
use hashbrown::HashTable;
use spans::Span;
pub use walk::RunMatch;

/// Where a block lives: its run and its offset in the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RunPos {
    run: u32,
    off: u32,
}

/// One distinct block: only its place. Its hash and partition are read
/// from the run (a probe that hits reads the run's hash array next anyway,
/// and the table's tag rejects almost every other candidate unread), so an
/// entry is 8 bytes, not 24.
type Entry = RunPos;

/// A stored stretch of one chain.
#[derive(Default)]
struct Run {
    part: u32,
    hashes: Vec<u64>,
    spans: Vec<Span>,
}

/// The arena: a block table over runs of chain blocks (see the module docs).
#[derive(Default)]
pub struct ChainArena {
    blocks: HashTable<Entry>,
    runs: Vec<Run>,
    /// Retired run ids, reused before the run array grows.
    free: Vec<u32>,
}

#[inline]
fn hash_of(part: u32, hash: u64) -> u64 {
    key_hash(part, &hash.to_le_bytes())
}

/// Whether the block at `e` is (`part`, `hash`).
#[inline]
fn is_block(runs: &[Run], e: RunPos, part: u32, hash: u64) -> bool {
    runs.get(e.run as usize)
        .is_some_and(|r| r.part == part && r.hashes.get(e.off as usize) == Some(&hash))
}

/// The table hash of the block at `e` (the table's growth rehashes).
fn rehash(runs: &[Run], e: RunPos) -> u64 {
    runs.get(e.run as usize)
        .and_then(|r| Some(hash_of(r.part, *r.hashes.get(e.off as usize)?)))
        .unwrap_or(0)
}

impl ChainArena {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    fn find(&self, part: u32, hash: u64) -> Option<RunPos> {
        let runs = &self.runs;
        self.blocks
            .find(hash_of(part, hash), |e| is_block(runs, *e, part, hash))
            .copied()
    }

    /// `replica` holds the chain `hashes` (in chain order, a suffix of the
    /// chain or all of it) from `last_seen` at `tier`: new blocks are placed,
    /// known ones refreshed.
    pub fn store(&mut self, part: u32, replica: u32, hashes: &[u64], last_seen: i64, tier: Tier) {
        let mut prev: Option<RunPos> = None;
        // The run stretch this store holds so far, edited once per stretch.
        let mut pending: Option<(u32, u32, u32)> = None;
        for &h in hashes {
            let pos = match self.find(part, h) {
                Some(pos) => pos,
                None => {
                    let pos = match prev {
                        Some(p) if self.ends_run(p) => self.append(p.run, h),
                        _ => self.new_run(part, h),
                    };
                    let runs = &self.runs;
                    self.blocks
                        .insert_unique(hash_of(part, h), pos, |e| rehash(runs, *e));
                    pos
                }
            };
            pending = match pending {
                Some((r, a, b)) if r == pos.run && b == pos.off => Some((r, a, b + 1)),
                other => {
                    if let Some((r, a, b)) = other {
                        self.hold(r, replica, a, b, last_seen, tier);
                    }
                    Some((pos.run, pos.off, pos.off + 1))
                }
            };
            prev = Some(pos);
        }
        if let Some((r, a, b)) = pending {
            self.hold(r, replica, a, b, last_seen, tier);
        }
    }

    fn hold(&mut self, run: u32, replica: u32, from: u32, to: u32, last_seen: i64, tier: Tier) {
        if let Some(r) = self.runs.get_mut(run as usize) {
            r.set(replica, from, to, last_seen, tier);
        }
    }

    /// Whether `p` is the last block of its run.
    fn ends_run(&self, p: RunPos) -> bool {
        self.runs
            .get(p.run as usize)
            .is_some_and(|r| r.hashes.len() == p.off as usize + 1)
    }

    fn append(&mut self, run: u32, h: u64) -> RunPos {
        let r = &mut self.runs[run as usize];
        r.hashes.push(h);
        RunPos {
            run,
            off: (r.hashes.len() - 1) as u32,
        }
    }

    fn new_run(&mut self, part: u32, h: u64) -> RunPos {
        let run = Run {
            part,
            hashes: vec![h],
            spans: Vec::new(),
        };
        let id = match self.free.pop() {
            Some(id) => {
                self.runs[id as usize] = run;
                id
            }
            None => {
                self.runs.push(run);
                (self.runs.len() - 1) as u32
            }
        };
        RunPos { run: id, off: 0 }
    }

    /// `replica` no longer holds block `hash`; `false` when it did not.
    pub fn remove(&mut self, part: u32, hash: u64, replica: u32) -> bool {
        let Some(pos) = self.find(part, hash) else {
            return false;
        };
        let Some(run) = self.runs.get_mut(pos.run as usize) else {
            return false;
        };
        if !run.clear(replica, pos.off, pos.off + 1) {
            return false;
        }
        if run.spans.is_empty() {
            self.retire(pos.run);
        }
        true
    }

    /// A run nobody holds: its blocks leave the table, its id is reused.
    fn retire(&mut self, id: u32) {
        let run = std::mem::take(&mut self.runs[id as usize]);
        for (off, &h) in run.hashes.iter().enumerate() {
            let me = RunPos {
                run: id,
                off: off as u32,
            };
            if let Ok(e) = self.blocks.find_entry(hash_of(run.part, h), |e| *e == me) {
                e.remove();
            }
        }
        self.free.push(id);
    }

    /// Distinct blocks in the table (held or kept for their run).
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Live runs.
    pub fn runs(&self) -> usize {
        self.runs.len() - self.free.len()
    }

    /// (block, replica) holdings.
    pub fn holdings(&self) -> usize {
        self.runs
            .iter()
            .flat_map(|r| &r.spans)
            .map(|s| (s.to - s.from) as usize)
            .sum()
    }
}

#[cfg(test)]
mod tests;

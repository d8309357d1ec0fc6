//! The chain-run arena: where the index keeps 8-byte keys (chain blocks),
//! behind the entry facade (`entries/`, crate README "Storage"). With the
//! crate feature `bench` it is also public (hidden) so that
//! `benches/arena.rs` and `bench/peers` can measure it on its own.
//!
//! ```text
//!  256 shards, each two locks on 128-byte lines of their own:
//!
//!  blocks  RwLock (level 2)    per partition, the first inline on the lock's line:
//!    (part, hash) ──► 12-byte bucket { 32 key hash bits, run id, offset }
//!                        │ probed only where a run ends; confirmed in the run
//!                        ▼
//!  runs    RwLock (level 1)    the runs whose first block hashed to this shard,
//!                              a 64-byte header each, one line:
//!    run: hashes [h0 h1 h2 h3 ...]     one u64 per block, contiguous
//!         toks   first + step * off    (a list once blocks differ)
//!         spans  [(replica·tier, from..to, token offset, last_seen) ...]
//!                 sorted by (replica, from); a replica's spans never overlap;
//!                 adjacent spans of one replica in the same state are one
//! ```
//!
//! A probe is two dependent misses (the lock's line, which holds the
//! table's address, then the bucket) and a run two more (its header, then
//! its hashes; the spans' address is on the same header line, so their
//! load overlaps the hashes').
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
//! store finds it there) unless it ends the run: unheld run tails are
//! trimmed, and a run no replica holds at all is retired, its blocks
//! leaving the table.
//!
//! Every holding keeps what an entry needs: its token count
//! (a span holds an offset to the run's per-block counts, so a suffix
//! stored on its own and the whole chain stored later share blocks), its
//! last-seen time and its tier. LFU counts live beside the runs, per run
//! and replica as counted stretches (`tally.rs`): a delivered chain hit is
//! one edit per run and replica, not one per block. Keys of other lengths
//! live in a small map (`entries/odd.rs`).
//!
//! # Concurrency
//!
//! A lookup holds one lock at a time: the block shard's read lock for a
//! probe, then the run shard's read lock for the run's segment, so it pays
//! two lock round trips per run instead of one per shard per window, and
//! it never waits behind more than one writer's critical section. A reader
//! that finds a run changed under it (retired, or its id reused) confirms
//! the block in the run and treats a mismatch as the end of its match.
//!
//! Writers take a run shard's write lock (level 1), then, inside it, block
//! shard locks (level 2); nobody holding a level-2 lock waits for another
//! lock (a check of another run shard from there is a `try_read` that backs
//! off), and nobody holds two level-1 locks, so no two writers can wait on
//! each other in a cycle. A new block is checked for and inserted under
//! its block shard's write lock while its run's lock is held, so two
//! writers storing the same new block agree on one place.
//!
//! Callbacks the arena runs under its locks take no arena lock: the checks
//! of `take` and `take_block` and `retain`'s `keep` and `gone` run under a
//! run shard's write lock (so what they see is what is removed, and a
//! caller clears its side tables in step), `with_holding`'s and
//! `for_each_block`'s under its read lock. They may take the caller's own
//! locks if the caller never holds those while calling into the arena.

mod block_table;
mod credit;
mod prefetch;
mod spans;
mod store;
mod tally;
mod toks;
mod views;
mod walk;
mod word;

use crate::key::key_hash;
use crate::sync::read_spinning as read;
use block_table::{BlockTable, Entry};
pub use credit::Credit;
use spans::Span;
use std::sync::{RwLock, RwLockReadGuard};
pub use store::{BlockStored, Stored, Take};
pub use views::{Holding, Swept};
pub use walk::RunMatch;
pub(crate) use word::{MAX_REPLICA_IDS, pack_word, word_replica, word_tier};

/// Number of shards (the low bits of a run id). More than the former
/// slot table's 64: a store holds one run shard for a stretch of its blocks,
/// and a reader that needs a run in it waits, so the more shards, the
/// rarer that is; a lookup takes the same number of locks either way.
const SHARD_BITS: u32 = 8;
const SHARDS: usize = 1 << SHARD_BITS;

/// The shard of key hash `kh`: its top bits (the entry tag is the low 32).
#[inline]
fn shard_of(kh: u64) -> usize {
    (kh >> (64 - SHARD_BITS)) as usize
}
/// Runs one shard can hold (the rest of a 32-bit run id).
const MAX_RUNS: usize = 1 << (32 - SHARD_BITS);

/// Where a block lives: its run (global id: local id and shard) and its
/// offset in the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RunPos {
    run: u32,
    off: u32,
}

impl RunPos {
    fn shard(self) -> usize {
        (self.run as usize) & (SHARDS - 1)
    }

    fn local(self) -> usize {
        (self.run >> SHARD_BITS) as usize
    }
}

/// The table hash of an entry tag: a bijective mix, so the home bucket
/// (low bits) and the bucket tag (top bits) both see every bit.
#[inline]
fn table_hash(tag: u32) -> u64 {
    u64::from(tag).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The entry tag of key hash `kh`: its low 32 bits. Tests keep 2 bits so
/// that tags collide and every probe's confirmation is exercised.
#[inline]
fn tag_of(kh: u64) -> u32 {
    if cfg!(test) {
        (kh as u32) & 0x3
    } else {
        kh as u32
    }
}

/// A probe's candidate places: almost always none or one, kept inline;
/// any past four spill to the heap (never lost: a block missed here would
/// be placed twice).
#[derive(Default)]
struct Candidates {
    inline: arrayvec::ArrayVec<RunPos, 4>,
    spill: Vec<RunPos>,
}

impl Candidates {
    fn push(&mut self, p: RunPos) {
        if let Err(e) = self.inline.try_push(p) {
            self.spill.push(e.element());
        }
    }
}

impl IntoIterator for Candidates {
    type Item = RunPos;
    type IntoIter = std::iter::Chain<arrayvec::IntoIter<RunPos, 4>, std::vec::IntoIter<RunPos>>;
    fn into_iter(self) -> Self::IntoIter {
        self.inline.into_iter().chain(self.spill)
    }
}

/// A shard's blocks: one table per partition. The first partition's table
/// is kept inline, on the lock's own line (`repr(C)`, first fields), so a
/// probe goes from the lock straight to its bucket; an index almost always
/// has one partition, and a list of them cost a lookup or a writer one
/// more miss per probe (BENCHMARKS.md "One line less per probe").
/// Invariant: `first` is empty only when `rest` is too.
#[repr(C)]
#[derive(Default)]
struct Blocks {
    first_part: u32,
    first: BlockTable,
    rest: Vec<(u32, BlockTable)>,
}

impl Blocks {
    #[inline]
    fn table(&self, part: u32) -> Option<&BlockTable> {
        if self.first_part == part {
            return Some(&self.first);
        }
        self.rest.iter().find(|(p, _)| *p == part).map(|(_, t)| t)
    }

    fn table_mut(&mut self, part: u32) -> Option<&mut BlockTable> {
        if self.first_part == part {
            return Some(&mut self.first);
        }
        self.rest
            .iter_mut()
            .find(|(p, _)| *p == part)
            .map(|(_, t)| t)
    }

    /// The places whose tag is key hash `kh`'s (unconfirmed).
    #[inline]
    fn candidates(&self, part: u32, kh: u64) -> Candidates {
        let mut out = Candidates::default();
        if let Some(t) = self.table(part) {
            t.candidates(tag_of(kh), &mut out);
        }
        out
    }

    /// Inserts a block the caller has just seen absent and checked room
    /// for (under this lock).
    fn insert(&mut self, part: u32, kh: u64, pos: RunPos) {
        let e = Entry {
            tag: tag_of(kh),
            run: pos.run,
            off: pos.off,
        };
        if self.first.len() == 0 {
            // Empty first table: nothing in `rest` either (the invariant).
            self.first_part = part;
        }
        if let Some(t) = self.table_mut(part) {
            t.insert(e);
        } else {
            let mut t = BlockTable::default();
            t.insert(e);
            self.rest.push((part, t));
        }
    }

    /// Removes the block's entry if it still points at `pos`.
    fn remove(&mut self, part: u32, kh: u64, pos: RunPos) {
        let Some(t) = self.table_mut(part) else {
            return;
        };
        t.remove(tag_of(kh), pos);
        if t.len() > 0 {
            return;
        }
        if self.first_part == part {
            // The first table emptied (and freed its buckets): another
            // partition's moves in.
            if let Some((p, t)) = self.rest.pop() {
                self.first_part = p;
                self.first = t;
            }
        } else if let Some(i) = self.rest.iter().position(|(p, _)| *p == part) {
            self.rest.swap_remove(i);
        }
    }

    fn len(&self) -> usize {
        self.first.len() + self.rest.iter().map(|(_, t)| t.len()).sum::<usize>()
    }
}

/// A stored stretch of one chain: 64 bytes on a line of its own, so a
/// walk reads a run's header in one miss (at 88 bytes most headers
/// straddled two lines). The hashes are a boxed slice with the length
/// beside it, the token list a thin box: a `Vec` each would not fit.
#[repr(align(64))]
#[derive(Default)]
struct Run {
    /// Room for the blocks' hashes; the first `n` are the run's.
    room: Box<[u64]>,
    spans: Vec<Span>,
    /// Token count per block as the run's first writer reported it; a
    /// span's holder reported `toks.get(off) + span.delta` (stores of one
    /// chain agree up to the offset of the block they started from).
    toks: toks::Toks,
    n: u32,
    part: u32,
}

// The header is one line: a field more and it takes two.
const _: () = assert!(std::mem::size_of::<Run>() == 64);

impl Run {
    /// A run of one block.
    fn one(part: u32, h: u64, t: i32, room: usize) -> Self {
        let mut r = Run {
            room: vec![0; room.max(1)].into_boxed_slice(),
            part,
            toks: toks::Toks::one(t),
            ..Run::default()
        };
        r.room[0] = h;
        r.n = 1;
        r
    }

    /// The run's blocks' hashes, in chain order.
    #[inline]
    fn hashes(&self) -> &[u64] {
        self.room.get(..self.n as usize).unwrap_or(&[])
    }

    /// How many blocks, from the run's block `off` and the chain's block
    /// `pos` on (up to `n`), the run and the chain `key` agree on; at least
    /// 1 (the probe found the chain's block `pos` at `off`). Each agreeing
    /// block of the chain is the run's: a block has one place.
    #[inline]
    fn agreeing(&self, off: usize, pos: usize, n: usize, key: impl Fn(usize) -> u64) -> usize {
        self.hashes()
            .get(off..)
            .unwrap_or(&[])
            .iter()
            .zip(pos..n)
            .take_while(|&(&a, i)| a == key(i))
            .count()
            .max(1)
    }

    /// Appends block `h`, with room for `more` blocks at least (this one
    /// included) when the run has to grow: a store's new blocks after this
    /// one are almost always appended too ([`grow`], at least 4).
    fn push_hash(&mut self, h: u64, more: usize) {
        let n = self.n as usize;
        if n == self.room.len() {
            // Grown by `grow`'s rule, in place where the allocator can (a
            // reallocation, not a new slice and a copy).
            let mut room = std::mem::take(&mut self.room).into_vec();
            grow(&mut room, more, 4);
            room.resize(room.capacity(), 0);
            self.room = room.into_boxed_slice();
        }
        self.room[n] = h;
        self.n += 1;
    }

    /// Keeps the first `end` blocks (fewer than the run's).
    fn truncate_hashes(&mut self, end: usize) {
        self.n = self.n.min(end as u32);
    }

    /// Whether block `off` of this run is (`part`, `hash`): a reader's or
    /// writer's check that the run it reached is still the block's.
    #[inline]
    fn is(&self, off: u32, part: u32, hash: u64) -> bool {
        self.part == part && self.hashes().get(off as usize) == Some(&hash)
    }
}

/// A shard's runs; retired ids are reused before the array grows.
#[derive(Default)]
struct Runs {
    runs: Vec<Run>,
    free: Vec<u32>,
    /// The LFU counts of credited runs (`tally.rs`): locked under the read
    /// lock by a credit or a reader of counts, reached directly under the
    /// write lock by the removals that clear them.
    tallies: tally::TallyTable,
}

impl Runs {
    #[inline]
    fn get(&self, p: RunPos) -> Option<&Run> {
        self.runs.get(p.local())
    }

    #[inline]
    fn get_mut(&mut self, p: RunPos) -> Option<&mut Run> {
        self.runs.get_mut(p.local())
    }
}

#[repr(align(128))]
#[derive(Default)]
struct Padded<T>(T);

/// One shard: its blocks and its runs, each lock on lines of its own.
#[derive(Default)]
struct Shard {
    runs: Padded<RwLock<Runs>>,
    blocks: Padded<RwLock<Blocks>>,
}

/// The arena: block tables over runs of chain blocks, sharded (see the
/// module docs).
pub struct ChainArena {
    shards: Box<[Shard]>,
}

impl Default for ChainArena {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainArena {
    /// An empty arena.
    pub fn new() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
        }
    }

    #[inline]
    fn shard(&self, i: usize) -> &Shard {
        &self.shards[i % SHARDS]
    }

    /// The candidate places of key hash `kh` (one read lock, unconfirmed).
    #[inline]
    fn candidates(&self, part: u32, kh: u64) -> Candidates {
        read(&self.shard(shard_of(kh)).blocks.0).candidates(part, kh)
    }

    /// Block (`part`, `hash`)'s place with its run shard read-locked (the
    /// candidates confirmed one by one, each under its run's lock).
    #[inline]
    fn locate(&self, part: u32, hash: u64) -> Option<(RunPos, RwLockReadGuard<'_, Runs>)> {
        for pos in self.candidates(part, hash_of(part, hash)) {
            let g = read(&self.shard(pos.shard()).runs.0);
            if g.get(pos).is_some_and(|r| r.is(pos.off, part, hash)) {
                return Some((pos, g));
            }
        }
        None
    }

    /// Distinct blocks in the tables (held or kept for their run).
    pub fn blocks(&self) -> usize {
        self.shards.iter().map(|s| read(&s.blocks.0).len()).sum()
    }

    /// Live runs.
    pub fn runs(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let r = read(&s.runs.0);
                r.runs.len() - r.free.len()
            })
            .sum()
    }

    /// (block, replica) holdings.
    pub fn holdings(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                read(&s.runs.0)
                    .runs
                    .iter()
                    .flat_map(|r| &r.spans)
                    .map(|s| (s.to - s.from) as usize)
                    .sum::<usize>()
            })
            .sum()
    }

    /// Runs `f` on every shard's runs under its read lock (tests).
    #[cfg(test)]
    fn each_run(&self, mut f: impl FnMut(&Run)) {
        for s in self.shards.iter() {
            for r in &read(&s.runs.0).runs {
                f(r);
            }
        }
    }
}

/// Room for `more` elements, growing by a quarter (at least `more` and
/// `step`), not the doubling `push` picks: most runs keep one or two spans,
/// and a doubled array would be mostly slack (a run's first span alone
/// would allocate room for four). A run's hashes grow the same way, by at
/// least 4 (`Run::push_hash`: 8 measured 48.6 B per holding at 256 x
/// 16,384, 4 gave 47.6 B at the same speed).
fn grow<T>(v: &mut Vec<T>, more: usize, step: usize) {
    if v.capacity() - v.len() < more {
        v.reserve_exact(more.max(v.len() / 4).max(step));
    }
}

#[inline]
fn hash_of(part: u32, hash: u64) -> u64 {
    key_hash(part, &hash.to_le_bytes())
}

#[cfg(test)]
mod stress;
#[cfg(test)]
mod tests;

//! Writes: a chain stored by one replica, one holding removed, run tails
//! trimmed and runs nobody holds retired.

use super::prefetch::WINDOW;
use super::views::Holding;
use super::{
    Blocks, ChainArena, MAX_RUNS, Run, RunPos, Runs, SHARD_BITS, hash_of, shard_of, tag_of,
};
use crate::sync::{read_spinning as read, try_read_now, write_spinning as write};
use crate::types::Tier;
use std::sync::RwLockWriteGuard;

/// Attempts at one block before a store gives it up (counted in
/// [`Stored::lost`]): an attempt fails when the block's run changed
/// between its probe and its run's lock, or when placing it met another
/// writer's run shard busy (the store then lets go of its locks and waits
/// for that shard before the next attempt, so each attempt makes
/// progress).
const RETRIES: usize = 64;

/// What one [`ChainArena::store`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stored {
    /// Blocks no partition table had before.
    pub new_blocks: u64,
    /// Blocks the replica did not hold before.
    pub added: u64,
    /// Blocks the replica held already (time, tier and count refreshed).
    pub refreshed: u64,
    /// Blocks not stored: a shard out of run ids, or a block that kept
    /// moving under concurrent writers.
    pub lost: u64,
}

/// What [`ChainArena::store_each`] did with one block of the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockStored {
    /// The replica held the block already (time, tier and count
    /// refreshed); counted in [`Stored::refreshed`].
    Refreshed,
    /// The replica did not hold the block, another replica did; counted in
    /// [`Stored::added`].
    Added,
    /// No replica held the block (it may still have had a place in a run,
    /// kept there after its last holder went); counted in
    /// [`Stored::added`], and in [`Stored::new_blocks`] when it had no
    /// place either.
    NewKey,
    /// Not stored; counted in [`Stored::lost`].
    Lost,
}

/// What [`ChainArena::take`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// The replica did not hold the block (or the block is unknown).
    Absent,
    /// The replica holds the block and the check refused its removal:
    /// nothing changed.
    Refused(Holding),
    /// The replica held the block and no longer does.
    Removed(Holding),
}

/// The stretch of one run a store is holding, edited once when it ends.
#[derive(Clone, Copy)]
struct Stretch {
    run: u32,
    from: u32,
    to: u32,
    /// The store's token counts minus the run's over the stretch.
    delta: i32,
    /// The chain index of the stretch's first block (where its per-block
    /// outcomes go); a stretch's blocks are consecutive in the chain too.
    first: usize,
}

/// A store's state across its blocks: the run shard it holds (write
/// locked, with its index), the stretch it is holding, what it stores.
struct Writer<'a, 'o> {
    held: Option<(usize, RwLockWriteGuard<'a, Runs>)>,
    pending: Option<Stretch>,
    replica: u32,
    last_seen: i64,
    tier: Tier,
    out: Stored,
    /// Per-block outcomes, one per block of the chain, when the caller
    /// wants them (blocks never held stay [`BlockStored::Lost`]).
    each: Option<&'o mut [BlockStored]>,
    /// A run shard a placement found busy (see [`RETRIES`]).
    busy: Option<usize>,
}

impl Writer<'_, '_> {
    /// Edits the held run with the pending stretch, if any.
    fn flush(&mut self) {
        // An empty stretch (`ChainArena::follow`'s, nothing appended) edits nothing.
        if let Some(s) = self.pending.take().filter(|s| s.to > s.from) {
            self.hold(s);
        }
    }

    /// The replica holds stretch `s` of a run in the held shard.
    fn hold(&mut self, s: Stretch) {
        let Some((_, g)) = self.held.as_mut() else {
            return;
        };
        if let Some(r) = g.get_mut(RunPos { run: s.run, off: 0 }) {
            if let Some(each) = self.each.as_deref_mut() {
                let n = (s.to - s.from) as usize;
                if let Some(each) = each.get_mut(s.first..s.first + n) {
                    r.outcomes(self.replica, s.from, each);
                }
            }
            let had = r.covered(self.replica, s.from, s.to);
            self.out.refreshed += u64::from(had);
            self.out.added += u64::from(s.to - s.from - had);
            r.set(
                self.replica,
                s.from,
                s.to,
                self.last_seen,
                self.tier,
                s.delta,
            );
        }
    }

    fn held_shard(&self) -> Option<usize> {
        self.held.as_ref().map(|(i, _)| *i)
    }
}

impl ChainArena {
    /// `replica` holds the chain `hashes` (in chain order, a suffix of the
    /// chain or all of it) with the token counts `tokens` (one per block,
    /// as the facade reports them), from `last_seen` at `tier`: new
    /// blocks are placed, known ones refreshed.
    pub fn store(
        &self,
        part: u32,
        replica: u32,
        hashes: &[u64],
        tokens: &[i32],
        last_seen: i64,
        tier: Tier,
    ) -> Stored {
        self.store_with(part, replica, hashes, tokens, last_seen, tier, None, None)
    }

    /// [`ChainArena::store`] that also reports what it did with each block:
    /// `out` (cleared first) gets one [`BlockStored`] per block
    /// (`min(hashes.len(), tokens.len())`), in chain order. A block is
    /// judged against the holdings just before the store edited it, so a
    /// block the chain repeats reads [`BlockStored::Refreshed`] the second
    /// time (its first occurrence made the replica hold it).
    #[allow(clippy::too_many_arguments)]
    pub fn store_each(
        &self,
        part: u32,
        replica: u32,
        hashes: &[u64],
        tokens: &[i32],
        last_seen: i64,
        tier: Tier,
        out: &mut Vec<BlockStored>,
    ) -> Stored {
        self.store_after(part, None, replica, hashes, tokens, last_seen, tier, out)
    }

    /// [`ChainArena::store_each`] of a chain that continues block
    /// `parent`, if given: a new first block is appended to `parent`'s run
    /// when `parent` ends it, as if both had been stored together. For a
    /// caller that learns a chain block by block in chain order (a snapshot
    /// import: the export walks runs in order), so the chain comes back one
    /// run, not one run per block. Nothing of `parent` changes.
    #[allow(clippy::too_many_arguments)]
    pub fn store_after(
        &self,
        part: u32,
        parent: Option<u64>,
        replica: u32,
        hashes: &[u64],
        tokens: &[i32],
        last_seen: i64,
        tier: Tier,
        out: &mut Vec<BlockStored>,
    ) -> Stored {
        out.clear();
        out.resize(hashes.len().min(tokens.len()), BlockStored::Lost);
        let each = Some(out.as_mut_slice());
        self.store_with(part, replica, hashes, tokens, last_seen, tier, each, parent)
    }

    /// The store, with per-block outcomes into `each` (one slot per block,
    /// preset to [`BlockStored::Lost`]) when given: the plain store builds
    /// none.
    #[allow(clippy::too_many_arguments)]
    fn store_with(
        &self,
        part: u32,
        replica: u32,
        hashes: &[u64],
        tokens: &[i32],
        last_seen: i64,
        tier: Tier,
        each: Option<&mut [BlockStored]>,
        parent: Option<u64>,
    ) -> Stored {
        let mut w = Writer {
            held: None,
            pending: None,
            replica,
            last_seen,
            tier,
            out: Stored::default(),
            each,
            busy: None,
        };
        if let Some(p) = parent {
            self.follow(&mut w, part, p);
        }
        // Blocks before this one had their table lines loaded.
        let mut prefetched = 0;
        // The previous block was new: this one almost surely is too (a
        // block's hash chains its parent's), so the optimistic probe is
        // skipped; `place` checks again under the write lock anyway and
        // settles on the block's place if it exists after all.
        let mut after_new = false;
        'blocks: for (i, (&h, &t)) in hashes.iter().zip(tokens).enumerate() {
            let kh = hash_of(part, h);
            let new_before = w.out.new_blocks;
            for _ in 0..RETRIES {
                let pos = match self
                    .next_in_stretch(&w, part, h)
                    .or_else(|| {
                        if after_new {
                            None
                        } else {
                            self.probe(&mut w, part, kh, h)
                        }
                    })
                    .or_else(|| {
                        // A new block: the chain's following blocks are
                        // most likely new too (a suffix the engine just
                        // computed), so their probes' lines are loaded
                        // now, together (`prefetch.rs`). Not before: a
                        // known block is usually found in the stretch, with
                        // no probe to speed up.
                        if i + 1 >= prefetched && i + 1 < hashes.len() {
                            self.prefetch(part, &hashes[i + 1..]);
                            prefetched = i + 1 + WINDOW;
                        }
                        self.place(&mut w, part, kh, h, t, hashes.len() - i)
                    }) {
                    Some(pos) => pos,
                    None => {
                        if let Some(i) = w.busy.take() {
                            w.flush();
                            w.held = None;
                            drop(read(&self.shard(i).runs.0));
                        }
                        continue;
                    }
                };
                self.hold_shard(&mut w, pos.shard());
                let Some((_, g)) = w.held.as_ref() else {
                    continue;
                };
                let Some(run) = g.get(pos).filter(|r| r.is(pos.off, part, h)) else {
                    continue;
                };
                let delta = t.wrapping_sub(run.toks.get(pos.off as usize));
                match w.pending {
                    // The chain index check: a lost block between the
                    // stretch and this one ends the stretch, so its blocks
                    // stay consecutive in the chain (per-block outcomes).
                    Some(s)
                        if s.run == pos.run
                            && s.to == pos.off
                            && s.delta == delta
                            && s.first + (s.to - s.from) as usize == i =>
                    {
                        w.pending = Some(Stretch { to: s.to + 1, ..s });
                    }
                    _ => {
                        w.flush();
                        w.pending = Some(Stretch {
                            run: pos.run,
                            from: pos.off,
                            to: pos.off + 1,
                            delta,
                            first: i,
                        });
                    }
                }
                after_new = w.out.new_blocks > new_before;
                continue 'blocks;
            }
            w.out.lost += 1;
            after_new = false;
        }
        w.flush();
        w.out
    }

    /// Starts the store with an empty stretch just past `parent` when
    /// `parent` ends its run (that run's shard then held), so that a new
    /// first block is appended there ([`ChainArena::store_after`]).
    fn follow<'a>(&'a self, w: &mut Writer<'a, '_>, part: u32, parent: u64) {
        for c in self.candidates(part, hash_of(part, parent)) {
            self.hold_shard(w, c.shard());
            let Some((_, g)) = w.held.as_ref() else {
                return;
            };
            let ends =
                |r: &Run| r.is(c.off, part, parent) && r.hashes().len() == c.off as usize + 1;
            if g.get(c).is_some_and(ends) {
                w.pending = Some(Stretch {
                    run: c.run,
                    from: c.off + 1,
                    to: c.off + 1,
                    delta: 0,
                    first: 0,
                });
                return;
            }
        }
    }

    /// The block that follows the pending stretch in its run, if it is
    /// `h` (no probe: a block has one place, and the held run shows it).
    fn next_in_stretch(&self, w: &Writer<'_, '_>, part: u32, h: u64) -> Option<RunPos> {
        let s = w.pending?;
        let (_, g) = w.held.as_ref()?;
        let pos = RunPos {
            run: s.run,
            off: s.to,
        };
        g.get(pos)?.is(pos.off, part, h).then_some(pos)
    }

    /// Holds run shard `i` (a pending stretch is always in the held shard:
    /// it is flushed before a switch).
    fn hold_shard<'a>(&'a self, w: &mut Writer<'a, '_>, i: usize) {
        if w.held_shard() != Some(i) {
            w.flush();
            // Released before the next is taken: never two run shards.
            w.held = None;
            w.held = Some((i, write(&self.shard(i).runs.0)));
        }
    }

    /// The block's place, its run shard then held. A candidate in another
    /// shard is first checked under that shard's read lock, taken only if
    /// free (waiting for it while holding a run shard could deadlock), so a
    /// tag that merely collides does not end the pending stretch; a busy
    /// shard is checked after switching to it.
    fn probe<'a>(&'a self, w: &mut Writer<'a, '_>, part: u32, kh: u64, h: u64) -> Option<RunPos> {
        let is = |g: &Runs, c: RunPos| g.get(c).is_some_and(|r| r.is(c.off, part, h));
        for c in self.candidates(part, kh) {
            if w.held_shard() != Some(c.shard()) {
                // The read guard goes before the switch takes the shard's
                // write lock.
                let there = try_read_now(&self.shard(c.shard()).runs.0).map(|g| is(&g, c));
                if there == Some(false) {
                    continue;
                }
                self.hold_shard(w, c.shard());
            }
            let (_, g) = w.held.as_ref()?;
            if is(g, c) {
                return Some(c);
            }
        }
        None
    }

    /// Places a block the store found absent: appended to the pending
    /// stretch's run when the stretch ends it, else as a new run in the
    /// block's own shard. Checked again and inserted under the block
    /// shard's write lock, inside the run shard's, so two writers of one
    /// new block agree. `None` when no place could be made this attempt.
    /// `rest` counts this block and the store's blocks after it: the run's
    /// hashes get room for all of them at once, since a new block's
    /// successors in one store are almost always new too (one allocation
    /// per store, not one per few blocks).
    #[allow(clippy::too_many_arguments)]
    fn place<'a>(
        &'a self,
        w: &mut Writer<'a, '_>,
        part: u32,
        kh: u64,
        h: u64,
        t: i32,
        rest: usize,
    ) -> Option<RunPos> {
        let bs = shard_of(kh);
        // Appending: the pending stretch ends its run (its shard is held).
        if let (Some(s), Some((gi, g))) = (w.pending, w.held.as_mut()) {
            let tail = RunPos {
                run: s.run,
                off: s.to,
            };
            if g.get(tail)
                .is_some_and(|r| r.hashes().len() == s.to as usize && r.part == part)
            {
                let mut blocks = write(&self.shard(bs).blocks.0);
                if let Err(settled) = self.absent(&blocks, g, *gi, part, kh, h, &mut w.busy) {
                    return settled;
                }
                let run = g.get_mut(tail)?;
                run.toks.push(t.wrapping_sub(s.delta), run.hashes().len());
                run.push_hash(h, rest);
                blocks.insert(part, kh, tail);
                w.out.new_blocks += 1;
                return Some(tail);
            }
        }
        // A new run, homed in the block's shard.
        self.hold_shard(w, bs);
        let (_, g) = w.held.as_mut()?;
        let mut blocks = write(&self.shard(bs).blocks.0);
        if let Err(settled) = self.absent(&blocks, g, bs, part, kh, h, &mut w.busy) {
            return settled;
        }
        let local = match g.free.pop() {
            Some(l) => l as usize,
            None if g.runs.len() < MAX_RUNS => {
                g.runs.push(Run::default());
                g.runs.len() - 1
            }
            None => return None,
        };
        let pos = RunPos {
            run: ((local as u32) << SHARD_BITS) | bs as u32,
            off: 0,
        };
        *g.get_mut(pos)? = Run::one(part, h, t, rest);
        blocks.insert(part, kh, pos);
        w.out.new_blocks += 1;
        Some(pos)
    }

    /// Under the block shard's write lock (`blocks`) and run shard `mine`'s
    /// (`g`): `Ok` when the block is still absent and the table has room,
    /// so the caller places it; else `Err` with what [`ChainArena::place`]
    /// answers: the place another writer gave it meanwhile, or `None` (no
    /// room, or a candidate's run shard busy, noted in `busy`: waiting for
    /// it here, holding a block shard, could deadlock, so the store lets go
    /// and tries again).
    #[allow(clippy::too_many_arguments)]
    fn absent(
        &self,
        blocks: &Blocks,
        g: &Runs,
        mine: usize,
        part: u32,
        kh: u64,
        h: u64,
        busy: &mut Option<usize>,
    ) -> Result<(), Option<RunPos>> {
        let Some(t) = blocks.table(part) else {
            return Ok(());
        };
        // Each candidate is confirmed in place, under this lock: no list
        // of candidates is built (a new block usually has none).
        let settled = t.find_map(tag_of(kh), |c| {
            let is = |r: &Runs| r.get(c).is_some_and(|r| r.is(c.off, part, h));
            let here = if c.shard() == mine {
                is(g)
            } else {
                match try_read_now(&self.shard(c.shard()).runs.0) {
                    Some(other) => is(&other),
                    None => {
                        *busy = Some(c.shard());
                        return Some(None);
                    }
                }
            };
            here.then_some(Some(c))
        });
        match settled {
            Some(place) => Err(place),
            None if t.has_room() => Ok(()),
            None => Err(None),
        }
    }

    /// `replica` no longer holds block `hash`: what it held, or `None` when
    /// it did not hold it.
    pub fn remove(&self, part: u32, hash: u64, replica: u32) -> Option<Holding> {
        match self.take_with(part, hash, replica, |_| true, None) {
            Take::Removed(h) => Some(h),
            Take::Absent | Take::Refused(_) => None,
        }
    }

    /// `replica` no longer holds block `hash` if `check` of its holding
    /// says so: [`Take::Removed`] with `rest` (cleared first) the block's
    /// remaining holders in replica order, [`Take::Refused`] (nothing
    /// changed, `rest` empty) when `check` is false, [`Take::Absent`]
    /// (`rest` empty) when the replica did not hold the block.
    ///
    /// `check` runs under the write lock of the block's run shard, so the
    /// holding it sees is the one removed; it must take no arena lock (it
    /// may take the caller's own, which the caller then never holds while
    /// calling into the arena).
    pub fn take(
        &self,
        part: u32,
        hash: u64,
        replica: u32,
        check: impl FnOnce(&Holding) -> bool,
        rest: &mut Vec<Holding>,
    ) -> Take {
        rest.clear();
        self.take_with(part, hash, replica, check, Some(rest))
    }

    /// [`ChainArena::take`], the rest reported only when wanted.
    fn take_with(
        &self,
        part: u32,
        hash: u64,
        replica: u32,
        check: impl FnOnce(&Holding) -> bool,
        rest: Option<&mut Vec<Holding>>,
    ) -> Take {
        for pos in self.candidates(part, hash_of(part, hash)) {
            let mut g = write(&self.shard(pos.shard()).runs.0);
            let Runs { runs, tallies, .. } = &mut *g;
            let Some(run) = runs
                .get_mut(pos.local())
                .filter(|r| r.is(pos.off, part, hash))
            else {
                continue;
            };
            let Some(i) = run.covering(replica, pos.off) else {
                return Take::Absent;
            };
            let local = pos.local() as u32;
            let held = run.holding(&run.spans[i], pos.off, tallies.of_mut(local));
            if !check(&held) {
                return Take::Refused(held);
            }
            run.clear(replica, pos.off, pos.off + 1);
            tallies.clear(local, replica, pos.off, pos.off + 1);
            if let Some(rest) = rest {
                run.holders_at(pos.off, tallies.of_mut(local), rest);
            }
            if pos.off as usize + 1 == run.hashes().len() || run.spans.is_empty() {
                self.tidy(&mut g, pos.run);
            }
            return Take::Removed(held);
        }
        Take::Absent
    }

    /// Every replica no longer holds block `hash` if `check` of its
    /// holders (in replica order, at least one) says so: `true`, with
    /// `out` (cleared first) what was removed. `false`, nothing changed
    /// and `out` empty, when no replica holds the block or `check` is
    /// false. Only that block's holdings go (spans over it are split); the
    /// block keeps its place in its run unless it ended the run.
    ///
    /// `check` runs under the write lock of the block's run shard and must
    /// take no arena lock (see [`ChainArena::take`]).
    pub fn take_block(
        &self,
        part: u32,
        hash: u64,
        check: impl FnOnce(&[Holding]) -> bool,
        out: &mut Vec<Holding>,
    ) -> bool {
        out.clear();
        for pos in self.candidates(part, hash_of(part, hash)) {
            let mut g = write(&self.shard(pos.shard()).runs.0);
            let Runs { runs, tallies, .. } = &mut *g;
            let Some(run) = runs
                .get_mut(pos.local())
                .filter(|r| r.is(pos.off, part, hash))
            else {
                continue;
            };
            let local = pos.local() as u32;
            run.holders_at(pos.off, tallies.of_mut(local), out);
            if out.is_empty() || !check(out.as_slice()) {
                out.clear();
                return false;
            }
            for h in out.iter() {
                run.clear(h.replica, pos.off, pos.off + 1);
                tallies.clear(local, h.replica, pos.off, pos.off + 1);
            }
            if pos.off as usize + 1 == run.hashes().len() || run.spans.is_empty() {
                self.tidy(&mut g, pos.run);
            }
            return true;
        }
        false
    }

    /// After holdings of run `id` (in the held shard `g`) went: retire it
    /// if nobody holds it, else drop the blocks past its last held one.
    /// Their table entries go under their block shards' write locks
    /// (level 2 inside level 1).
    pub(super) fn tidy(&self, g: &mut Runs, id: u32) {
        let pos = RunPos { run: id, off: 0 };
        let Some(run) = g.get_mut(pos) else {
            return;
        };
        let end = run.spans.iter().map(|s| s.to).max().unwrap_or(0) as usize;
        if end >= run.hashes().len() {
            return;
        }
        let part = run.part;
        for (k, &h) in run.hashes().get(end..).unwrap_or(&[]).iter().enumerate() {
            let kh = hash_of(part, h);
            let me = RunPos {
                run: id,
                off: (end + k) as u32,
            };
            write(&self.shard(shard_of(kh)).blocks.0).remove(part, kh, me);
        }
        run.truncate_hashes(end);
        run.toks.truncate(end);
        if end == 0 {
            *run = Run::default();
            // No holding, so no count (`tally.rs`): the entry is gone
            // already unless a credit left it empty.
            g.tallies.forget(pos.local() as u32);
            g.free.push(pos.local() as u32);
        }
    }
}

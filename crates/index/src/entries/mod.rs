//! Where the index keeps its (key, holders) entries: one facade over the
//! chain-run arena and a small map for keys of other lengths.
//!
//! ```text
//!   8-byte keys (chain blocks, 8-byte legacy keys) ──► ChainArena  runs + spans (arena/)
//!   every other length (rare on the wire)          ──► OddKeys     a sharded map (odd.rs)
//!   LFU counts: arena ── per run, counted stretches (arena/tally.rs); odd keys ── beside their holders
//! ```
//!
//! A key has one length, so it lives in exactly one store; every reader
//! and writer asks the facade, which asks the store the key's length names.
//! Both stores hand out holders as copies ([`Holder`], 16 bytes) with what
//! reading their LFU counts needs ([`Held`]).

pub(crate) mod holder;
pub(crate) mod odd;

use crate::endpoints::Endpoints;

use crate::arena::{ChainArena, Credit, Holding, Take};
use crate::key::KeyRef;
use holder::Holder;
use odd::OddKeys;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU32, Ordering};

/// The entry stores.
pub(crate) struct Entries {
    /// Keys that are not 8 bytes long.
    pub(crate) odd: OddKeys,
    arena: ChainArena,
    /// Arena holdings that are not a valid match end (hybrid models).
    pub(crate) endpoints: Endpoints,
}

/// The holders of one key with what reading their LFU counts needs: the
/// counts beside an odd key's holders, or the arena's as read with them.
pub(crate) struct Held<'a> {
    counts: Counts<'a>,
    holders: &'a [Holder],
}

enum Counts<'a> {
    Odd(&'a [AtomicU32]),
    /// One count per holder, same order.
    Arena(&'a [u32]),
}

impl<'a> Held<'a> {
    /// An arena block's holders with their counts (same order).
    pub(crate) fn arena(holders: &'a [Holder], counts: &'a [u32]) -> Self {
        Self {
            counts: Counts::Arena(counts),
            holders,
        }
    }

    /// An odd key's holders with their counts (same order).
    pub(crate) fn odd(holders: &'a [Holder], counts: &'a [AtomicU32]) -> Self {
        Self {
            counts: Counts::Odd(counts),
            holders,
        }
    }

    /// The LFU count of `h`, one of these holders.
    pub(crate) fn access(&self, h: &Holder) -> u64 {
        let i = holder::position(self.holders, h.replica()).ok();
        match self.counts {
            Counts::Odd(counts) => i
                .and_then(|i| counts.get(i))
                .map_or(0, |n| u64::from(n.load(Ordering::Relaxed))),
            Counts::Arena(counts) => i.and_then(|i| counts.get(i)).map_or(0, |&n| u64::from(n)),
        }
    }
}

impl std::ops::Deref for Held<'_> {
    type Target = [Holder];
    #[inline]
    fn deref(&self) -> &[Holder] {
        self.holders
    }
}

/// A holding as the facade hands it out.
#[inline]
pub(crate) fn holder_of(h: &Holding) -> Holder {
    Holder::new(h.replica, h.tokens, h.tier, h.last_seen)
}

/// Holdings of one arena block as read, and as holders with their counts.
type Buf = (Vec<Holding>, Vec<Holder>, Vec<u32>);

thread_local! {
    static BUF: RefCell<Buf> = const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// One holding an arena sweep removed.
pub(crate) struct ArenaRemoval {
    pub(crate) part: u32,
    pub(crate) hash: u64,
    pub(crate) holder: Holder,
    /// No replica holds the block any more.
    pub(crate) key_gone: bool,
}

/// What [`Entries::take`] did.
pub(crate) enum Taken {
    /// The replica did not hold the key.
    Absent,
    /// The check refused: the holder's LFU count and last-seen time now.
    Refused { access: u64, last_seen: i64 },
    /// Removed: the holder.
    Removed(Holder),
}

/// What [`Entries::take_key`] did.
pub(crate) enum KeyTaken {
    /// The key has no holders.
    Absent,
    /// The check refused.
    Refused,
    /// Removed: every holder, in replica order.
    Removed(Vec<Holder>),
}

impl Entries {
    pub(crate) fn new() -> Self {
        Self {
            odd: OddKeys::new(),
            arena: ChainArena::new(),
            endpoints: Endpoints::default(),
        }
    }

    /// The arena.
    #[inline]
    pub(crate) fn arena(&self) -> &ChainArena {
        &self.arena
    }

    /// The arena and the block's hash when key `bytes` lives there (it is
    /// 8 bytes long).
    #[inline]
    pub(crate) fn arena_block(&self, bytes: &[u8]) -> Option<(&ChainArena, u64)> {
        let b: [u8; 8] = bytes.try_into().ok()?;
        Some((&self.arena, u64::from_le_bytes(b)))
    }

    /// `f` on the holders of `k` (under the odd-key shard's read lock;
    /// copies for the arena); `None` when nobody holds it.
    pub(crate) fn holders<T>(&self, k: &KeyRef<'_>, f: impl FnOnce(&Held<'_>) -> T) -> Option<T> {
        let Some((a, h)) = self.arena_block(k.bytes) else {
            let shard = self.odd.read(OddKeys::shard(k));
            return shard.held(k).map(|held| f(&held));
        };
        crate::scratch::with(&BUF, |(hs, out, counts)| {
            a.holders(k.part, h, hs);
            if hs.is_empty() {
                return None;
            }
            out.clear();
            out.extend(hs.iter().map(holder_of));
            counts.clear();
            counts.extend(hs.iter().map(|h| h.access));
            Some(f(&Held::arena(out, counts)))
        })
    }

    /// Records whether `replica`'s holding of key `bytes` is a valid match
    /// end (`endpoints.rs`): a mark is set under the run read lock that
    /// finds the holding (as a credit is), so it never outlives it; keys of
    /// another length carry no marks.
    pub(crate) fn mark_end(&self, part: u32, bytes: &[u8], replica: u32, no_end: bool) {
        let Some((a, h)) = self.arena_block(bytes) else {
            return;
        };
        if no_end {
            a.with_holding(part, h, replica, |_| {
                self.endpoints.set(part, h, replica, true)
            });
        } else {
            self.endpoints.clear(part, h, replica);
        }
    }

    /// Whether any holding carries a match-end mark (a hybrid producer
    /// reported here); `false` lets an export skip the side table.
    #[inline]
    pub(crate) fn has_end_marks(&self) -> bool {
        !self.endpoints.is_empty()
    }

    /// Whether `replica`'s holding of arena block `hash` is marked as not a
    /// valid match end.
    pub(crate) fn end_marked(&self, part: u32, hash: u64, replica: u32) -> bool {
        self.endpoints.marked(part, hash, replica)
    }

    /// +1 delivered hit for `replica`'s holding of `k`, if it still exists.
    pub(crate) fn credit(&self, k: &KeyRef<'_>, replica: u32) {
        match self.arena_block(k.bytes) {
            None => self.odd.read(OddKeys::shard(k)).credit(k, replica),
            Some((a, h)) => {
                // Under the run's read lock: a removal (write lock) clears
                // the count after, never before, this credit.
                a.credit(k.part, 1, |_| h, &mut [Credit { replica, blocks: 1 }]);
            }
        }
    }

    /// Removes `replica`'s holding of `k` if `check(holder, LFU count)`
    /// accepts it (asked under the store's write lock, so nothing changes
    /// between the check and the removal); `after(holder, rest)` then sees
    /// the key's remaining holders (under the lock for an odd key).
    pub(crate) fn take(
        &self,
        k: &KeyRef<'_>,
        replica: u32,
        check: impl FnOnce(&Holder, u64) -> bool,
        after: impl FnOnce(&Holder, &[Holder]),
    ) -> Taken {
        let Some((a, hash)) = self.arena_block(k.bytes) else {
            let mut shard = self.odd.write(OddKeys::shard(k));
            let Some((access, last_seen, ok)) = shard.held(k).and_then(|hs| {
                let h = holder::find(&hs, replica)?;
                let access = hs.access(h);
                Some((access, h.last_seen, check(h, access)))
            }) else {
                return Taken::Absent;
            };
            if !ok {
                return Taken::Refused { access, last_seen };
            }
            return match shard.take_holder(k, replica) {
                Some((h, rest)) => {
                    after(&h, rest.unwrap_or(&[]));
                    Taken::Removed(h)
                }
                None => Taken::Absent,
            };
        };
        let part = k.part;
        let mut refused = None;
        crate::scratch::with(&BUF, |(rest, out, _)| {
            let taken = a.take(
                part,
                hash,
                replica,
                |held| {
                    let access = u64::from(held.access);
                    let ok = check(&holder_of(held), access);
                    if ok {
                        // Under the run's write lock, with the removal
                        // (the arena drops the count with the holding).
                        self.endpoints.clear(part, hash, replica);
                    } else {
                        refused = Some((access, held.last_seen));
                    }
                    ok
                },
                rest,
            );
            match taken {
                Take::Absent => Taken::Absent,
                Take::Refused(_) => {
                    let (access, last_seen) = refused.unwrap_or_default();
                    Taken::Refused { access, last_seen }
                }
                Take::Removed(held) => {
                    let h = holder_of(&held);
                    out.clear();
                    out.extend(rest.iter().map(holder_of));
                    after(&h, out);
                    Taken::Removed(h)
                }
            }
        })
    }

    /// Removes every holder of `k` if `check(holders)` accepts them (asked
    /// under the store's write lock).
    pub(crate) fn take_key(
        &self,
        k: &KeyRef<'_>,
        check: impl FnOnce(&[Holder]) -> bool,
    ) -> KeyTaken {
        let Some((a, hash)) = self.arena_block(k.bytes) else {
            let mut shard = self.odd.write(OddKeys::shard(k));
            let Some(ok) = shard.get(k).map(check) else {
                return KeyTaken::Absent;
            };
            if !ok {
                return KeyTaken::Refused;
            }
            return shard.remove(k).map_or(KeyTaken::Absent, KeyTaken::Removed);
        };
        let part = k.part;
        let mut removed = Vec::new();
        let mut asked = false;
        let mut ok = false;
        let done = a.take_block(
            part,
            hash,
            |held| {
                asked = true;
                let hs: Vec<Holder> = held.iter().map(holder_of).collect();
                ok = check(&hs);
                if ok {
                    for h in held {
                        self.endpoints.clear(part, hash, h.replica);
                    }
                }
                ok
            },
            &mut removed,
        );
        match (done, asked, ok) {
            (true, _, _) => KeyTaken::Removed(removed.iter().map(holder_of).collect()),
            (false, true, false) => KeyTaken::Refused,
            _ => KeyTaken::Absent,
        }
    }

    /// Removes the arena holdings `drop(partition, replica, last_seen)`
    /// selects (decided once per span), with their LFU counts; each removed
    /// holding is returned with whether its block went with it.
    pub(crate) fn sweep_arena(
        &self,
        mut drop: impl FnMut(u32, u32, i64) -> bool,
    ) -> Vec<ArenaRemoval> {
        let mut removed = Vec::new();
        self.arena.retain(
            |part, replica, last_seen, _| !drop(part, replica, last_seen),
            |s, last| {
                // Under the run's write lock, with the removal.
                self.endpoints.clear(s.part, s.hash, s.holding.replica);
                removed.push(ArenaRemoval {
                    part: s.part,
                    hash: s.hash,
                    holder: holder_of(&s.holding),
                    key_gone: last,
                });
            },
        );
        // The arena says "emptied" for every holding a sweep took from a
        // block it emptied; the key went once.
        let mut seen = std::collections::HashSet::new();
        for rm in removed.iter_mut().filter(|rm| rm.key_gone) {
            rm.key_gone = seen.insert((rm.part, rm.hash));
        }
        removed
    }

    /// Every key with its partition id, hash and holders (both stores, one
    /// lock at a time), skipping the arena holdings `span_ok(partition,
    /// last_seen)` turns away, a span at a time
    /// ([`ChainArena::for_each_block_where`]); odd keys are all visited.
    pub(crate) fn scan_where(
        &self,
        span_ok: impl FnMut(u32, i64) -> bool,
        mut visit: impl FnMut(u32, &[u8], &Held<'_>),
    ) {
        for si in 0..self.odd.len() {
            let shard = self.odd.read(si);
            for (pid, hash, holders) in shard.iter() {
                visit(pid, hash, &holders);
            }
        }
        let mut hs: Vec<Holder> = Vec::new();
        let mut counts: Vec<u32> = Vec::new();
        self.arena
            .for_each_block_where(span_ok, |part, hash, held| {
                hs.clear();
                hs.extend(held.iter().map(holder_of));
                counts.clear();
                counts.extend(held.iter().map(|h| h.access));
                visit(part, &hash.to_le_bytes(), &Held::arena(&hs, &counts));
            });
    }
}

//! Where the index keeps its (key, holders) entries: one facade over two
//! stores, routed by key length (issue 14).
//!
//! ```text
//!   8-byte keys (chain blocks, 8-byte legacy keys) ──► ChainArena   runs + spans (arena/)
//!   every other length                             ──► Shards       slot table (shard.rs)
//!   LFU counts: slot table ── per-shard credit table; arena ── Credits side table
//! ```
//!
//! A key has one length, so it lives in exactly one store; every reader
//! and writer asks the facade, which asks the store the key's length names.
//! With the arena off (`IndexConfig::chain_arena(false)`) every key lives
//! in the slot table, the layout before issue 14.
//!
//! The slot table hands out holders under its shard lock ([`Held`]); the
//! arena keeps holdings as spans over runs, so its holders are copies
//! (built from [`Holding`]s into a reused buffer) handed out the same way.

mod credits;

pub(crate) use credits::Credits;

use crate::arena::{ChainArena, Holding, Take};
use crate::holder::{self, Holder, Holders};
use crate::key::KeyRef;
use crate::shard::{Held, Shards};
use std::cell::RefCell;

/// The entry stores.
pub(crate) struct Entries {
    /// Keys that are not 8 bytes long (all keys when the arena is off).
    pub(crate) slots: Shards,
    arena: Option<ChainArena>,
    /// LFU counts of arena holdings.
    pub(crate) credits: Credits,
}

/// A holding as the slot table keeps it.
#[inline]
pub(crate) fn holder_of(h: &Holding) -> Holder {
    Holder::new(h.replica, h.tokens, h.tier, h.last_seen)
}

thread_local! {
    /// Holdings of one arena block as read, and as holders.
    static BUF: RefCell<(Vec<Holding>, Vec<Holder>)> = const { RefCell::new((Vec::new(), Vec::new())) };
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
    Removed(Holders),
}

impl Entries {
    pub(crate) fn new(arena: bool) -> Self {
        Self {
            slots: Shards::new(),
            arena: arena.then(ChainArena::new),
            credits: Credits::default(),
        }
    }

    /// The arena, when it is on.
    #[inline]
    pub(crate) fn arena(&self) -> Option<&ChainArena> {
        self.arena.as_ref()
    }

    /// The arena and the block's hash when key `bytes` lives there.
    #[inline]
    pub(crate) fn arena_block(&self, bytes: &[u8]) -> Option<(&ChainArena, u64)> {
        let a = self.arena.as_ref()?;
        let b: [u8; 8] = bytes.try_into().ok()?;
        Some((a, u64::from_le_bytes(b)))
    }

    /// `f` on the holders of `k` (under their store's read lock for the
    /// slot table; copies for the arena); `None` when nobody holds it.
    pub(crate) fn holders<T>(&self, k: &KeyRef<'_>, f: impl FnOnce(&Held<'_>) -> T) -> Option<T> {
        let Some((a, h)) = self.arena_block(k.bytes) else {
            let shard = self.slots.read(k.shard());
            return shard.held(k).map(|held| f(&held));
        };
        crate::scratch::with(&BUF, |(hs, out)| {
            a.holders(k.part, h, hs);
            if hs.is_empty() {
                return None;
            }
            out.clear();
            out.extend(hs.iter().map(holder_of));
            Some(f(&Held::arena(out, &self.credits, k.part, h)))
        })
    }

    /// +1 delivered hit for `replica`'s holding of `k`, if it still exists.
    pub(crate) fn credit(&self, k: &KeyRef<'_>, replica: u32) {
        match self.arena_block(k.bytes) {
            None => self.slots.read(k.shard()).credit(k, replica),
            Some((a, h)) => {
                // Under the run's read lock: a removal (write lock) clears
                // the count after, never before, this bump.
                a.with_holding(k.part, h, replica, |_| {
                    self.credits.bump(k.part, h, replica)
                });
            }
        }
    }

    /// Removes `replica`'s holding of `k` if `check(holder, LFU count)`
    /// accepts it (asked under the store's write lock, so nothing changes
    /// between the check and the removal); `after(holder, rest)` then sees
    /// the key's remaining holders (under the lock for the slot table).
    pub(crate) fn take(
        &self,
        k: &KeyRef<'_>,
        replica: u32,
        check: impl FnOnce(&Holder, u64) -> bool,
        after: impl FnOnce(&Holder, &[Holder]),
    ) -> Taken {
        let Some((a, hash)) = self.arena_block(k.bytes) else {
            let mut shard = self.slots.write(k.shard());
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
        crate::scratch::with(&BUF, |(rest, out)| {
            let taken = a.take(
                part,
                hash,
                replica,
                |held| {
                    let access = self.credits.get(part, hash, replica);
                    let ok = check(&holder_of(held), access);
                    if ok {
                        // Under the run's write lock, with the removal.
                        self.credits.clear(part, hash, replica);
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
            let mut shard = self.slots.write(k.shard());
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
                        self.credits.clear(part, hash, h.replica);
                    }
                }
                ok
            },
            &mut removed,
        );
        match (done, asked, ok) {
            (true, _, _) => {
                KeyTaken::Removed(Holders::Many(removed.iter().map(holder_of).collect()))
            }
            (false, true, false) => KeyTaken::Refused,
            _ => KeyTaken::Absent,
        }
    }

    /// Removes the arena holdings `drop(partition, replica, last_seen)`
    /// selects (decided once per span), with their LFU counts; each removed
    /// holding is returned with whether its block went with it. Nothing
    /// when the arena is off.
    pub(crate) fn sweep_arena(
        &self,
        mut drop: impl FnMut(u32, u32, i64) -> bool,
    ) -> Vec<ArenaRemoval> {
        let mut removed = Vec::new();
        if let Some(a) = &self.arena {
            a.retain(
                |part, replica, last_seen, _| !drop(part, replica, last_seen),
                |s, last| {
                    // Under the run's write lock, with the removal.
                    self.credits.clear(s.part, s.hash, s.holding.replica);
                    removed.push(ArenaRemoval {
                        part: s.part,
                        hash: s.hash,
                        holder: holder_of(&s.holding),
                        key_gone: last,
                    });
                },
            );
        }
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
    /// ([`ChainArena::for_each_block_where`]); slot-table keys are all visited.
    pub(crate) fn scan_where(
        &self,
        span_ok: impl FnMut(u32, i64) -> bool,
        mut visit: impl FnMut(u32, &[u8], &Held<'_>),
    ) {
        for si in 0..self.slots.len() {
            let shard = self.slots.read(si);
            for (pid, hash, holders) in shard.iter() {
                visit(pid, hash, &holders);
            }
        }
        if let Some(a) = &self.arena {
            let mut hs: Vec<Holder> = Vec::new();
            a.for_each_block_where(span_ok, |part, hash, held| {
                hs.clear();
                hs.extend(held.iter().map(holder_of));
                visit(
                    part,
                    &hash.to_le_bytes(),
                    &Held::arena(&hs, &self.credits, part, hash),
                );
            });
        }
    }
}

//! The holders of one key: one 16-byte entry per replica, sorted by interned
//! replica id (chain lookups merge-join their runs against that order).
//!
//! A holder packs its replica id, tier and "has an LFU count" flag into one
//! word; the LFU count itself lives in its shard's credit table
//! (`shard.rs`), which only credited holders use. Most holders are never
//! credited (LRU tenants, cold entries), and a 16-byte holder makes the
//! common one-holder slot 40 bytes instead of 48 (issue 14).

use crate::types::Tier;
use std::sync::atomic::{AtomicU32, Ordering};

/// Bits of the word that hold the replica id: ids stay below 2^24
/// (16.7 M replica names, `catalog.rs` refuses more).
const REPLICA_BITS: u32 = 24;
/// Number of distinct replica ids a holder can carry.
pub(crate) const MAX_REPLICA_IDS: usize = 1 << REPLICA_BITS;
const REPLICA_MASK: u32 = (1 << REPLICA_BITS) - 1;
/// Seven tier bits: raw tiers 0..=125 as themselves, 126 for any larger raw
/// tier, 127 for [`Tier::INVALID`].
const TIER_SHIFT: u32 = REPLICA_BITS;
const TIER_MASK: u32 = 0x7f;
const TIER_SATURATED: u32 = 126;
const TIER_INVALID: u32 = 127;
/// Set once the holder has a count in its shard's credit table.
const CREDITED: u32 = 1 << 31;

/// A tier as its seven-bit code. Raw tiers above 125 (no engine sends them;
/// they all read UNSPECIFIED on the wire and earn no ranking credit, like
/// 125 itself) saturate to 126 (docs/decisions.md).
fn tier_code(t: Tier) -> u32 {
    if t == Tier::INVALID {
        return TIER_INVALID;
    }
    u32::try_from(t.raw()).map_or(TIER_INVALID, |r| r.min(TIER_SATURATED))
}

fn tier_of_code(c: u32) -> Tier {
    if c == TIER_INVALID {
        Tier::INVALID
    } else {
        Tier::from_wire(c as i32)
    }
}

/// One (prefix key, replica) entry: 16 bytes.
#[derive(Debug)]
pub(crate) struct Holder {
    pub(crate) last_seen: i64,
    /// Replica id (low 24 bits), tier code (7 bits), [`CREDITED`] (top
    /// bit). Atomic because a credit sets the flag under the shard's read
    /// lock; everything else changes under its write lock.
    word: AtomicU32,
    pub(crate) tokens: i32,
}

impl Holder {
    /// `replica` must be below [`MAX_REPLICA_IDS`] (the catalog never hands
    /// out a larger id).
    pub(crate) fn new(replica: u32, tokens: i32, tier: Tier, last_seen: i64) -> Self {
        Self {
            last_seen,
            word: AtomicU32::new((replica & REPLICA_MASK) | (tier_code(tier) << TIER_SHIFT)),
            tokens,
        }
    }

    #[inline]
    fn word(&self) -> u32 {
        self.word.load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn replica(&self) -> u32 {
        self.word() & REPLICA_MASK
    }

    #[inline]
    pub(crate) fn tier(&self) -> Tier {
        tier_of_code((self.word() >> TIER_SHIFT) & TIER_MASK)
    }

    pub(crate) fn set_tier(&mut self, t: Tier) {
        let w = self.word.get_mut();
        *w = (*w & !(TIER_MASK << TIER_SHIFT)) | (tier_code(t) << TIER_SHIFT);
    }

    /// Whether the shard's credit table has a count for this holder.
    #[inline]
    pub(crate) fn credited(&self) -> bool {
        self.word() & CREDITED != 0
    }

    /// Flags the holder as credited (callers hold the credit table's lock).
    pub(crate) fn mark_credited(&self) {
        self.word.fetch_or(CREDITED, Ordering::Relaxed);
    }
}

/// Where `replica` is (`Ok`) or would go (`Err`) in a replica-sorted list.
#[inline]
pub(crate) fn position(hs: &[Holder], replica: u32) -> Result<usize, usize> {
    hs.binary_search_by_key(&replica, Holder::replica)
}

/// `replica`'s holder in a replica-sorted list.
#[inline]
pub(crate) fn find(hs: &[Holder], replica: u32) -> Option<&Holder> {
    hs.get(position(hs, replica).ok()?)
}

/// The holders of one key, sorted by replica id. A single holder (the common
/// case) lives inline in the slot: no allocation, no pointer chase.
#[derive(Debug)]
pub(crate) enum Holders {
    One(Holder),
    Many(Vec<Holder>),
}

impl Holders {
    pub(crate) fn one(h: Holder) -> Self {
        Holders::One(h)
    }

    /// Insert at `i` (keeping the replica order).
    pub(crate) fn insert(&mut self, i: usize, h: Holder) {
        match self {
            Holders::Many(v) => v.insert(i.min(v.len()), h),
            Holders::One(_) => {
                let old = std::mem::replace(self, Holders::Many(Vec::with_capacity(2)));
                if let (Holders::One(first), Holders::Many(v)) = (old, &mut *self) {
                    v.push(first);
                    v.insert(i.min(1), h);
                }
            }
        }
    }

    /// Remove the holder at `i`. Removing the last one leaves an empty list.
    pub(crate) fn remove(&mut self, i: usize) -> Option<Holder> {
        match self {
            Holders::Many(v) => {
                if i >= v.len() {
                    return None;
                }
                let h = v.remove(i);
                if v.len() == 1 {
                    if let Some(last) = v.pop() {
                        *self = Holders::One(last);
                    }
                } else if v.capacity() > 2 * v.len() + 2 {
                    v.shrink_to(v.len() + v.len() / 2);
                }
                Some(h)
            }
            Holders::One(_) => {
                if i != 0 {
                    return None;
                }
                match std::mem::replace(self, Holders::Many(Vec::new())) {
                    Holders::One(h) => Some(h),
                    Holders::Many(_) => None,
                }
            }
        }
    }
}

impl std::ops::Deref for Holders {
    type Target = [Holder];
    #[inline]
    fn deref(&self) -> &[Holder] {
        match self {
            Holders::One(h) => std::slice::from_ref(h),
            Holders::Many(v) => v,
        }
    }
}

impl std::ops::DerefMut for Holders {
    #[inline]
    fn deref_mut(&mut self) -> &mut [Holder] {
        match self {
            Holders::One(h) => std::slice::from_mut(h),
            Holders::Many(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(replica: u32) -> Holder {
        Holder::new(replica, 0, Tier::T1, 0)
    }

    fn ids(hs: &Holders) -> Vec<u32> {
        hs.iter().map(|x| x.replica()).collect()
    }

    #[test]
    fn holders_spill_and_collapse_keep_order() {
        let mut hs = Holders::one(h(5));
        hs.insert(0, h(2));
        assert_eq!(ids(&hs), vec![2, 5]);
        hs.insert(2, h(9));
        hs.insert(1, h(3));
        assert_eq!(ids(&hs), vec![2, 3, 5, 9]);
        assert_eq!(hs.remove(0).map(|x| x.replica()), Some(2));
        assert_eq!(hs.remove(1).map(|x| x.replica()), Some(5));
        assert_eq!(hs.remove(0).map(|x| x.replica()), Some(3));
        assert!(matches!(hs, Holders::One(_)));
        assert_eq!(ids(&hs), vec![9]);
        assert!(hs.remove(1).is_none());
        assert_eq!(hs.remove(0).map(|x| x.replica()), Some(9));
        assert!(hs.is_empty());
        let mut one = Holders::one(h(1));
        one.insert(1, h(4));
        assert_eq!(ids(&one), vec![1, 4]);
    }

    #[test]
    fn the_word_keeps_replica_tier_and_flag_apart() {
        assert_eq!(std::mem::size_of::<Holder>(), 16);
        assert_eq!(std::mem::size_of::<Holders>(), 24);
        let top = (MAX_REPLICA_IDS - 1) as u32;
        for (wire, want) in [
            (0, Tier::UNSPECIFIED),
            (1, Tier::T1),
            (2, Tier::T2),
            (3, Tier::T3),
            (9, Tier::from_wire(9)),
            (125, Tier::from_wire(125)),
            (-1, Tier::INVALID),
        ] {
            let mut x = Holder::new(top, -7, Tier::from_wire(wire), i64::MIN);
            assert_eq!((x.replica(), x.tier(), x.tokens), (top, want, -7));
            assert!(!x.credited());
            x.mark_credited();
            assert!(x.credited());
            assert_eq!((x.replica(), x.tier()), (top, want));
            x.set_tier(Tier::T3);
            assert_eq!((x.replica(), x.tier(), x.credited()), (top, Tier::T3, true));
            x.set_tier(Tier::INVALID);
            assert_eq!(x.tier(), Tier::INVALID);
        }
    }

    #[test]
    fn raw_tiers_past_the_code_space_saturate_and_keep_their_wire_meaning() {
        for raw in [126, 127, 1000, i32::MAX - 1] {
            let t = Tier::from_wire(raw);
            let x = Holder::new(3, 0, t, 0);
            assert_eq!(x.tier(), Tier::from_wire(126));
            assert_eq!(x.tier().to_wire(), t.to_wire());
            assert_eq!(x.replica(), 3);
        }
    }
}

//! The holders of one key: one 16-byte entry per replica, sorted by interned
//! replica id (chain lookups merge-join their runs against that order).
//!
//! A holder packs its replica id, tier and "has an LFU count" flag into one
//! word; the LFU count itself lives in its shard's credit table
//! (`shard.rs`), which only credited holders use. Most holders are never
//! credited (LRU tenants, cold entries), and a 16-byte holder makes the
//! common one-holder slot 32 bytes (issue 14; a key with more holders keeps
//! them in its shard's pool, `holder_pool.rs`).

use crate::types::Tier;
use std::sync::atomic::{AtomicU32, Ordering};

/// Bits of the word that hold the replica id: ids stay below 2^24 - 1
/// (16.7 M replica names, `catalog.rs` refuses more).
const REPLICA_BITS: u32 = 24;
const REPLICA_MASK: u32 = (1 << REPLICA_BITS) - 1;
/// The replica id of a slot's holder that stands for a block of its
/// shard's holder pool (`holder_pool.rs`); never a replica's.
pub(crate) const POOL_MARK: u32 = REPLICA_MASK;
/// Number of distinct replica ids a holder can carry (all but the mark).
pub(crate) const MAX_REPLICA_IDS: usize = POOL_MARK as usize;
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
            word: AtomicU32::new(pack_word(replica, tier)),
            tokens,
        }
    }

    #[inline]
    fn word(&self) -> u32 {
        self.word.load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn replica(&self) -> u32 {
        word_replica(self.word())
    }

    #[inline]
    pub(crate) fn tier(&self) -> Tier {
        word_tier(self.word())
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

/// A replica id (below [`MAX_REPLICA_IDS`]) and a tier in one word, as a
/// holder keeps them (the chain-run arena's spans share the layout).
#[inline]
pub(crate) fn pack_word(replica: u32, tier: Tier) -> u32 {
    (replica & REPLICA_MASK) | (tier_code(tier) << TIER_SHIFT)
}

/// The replica id of a [`pack_word`] word.
#[inline]
pub(crate) fn word_replica(w: u32) -> u32 {
    w & REPLICA_MASK
}

/// The tier of a [`pack_word`] word.
#[inline]
pub(crate) fn word_tier(w: u32) -> Tier {
    tier_of_code((w >> TIER_SHIFT) & TIER_MASK)
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

/// The holders of a key taken out of the index, sorted by replica id
/// (stored holders live in the slot or its shard's pool, `holder_pool.rs`).
#[derive(Debug)]
pub(crate) enum Holders {
    One(Holder),
    Many(Vec<Holder>),
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

#[cfg(test)]
mod tests {
    use super::*;

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

//! A replica id and a tier packed in one word, as a span keeps them (and
//! the entry facade's holder copies, `entries/holder.rs`).

use crate::types::Tier;

/// Bits of the word that hold the replica id: ids stay below 2^24 - 1
/// (16.7 M replica names, `catalog.rs` refuses more).
const REPLICA_BITS: u32 = 24;
const REPLICA_MASK: u32 = (1 << REPLICA_BITS) - 1;
/// Number of distinct replica ids a word can carry (the all-ones id stays
/// unused, as it was when it marked the slot table's pooled holders).
pub(crate) const MAX_REPLICA_IDS: usize = REPLICA_MASK as usize;
/// Seven tier bits: raw tiers 0..=125 as themselves, 126 for any larger raw
/// tier, 127 for [`Tier::INVALID`].
const TIER_SHIFT: u32 = REPLICA_BITS;
const TIER_MASK: u32 = 0x7f;
const TIER_SATURATED: u32 = 126;
const TIER_INVALID: u32 = 127;

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

/// A replica id (below [`MAX_REPLICA_IDS`]) and a tier in one word.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_keeps_replica_and_tier_apart() {
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
            let w = pack_word(top, Tier::from_wire(wire));
            assert_eq!((word_replica(w), word_tier(w)), (top, want));
        }
    }

    #[test]
    fn raw_tiers_past_the_code_space_saturate_and_keep_their_wire_meaning() {
        for raw in [126, 127, 1000, i32::MAX - 1] {
            let t = Tier::from_wire(raw);
            let w = pack_word(3, t);
            assert_eq!(word_tier(w), Tier::from_wire(126));
            assert_eq!(word_tier(w).to_wire(), t.to_wire());
            assert_eq!(word_replica(w), 3);
        }
    }
}

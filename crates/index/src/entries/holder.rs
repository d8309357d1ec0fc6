//! A (key, replica) entry as the facade hands it out: a 16-byte copy with
//! the replica id and tier packed as the arena's spans pack them, so both
//! stores report the same tier for the same input.

use crate::arena::{pack_word, word_replica, word_tier};
use crate::types::Tier;

/// One (prefix key, replica) entry: 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) last_seen: i64,
    /// Replica id and tier code (`arena/word.rs`).
    word: u32,
    pub(crate) tokens: i32,
}

impl Holder {
    /// `replica` must be below [`crate::arena::MAX_REPLICA_IDS`] (the
    /// catalog never hands out a larger id).
    #[inline]
    pub(crate) fn new(replica: u32, tokens: i32, tier: Tier, last_seen: i64) -> Self {
        Self {
            last_seen,
            word: pack_word(replica, tier),
            tokens,
        }
    }

    #[inline]
    pub(crate) fn replica(&self) -> u32 {
        word_replica(self.word)
    }

    #[inline]
    pub(crate) fn tier(&self) -> Tier {
        word_tier(self.word)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_sixteen_bytes_and_keeps_its_fields() {
        assert_eq!(std::mem::size_of::<Holder>(), 16);
        let x = Holder::new(7, -3, Tier::T2, i64::MIN);
        assert_eq!(
            (x.replica(), x.tier(), x.tokens, x.last_seen),
            (7, Tier::T2, -3, i64::MIN)
        );
    }
}

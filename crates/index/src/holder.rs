//! The holders of one key: one 24-byte entry per replica, sorted by interned
//! replica id (chain lookups merge-join their runs against that order).

use crate::types::Tier;
use std::sync::atomic::{AtomicU32, Ordering};

/// One (prefix key, replica) entry: 24 bytes.
#[derive(Debug)]
pub(crate) struct Holder {
    pub(crate) last_seen: i64,
    pub(crate) replica: u32,
    pub(crate) tokens: i32,
    pub(crate) tier: Tier,
    /// LFU access count (delivered hits); never reset by refresh. Saturates
    /// at `u32::MAX` (four billion delivered hits on one entry).
    access: AtomicU32,
}

impl Holder {
    pub(crate) fn new(replica: u32, tokens: i32, tier: Tier, last_seen: i64) -> Self {
        Self {
            last_seen,
            replica,
            tokens,
            tier,
            access: AtomicU32::new(0),
        }
    }

    /// A holder restored from a snapshot with its LFU count (saturating).
    pub(crate) fn restored(
        replica: u32,
        tokens: i32,
        tier: Tier,
        last_seen: i64,
        access: u64,
    ) -> Self {
        let h = Self::new(replica, tokens, tier, last_seen);
        h.set_access(access);
        h
    }

    /// Overwrites the LFU count (snapshot restore), saturating at `u32::MAX`.
    pub(crate) fn set_access(&self, n: u64) {
        self.access
            .store(u32::try_from(n).unwrap_or(u32::MAX), Ordering::Relaxed);
    }

    pub(crate) fn access(&self) -> u64 {
        u64::from(self.access.load(Ordering::Relaxed))
    }

    /// +1 delivered hit (callers hold the shard's read lock).
    pub(crate) fn credit(&self) {
        // An Err means the counter is saturated: leave it there.
        let _ = self
            .access
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_add(1));
    }
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
        hs.iter().map(|x| x.replica).collect()
    }

    #[test]
    fn holders_spill_and_collapse_keep_order() {
        let mut hs = Holders::one(h(5));
        hs.insert(0, h(2));
        assert_eq!(ids(&hs), vec![2, 5]);
        hs.insert(2, h(9));
        hs.insert(1, h(3));
        assert_eq!(ids(&hs), vec![2, 3, 5, 9]);
        assert_eq!(hs.remove(0).map(|x| x.replica), Some(2));
        assert_eq!(hs.remove(1).map(|x| x.replica), Some(5));
        assert_eq!(hs.remove(0).map(|x| x.replica), Some(3));
        assert!(matches!(hs, Holders::One(_)));
        assert_eq!(ids(&hs), vec![9]);
        assert!(hs.remove(1).is_none());
        assert_eq!(hs.remove(0).map(|x| x.replica), Some(9));
        assert!(hs.is_empty());
        let mut one = Holders::one(h(1));
        one.insert(1, h(4));
        assert_eq!(ids(&one), vec![1, 4]);
    }

    #[test]
    fn access_saturates() {
        let x = h(1);
        x.credit();
        assert_eq!(x.access(), 1);
        x.access.store(u32::MAX, Ordering::Relaxed);
        x.credit();
        assert_eq!(x.access(), u64::from(u32::MAX));
        assert_eq!(std::mem::size_of::<Holder>(), 24);
    }
}

//! Replica names ranked in byte order, as integers.
//!
//! Rankings break score ties by replica name (spec: score descending, then
//! replica id ascending). Comparing the names themselves costs a lookup one
//! string compare per tie, each reading two heap strings the lookup never
//! otherwise touches (`bench/peers`: ~9 % of a chain lookup's samples were
//! that sort). Instead every live replica name carries a `u64` label whose
//! order is the names' byte order, kept next to the catalog's id → name
//! table, so the final sort compares integers.
//!
//! Labels are sparse (spaced [`GAP`] apart): a new name takes the midpoint
//! of its neighbours' labels, and only when a gap is used up are all labels
//! rewritten, evenly spaced again. A name appended after the last one (the
//! usual case: `replica-0`, `replica-1`, ...) takes the last label plus the
//! gap. Interning a replica is rare (first report of a replica), and a
//! relabel is one pass over the live names under the catalog's write lock.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

/// Spacing of evenly written labels: room for 2^24 names (the replica id
/// space) below 2^63, and 38 midpoint insertions into one gap before the
/// next relabel.
const GAP: u64 = 1 << 39;

/// Byte-order labels of the live replica names, indexed by replica id.
#[derive(Default)]
pub(crate) struct NameOrder {
    by_name: BTreeMap<Arc<str>, u32>,
    labels: Vec<u64>,
}

impl NameOrder {
    /// Gives `id` (named `name`, not yet present) its label.
    pub(crate) fn insert(&mut self, name: Arc<str>, id: u32) {
        let key: &str = &name;
        let label_of = |(_, &i): (&Arc<str>, &u32)| self.label(i);
        let below = self
            .by_name
            .range::<str, _>((Bound::Unbounded, Bound::Excluded(key)))
            .next_back()
            .map(label_of);
        let above = self
            .by_name
            .range::<str, _>((Bound::Excluded(key), Bound::Unbounded))
            .next()
            .map(label_of);
        let lo = below.unwrap_or(0);
        let hi = above.unwrap_or(u64::MAX);
        let label = match above {
            None if hi - lo > GAP => Some(lo + GAP),
            _ if hi - lo >= 2 => Some(lo + (hi - lo) / 2),
            _ => None,
        };
        self.by_name.insert(name, id);
        match label {
            Some(l) => self.set(id, l),
            None => self.relabel(),
        }
    }

    /// Forgets `name` (its id's label stays until the id is reused).
    pub(crate) fn remove(&mut self, name: &str) {
        self.by_name.remove(name);
    }

    /// The label of `id`: for two live ids, `label(a) < label(b)` exactly
    /// when `name(a) < name(b)` byte-wise.
    #[inline]
    pub(crate) fn label(&self, id: u32) -> u64 {
        self.labels.get(id as usize).copied().unwrap_or(u64::MAX)
    }

    fn set(&mut self, id: u32, label: u64) {
        let i = id as usize;
        if self.labels.len() <= i {
            self.labels.resize(i + 1, u64::MAX);
        }
        self.labels[i] = label;
    }

    fn relabel(&mut self) {
        let ids: Vec<u32> = self.by_name.values().copied().collect();
        for (n, id) in ids.into_iter().enumerate() {
            self.set(id, (n as u64 + 1) * GAP);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check(o: &NameOrder) {
        let labels: Vec<u64> = o.by_name.values().map(|&id| o.label(id)).collect();
        assert!(
            labels.windows(2).all(|w| w[0] < w[1]),
            "labels follow the names' order: {labels:?}"
        );
    }

    #[test]
    fn labels_follow_byte_order_whatever_the_insertion_order() {
        let mut o = NameOrder::default();
        for (id, name) in ["b", "a", "c", "ab", "B", "", "zz"].into_iter().enumerate() {
            o.insert(Arc::from(name), id as u32);
            check(&o);
        }
        // "" < "B" < "a" < "ab" < "b" < "c" < "zz"
        assert!(o.label(5) < o.label(4) && o.label(4) < o.label(1));
        assert!(o.label(1) < o.label(3) && o.label(3) < o.label(0));
    }

    #[test]
    fn a_used_up_gap_relabels_everything_in_order() {
        let mut o = NameOrder::default();
        o.insert(Arc::from("a"), 0);
        o.insert(Arc::from("b"), 1);
        // "a\0", "a\0\0", ...: each name lands between the previous one and
        // "b", so that gap halves every time and runs out after ~39 names.
        let mut name = String::from("b");
        for id in 2..200u32 {
            name.insert(1, '\0');
            name.replace_range(..1, "a");
            o.insert(Arc::from(name.as_str()), id);
            check(&o);
        }
    }

    proptest! {
        #[test]
        fn labels_match_a_sorted_model(ops in proptest::collection::vec((any::<bool>(), "[a-c]{0,4}"), 1..200)) {
            let mut o = NameOrder::default();
            let mut ids: BTreeMap<String, u32> = BTreeMap::new();
            let mut next = 0u32;
            for (add, name) in ops {
                if add {
                    if !ids.contains_key(&name) {
                        ids.insert(name.clone(), next);
                        o.insert(Arc::from(name.as_str()), next);
                        next += 1;
                    }
                } else if ids.remove(&name).is_some() {
                    o.remove(&name);
                }
                let labels: Vec<u64> = ids.values().map(|&id| o.label(id)).collect();
                prop_assert!(labels.windows(2).all(|w| w[0] < w[1]));
            }
        }
    }
}

//! The default ranking's per-lookup working set (`routing.rs`): the live
//! fleet of a (tenant, model) gathered by replica id without sorting, and
//! each member's estimate, in per-thread buffers a lookup reuses.
//!
//! Replica ids are small and dense (`replica_table.rs`), so membership is a
//! bitset and per-replica facts (pressure, the position of a match) are
//! vectors indexed by id: adding a member is O(1), and reading the bitset
//! word by word yields the fleet in id order, the order the estimate's sums
//! have always run in (so its floating-point results are unchanged).

/// A fleet member while ranking.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cand {
    pub(crate) replica: u32,
    /// Position of its real run in the lookup's raws.
    pub(crate) raw: Option<usize>,
    pub(crate) tentative_tokens: i32,
    pub(crate) matched: i32,
    pub(crate) queued: f64,
    pub(crate) recent: f64,
    /// `recent` in fixed point (`load.rs`): the mean sums these.
    pub(crate) recent_raw: u64,
    pub(crate) pressure: f32,
    /// Reported KV cache usage, [0, 1]; NaN: none reported.
    pub(crate) usage: f32,
    pub(crate) work: f64,
    pub(crate) est: f64,
}

/// Per-thread buffers of one default-ranking lookup.
#[derive(Default)]
pub(crate) struct Fleet {
    /// Members, one bit per replica id (cleared as they are taken).
    bits: Vec<u64>,
    /// Pressure per member (valid where the bit is set).
    pressure: Vec<f32>,
    /// Reported KV cache usage per member; NaN: none.
    usage: Vec<f32>,
    /// 1 + position of the replica's real run in the raws; 0: none.
    raw_of: Vec<u32>,
    /// The replica's tentative extension, tokens.
    ext_of: Vec<i32>,
    /// Members in id order, with their estimates.
    pub(crate) cands: Vec<Cand>,
    /// (name order label, replica id, position in `cands`) of the tie.
    pub(crate) tied: Vec<(u64, u32, usize)>,
}

impl Fleet {
    fn grow(&mut self, id: u32) {
        let i = id as usize;
        if self.pressure.len() <= i {
            let n = (i + 1).next_power_of_two();
            self.pressure.resize(n, 0.0);
            self.usage.resize(n, f32::NAN);
            self.raw_of.resize(n, 0);
            self.ext_of.resize(n, 0);
            self.bits.resize(n.div_ceil(64), 0);
        }
    }

    /// Adds `id` with `pressure`; a replica added twice keeps the larger
    /// (in `total_cmp` order, as the first version's sort-and-dedup did).
    pub(crate) fn add(&mut self, id: u32, pressure: f32) {
        self.grow(id);
        let (w, b) = (id as usize / 64, 1u64 << (id % 64));
        let p = &mut self.pressure[id as usize];
        if self.bits[w] & b == 0 {
            self.bits[w] |= b;
            *p = pressure;
        } else if pressure.total_cmp(p).is_gt() {
            *p = pressure;
        }
    }

    /// Notes a member's reported KV cache usage.
    pub(crate) fn set_usage(&mut self, id: u32, usage: f32) {
        self.grow(id);
        self.usage[id as usize] = usage;
    }

    /// Notes the lookup's matches (first run per replica wins) and
    /// tentative extensions; [`Fleet::take`] clears them.
    pub(crate) fn note_matches(
        &mut self,
        raws: impl Iterator<Item = u32>,
        tentative: &[(u32, i32)],
    ) {
        for (i, r) in raws.enumerate() {
            self.add(r, 0.0);
            let at = &mut self.raw_of[r as usize];
            if *at == 0 {
                *at = i as u32 + 1;
            }
        }
        for &(r, tokens) in tentative {
            self.add(r, 0.0);
            let at = &mut self.ext_of[r as usize];
            if *at == 0 {
                *at = tokens;
            }
        }
    }

    /// Every member in id order as (id, pressure, KV usage, raw position,
    /// tentative tokens), clearing the buffers for the next lookup.
    pub(crate) fn take(&mut self, mut each: impl FnMut(u32, f32, f32, Option<usize>, i32)) {
        for w in 0..self.bits.len() {
            let mut word = std::mem::take(&mut self.bits[w]);
            while word != 0 {
                let id = (w * 64) as u32 + word.trailing_zeros();
                word &= word - 1;
                let i = id as usize;
                let raw = std::mem::take(&mut self.raw_of[i]);
                let ext = std::mem::take(&mut self.ext_of[i]);
                let usage = std::mem::replace(&mut self.usage[i], f32::NAN);
                each(
                    id,
                    self.pressure[i],
                    usage,
                    raw.checked_sub(1).map(|x| x as usize),
                    ext,
                );
            }
        }
    }
}

/// The tie's room rule: a reported KV cache usage in 5 % steps (fuller
/// replicas lose the tie; within a step the seed spreads); `None`: none
/// reported (such replicas lose the tie to any that report).
pub(crate) fn room_bucket(usage: f32) -> Option<i32> {
    usage
        .is_finite()
        .then(|| (usage.clamp(0.0, 1.0) * 20.0).floor() as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_come_out_in_id_order_with_the_larger_pressure_and_are_cleared() {
        let mut f = Fleet::default();
        f.add(70, 0.5);
        f.add(3, -1.0);
        f.add(3, 0.0);
        f.add(70, 0.25);
        f.note_matches(std::iter::empty(), &[(9, 32), (9, 16)]);
        let mut got = Vec::new();
        f.take(|id, p, _, raw, ext| got.push((id, p, raw, ext)));
        assert_eq!(
            got,
            vec![(3, 0.0, None, 0), (9, 0.0, None, 32), (70, 0.5, None, 0)]
        );
        let mut again = 0;
        f.take(|_, _, _, _, _| again += 1);
        assert_eq!(again, 0);
    }
}

//! A run's per-block token counts: a line (first count, step per block)
//! while the blocks agree, which a chain of equal-sized blocks always does,
//! else one count per block. Eight bytes a run instead of four a block.

/// The counts of a run's blocks (their number is the run's).
#[derive(Default, Debug)]
pub(super) struct Toks {
    first: i32,
    step: i32,
    /// Every block's count, once one left the line (else empty).
    list: Vec<i32>,
}

impl Toks {
    /// The counts of a run of one block.
    pub(super) fn one(t: i32) -> Self {
        Self {
            first: t,
            step: 0,
            list: Vec::new(),
        }
    }

    /// The count of block `off`.
    #[inline]
    pub(super) fn get(&self, off: usize) -> i32 {
        if self.list.is_empty() {
            self.first.wrapping_add(self.step.wrapping_mul(off as i32))
        } else {
            self.list.get(off).copied().unwrap_or(0)
        }
    }

    /// Block `n` (the run had `n` blocks) counts `t`.
    pub(super) fn push(&mut self, t: i32, n: usize) {
        if !self.list.is_empty() {
            self.list.push(t);
        } else if n == 1 {
            self.step = t.wrapping_sub(self.first);
        } else if t != self.get(n) {
            self.list = (0..n).map(|i| self.get(i)).collect();
            self.list.push(t);
        }
    }

    /// The run keeps its first `n` blocks.
    pub(super) fn truncate(&mut self, n: usize) {
        self.list.truncate(n);
    }
}

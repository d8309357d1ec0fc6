//! A run's per-block token counts: a line (first count, step per block)
//! while the blocks agree, which a chain of equal-sized blocks always does,
//! else one count per block. Sixteen bytes a run instead of four a block:
//! the list, rare, sits behind a thin box so that a run's header fits a
//! line (`Run`).

/// The counts of a run's blocks (their number is the run's).
#[derive(Default, Debug)]
pub(super) struct Toks {
    first: i32,
    step: i32,
    /// Every block's count, once one left the line. Boxed for a thin
    /// (8-byte) field: the extra allocation is paid by the rare run whose
    /// blocks differ, the 16 bytes a `Vec` would add by every run.
    #[allow(clippy::box_collection)]
    list: Option<Box<Vec<i32>>>,
}

impl Toks {
    /// The counts of a run of one block.
    pub(super) fn one(t: i32) -> Self {
        Self {
            first: t,
            step: 0,
            list: None,
        }
    }

    /// The count of block `off`.
    #[inline]
    pub(super) fn get(&self, off: usize) -> i32 {
        match &self.list {
            None => self.first.wrapping_add(self.step.wrapping_mul(off as i32)),
            Some(l) => l.get(off).copied().unwrap_or(0),
        }
    }

    /// Block `n` (the run had `n` blocks) counts `t`.
    pub(super) fn push(&mut self, t: i32, n: usize) {
        if let Some(l) = &mut self.list {
            l.push(t);
        } else if n == 1 {
            self.step = t.wrapping_sub(self.first);
        } else if t != self.get(n) {
            let mut l: Vec<i32> = (0..n).map(|i| self.get(i)).collect();
            l.push(t);
            self.list = Some(Box::new(l));
        }
    }

    /// The run keeps its first `n` blocks.
    pub(super) fn truncate(&mut self, n: usize) {
        if let Some(l) = &mut self.list {
            l.truncate(n);
        }
    }
}

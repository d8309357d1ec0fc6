//! Recycled answer buffers: the `Vec<ScoreById>` a lookup answers with,
//! taken from the thread's pool and given back by whoever is done with the
//! answer (`serve` after encoding it: [`recycle_scores`]).
//!
//! Why: at 64 replicas an answer's scores are 64 x 20 bytes, over glibc's
//! per-thread cache (1,032 bytes), so every answer's `malloc` and `free`
//! took the arena's slow path, ~5 % of a LookupRoute's server CPU (issue
//! 36, session 44's profile). A caller that never gives buffers back (the
//! simulator, the gateway's embedded index, tests) only finds the pool
//! empty and allocates as before.

use crate::ScoreById;
use std::cell::RefCell;

/// Buffers a thread keeps.
const KEEP: usize = 8;
/// The largest buffer kept (scores): a rare huge fleet's answer is freed.
const KEEP_SCORES: usize = 4096;

thread_local! {
    static POOL: RefCell<Vec<Vec<ScoreById>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer for at least `n` scores, from the thread's pool when it
/// has one.
pub(crate) fn take(n: usize) -> Vec<ScoreById> {
    let mut v = POOL
        .try_with(|p| p.try_borrow_mut().ok().and_then(|mut p| p.pop()))
        .ok()
        .flatten()
        .unwrap_or_default();
    v.reserve(n);
    v
}

/// Gives an answer's scores back to the thread's pool for the next lookup
/// (emptied; kept up to a few buffers of a bounded size, freed otherwise).
pub fn recycle_scores(mut scores: Vec<ScoreById>) {
    let cap = scores.capacity();
    if cap == 0 || cap > KEEP_SCORES {
        return;
    }
    scores.clear();
    let _ = POOL.try_with(|p| {
        if let Ok(mut p) = p.try_borrow_mut()
            && p.len() < KEEP
        {
            p.push(scores);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_back_buffer_is_the_next_one_taken() {
        let mut v = take(64);
        let ptr = v.as_ptr();
        v.push(ScoreById {
            replica: crate::ReplicaId::listed(1),
            score: 1.0,
            matched_tokens: 16,
            estimated_cache_hit_prob: 1.0,
            tier: crate::Tier::T1,
        });
        recycle_scores(v);
        let w = take(8);
        assert!(w.is_empty());
        assert_eq!(w.as_ptr(), ptr);
    }

    #[test]
    fn a_huge_buffer_is_not_kept() {
        recycle_scores(Vec::with_capacity(KEEP_SCORES + 1));
        assert!(take(1).capacity() <= KEEP_SCORES);
    }
}

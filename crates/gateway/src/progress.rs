//! What is left of an engine's prefills: the pick's queue term priced by
//! progress, not by what was sent.
//!
//! The gateway counts each request's uncached prompt tokens from dispatch
//! to its first output byte ([`crate::engine::Engine::pending_prefill`]).
//! Charged whole, a prefill that started 400 ms ago and is nearly done
//! costs a newcomer as much as one sent a moment ago, and at 4 clients the
//! opening's new system prompts queued behind the wrong one (session 44).
//! The gateway knows when it forwarded each request and, from the stream,
//! when its first token came, so it can price what is left:
//!
//! * the engine works through its prefills in arrival order (vLLM's
//!   scheduler is first come, first served); the oldest started when it was
//!   sent or when the previous large prefill's first token came, whichever
//!   is later;
//! * its rate, prompt tokens per second, is learned from the prefills that
//!   were the oldest when their first token came (span: that start to the
//!   first token; at least [`MIN_SAMPLE_TOKENS`], so a cache hit's fixed
//!   costs do not pass for a rate, and [`MIN_SAMPLE_SPAN`]); the span includes the engine's API
//!   server and any decode beside it, so the rate errs slow;
//! * the oldest is credited `rate x elapsed`, never its last block (it is
//!   not done until its first token says so); the others count whole.
//!
//! With no rate learned yet (the first large prefill has not answered) the
//! tokens count whole, as before.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Fewest uncached tokens a prefill needs to teach the rate or to mark a
/// start for the next (two blocks of 64: a cache hit's question is less).
pub const MIN_SAMPLE_TOKENS: u64 = 128;

/// Shortest span that teaches the rate: a first token sooner than this
/// after the prefill started measured no prefill (a test's instant answer,
/// or a clock step), and its rate would credit every later prefill whole.
pub const MIN_SAMPLE_SPAN: Duration = Duration::from_millis(1);

/// Weight of a new rate sample (an exponential average: the engines' speed
/// moves with what else runs on the host).
const RATE_ALPHA: f64 = 0.5;

/// One engine's prefills in flight.
#[derive(Debug, Default)]
pub struct Progress {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// (request, uncached tokens, sent at), oldest first.
    queue: VecDeque<(u64, u64, Instant)>,
    /// The last large prefill's first token.
    last_done: Option<Instant>,
    /// Prompt tokens per second.
    rate: Option<f64>,
}

impl Inner {
    fn head_start(&self) -> Option<Instant> {
        let (_, _, sent) = self.queue.front()?;
        Some(self.last_done.map_or(*sent, |d| d.max(*sent)))
    }
}

impl Progress {
    /// Request `id` with `tokens` uncached prompt tokens was sent at `at`.
    pub fn dispatched(&self, id: u64, tokens: u64, at: Instant) {
        if tokens == 0 {
            return;
        }
        if let Ok(mut i) = self.inner.lock() {
            i.queue.push_back((id, tokens, at));
        }
    }

    /// Request `id`'s first token came at `at`.
    pub fn first_token(&self, id: u64, at: Instant) {
        let Ok(mut i) = self.inner.lock() else {
            return;
        };
        let Some(k) = i.queue.iter().position(|(r, _, _)| *r == id) else {
            return;
        };
        let start = i.head_start();
        let Some((_, tokens, _)) = i.queue.remove(k) else {
            return;
        };
        if tokens < MIN_SAMPLE_TOKENS {
            return;
        }
        if k == 0 {
            if let Some(start) = start {
                let span = at.saturating_duration_since(start);
                if span >= MIN_SAMPLE_SPAN {
                    let span = span.as_secs_f64();
                    #[allow(clippy::cast_precision_loss)]
                    let sample = tokens as f64 / span;
                    i.rate = Some(
                        i.rate
                            .map_or(sample, |r| r * (1.0 - RATE_ALPHA) + sample * RATE_ALPHA),
                    );
                }
            }
        }
        i.last_done = Some(i.last_done.map_or(at, |d| d.max(at)));
    }

    /// Request `id` ended without a first token (failed, abandoned).
    pub fn abandoned(&self, id: u64) {
        if let Ok(mut i) = self.inner.lock() {
            i.queue.retain(|(r, _, _)| *r != id);
        }
    }

    /// Uncached tokens the engine still has to prefill at `at`, by the
    /// learned rate (whole blocks of `block` tokens are kept back of the
    /// oldest: it is done only when its first token comes).
    pub fn left(&self, at: Instant, block: u64) -> u64 {
        let Ok(i) = self.inner.lock() else {
            return 0;
        };
        let total: u64 = i.queue.iter().map(|(_, t, _)| t).sum();
        let (Some(rate), Some(start), Some((_, head, _))) =
            (i.rate, i.head_start(), i.queue.front())
        else {
            return total;
        };
        let elapsed = at.saturating_duration_since(start).as_secs_f64();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let done = (rate * elapsed) as u64;
        total - done.min(head.saturating_sub(block.max(1)))
    }

    /// The learned rate, prompt tokens per second (`None`: not yet).
    pub fn rate(&self) -> Option<f64> {
        self.inner.lock().ok().and_then(|i| i.rate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(t0: Instant, n: u64) -> Instant {
        t0 + Duration::from_millis(n)
    }

    #[test]
    fn whole_until_a_rate_is_learned_then_the_oldest_is_credited() {
        let p = Progress::default();
        let t0 = Instant::now();
        p.dispatched(1, 1600, t0);
        p.dispatched(2, 1600, ms(t0, 10));
        // No rate yet: everything counts.
        assert_eq!(p.left(ms(t0, 100), 32), 3200);
        // The first took 200 ms alone: 8,000 tokens/s.
        p.first_token(1, ms(t0, 200));
        assert_eq!(p.rate().map(|r| r.round()), Some(8000.0));
        // The second started when the first answered: 100 ms in, 800 done.
        assert_eq!(p.left(ms(t0, 300), 32), 800);
        // Never past its last block while it has not answered.
        assert_eq!(p.left(ms(t0, 900), 32), 32);
        p.dispatched(3, 1600, ms(t0, 350));
        assert_eq!(p.left(ms(t0, 900), 32), 32 + 1600);
        p.first_token(2, ms(t0, 400));
        // 1,600 in 200 ms again.
        assert_eq!(p.rate().map(|r| r.round()), Some(8000.0));
        // The third started at 400 ms.
        assert_eq!(p.left(ms(t0, 500), 32), 800);
        p.abandoned(3);
        assert_eq!(p.left(ms(t0, 500), 32), 0);
    }

    #[test]
    fn a_cache_hit_teaches_no_rate_and_marks_no_start() {
        let p = Progress::default();
        let t0 = Instant::now();
        p.dispatched(1, 40, t0);
        p.first_token(1, ms(t0, 50));
        assert_eq!(p.rate(), None);
        // A large prefill and a hit beside it: the hit answers first; the
        // large one's start stays its dispatch.
        p.dispatched(2, 1600, ms(t0, 100));
        p.dispatched(3, 40, ms(t0, 110));
        p.first_token(3, ms(t0, 150));
        p.first_token(2, ms(t0, 300));
        assert_eq!(p.rate().map(|r| r.round()), Some(8000.0));
        // Out of order (not the oldest when it answered): no sample.
        p.dispatched(4, 1600, ms(t0, 400));
        p.dispatched(5, 1600, ms(t0, 400));
        p.first_token(5, ms(t0, 450));
        assert_eq!(p.rate().map(|r| r.round()), Some(8000.0));
        // An answer within a millisecond measured nothing.
        let q = Progress::default();
        q.dispatched(1, 1600, t0);
        q.first_token(1, t0 + Duration::from_micros(10));
        assert_eq!(q.rate(), None);
    }
}

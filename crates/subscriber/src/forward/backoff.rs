//! Exponential backoff with jitter for server reconnects, so a fleet of
//! sidecars does not reconnect in lockstep after a server restart.

use std::time::Duration;

/// Doubling delays between `initial` and `max`, each drawn from
/// `[d/2, d]` ("equal jitter").
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    current: Duration,
    rng: u64,
}

impl Backoff {
    /// A backoff starting at `initial`, capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9E37_79B9_7F4A_7C15, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
        Self {
            initial,
            max: max.max(initial),
            current: initial,
            rng: seed | 1,
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        // xorshift64: jitter only, not security.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let frac = 0.5 + (self.rng >> 11) as f64 / (1u64 << 53) as f64 * 0.5;
        let d = self.current.mul_f64(frac);
        self.current = (self.current * 2).min(self.max);
        d
    }

    /// Back to `initial` after a success.
    pub fn reset(&mut self) {
        self.current = self.initial;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_with_jitter_up_to_the_cap_and_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(800));
        let caps = [100, 200, 400, 800, 800, 800];
        for cap in caps {
            let d = b.next_delay();
            assert!(d <= Duration::from_millis(cap), "{d:?} > {cap}");
            assert!(d >= Duration::from_millis(cap / 2), "{d:?} < {cap}/2");
        }
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}

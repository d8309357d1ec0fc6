//! Time source. Every timestamp inside the index is Unix nanoseconds (`i64`).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of "now" in Unix nanoseconds. Injected so every test is deterministic.
pub trait Clock: Send + Sync {
    /// Current time in Unix nanoseconds.
    fn now_ns(&self) -> i64;
}

/// The wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ns(&self) -> i64 {
        match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
        }
    }
}

/// A manually driven clock for tests and simulations.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicI64,
}

impl ManualClock {
    /// A clock reading `start_ns`.
    pub fn new(start_ns: i64) -> Self {
        Self {
            now: AtomicI64::new(start_ns),
        }
    }

    /// Set the current time.
    pub fn set_ns(&self, now_ns: i64) {
        self.now.store(now_ns, Ordering::SeqCst);
    }

    /// Move the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.now.fetch_add(duration_ns(d), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> i64 {
        self.now.load(Ordering::SeqCst)
    }
}

/// A `Duration` as saturating `i64` nanoseconds.
pub fn duration_ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// Wire timestamp (Unix µs, 0 = "now") to index nanoseconds.
pub fn wire_us_to_ns(timestamp_us: i64, now_ns: i64) -> i64 {
    if timestamp_us == 0 {
        now_ns
    } else {
        timestamp_us.saturating_mul(1_000)
    }
}

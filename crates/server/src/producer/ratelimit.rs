//! Per-identity ingest limits: a token bucket of blocks (refilled at
//! `blocks_per_second`, holding at most `burst_blocks`) and a cap on open
//! `ReportCacheState` streams.
//!
//! A block is one index key an update writes or removes: each chain block,
//! the legacy `prefix_hash` of an entry, one event. An update is admitted
//! whole or not at all; a refused one gets the time after which it would
//! fit, sent to the client as `grpc-retry-pushback-ms`.

use std::time::{Duration, Instant};

/// Default blocks/s per identity: the ingest rate `bench grpc` runs beside
/// its lookups without moving their latency. One busy replica stores and
/// evicts ~2,500 blocks/s, and the whole Mooncake conversation trace peaks
/// at ~11,000 blocks/s over 10 s (docs/security.md), so this is 40 busy
/// replicas per namespace at full tilt, or 9× that trace's peak.
pub const DEFAULT_BLOCKS_PER_SECOND: u64 = 100_000;
/// Default bucket size: twice a sidecar's default `--max-tracked-blocks`
/// (262,144), so a full resync goes through in one burst (a larger one is
/// paced by the sidecar, chunk by chunk, as the hints say).
pub const DEFAULT_BURST_BLOCKS: u64 = 524_288;
/// Default open report streams per identity: one per sidecar rank group;
/// a namespace with more replicas than this raises the flag.
pub const DEFAULT_MAX_STREAMS: u32 = 512;
/// Longest pushback hint.
pub const MAX_PUSHBACK: Duration = Duration::from_secs(30);

/// Limits applied to every identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Refill rate of the block bucket; 0 = unlimited.
    pub blocks_per_second: u64,
    /// Bucket size (the largest burst).
    pub burst_blocks: u64,
    /// Open `ReportCacheState` streams at most; 0 = unlimited.
    pub max_streams: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            blocks_per_second: DEFAULT_BLOCKS_PER_SECOND,
            burst_blocks: DEFAULT_BURST_BLOCKS,
            max_streams: DEFAULT_MAX_STREAMS,
        }
    }
}

/// A token bucket of blocks. Starts full.
#[derive(Debug, Clone)]
pub struct Bucket {
    tokens: f64,
    last: Instant,
}

impl Bucket {
    /// A full bucket as of `now`.
    pub fn new(limits: &Limits, now: Instant) -> Self {
        Self {
            tokens: limits.burst_blocks as f64,
            last: now,
        }
    }

    /// Takes `n` blocks, or says how long until they would fit.
    pub fn take(&mut self, n: u64, limits: &Limits, now: Instant) -> Result<(), Duration> {
        if limits.blocks_per_second == 0 || n == 0 {
            return Ok(());
        }
        let rate = limits.blocks_per_second as f64;
        let cap = limits.burst_blocks.max(1) as f64;
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(cap);
        self.last = now;
        let need = n as f64;
        if need <= self.tokens {
            self.tokens -= need;
            return Ok(());
        }
        // More than a whole bucket never fits: hint one full refill.
        let missing = need.min(cap) - self.tokens;
        let wait = Duration::from_secs_f64((missing / rate).max(0.001));
        Err(wait.min(MAX_PUSHBACK))
    }
}

/// Blocks an update writes: one per chain block, plus its legacy hash (a
/// chain entry's `prefix_hash`, or the entry itself in legacy form). Stats
/// alone count one, so a stats flood is bounded too.
pub fn update_blocks(u: &inferencecache_proto::v1alpha1::CacheStateUpdate) -> u64 {
    let prefixes: u64 = u
        .prefixes
        .iter()
        .map(|p| {
            let chain = p.block_hashes.len().max(p.block_token_counts.len()) as u64;
            if chain == 0 {
                1
            } else {
                chain + u64::from(!p.prefix_hash.is_empty())
            }
        })
        .sum();
    prefixes.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        blocks_per_second: 1000,
        burst_blocks: 100,
        max_streams: 1,
    };

    #[test]
    fn bucket_admits_the_burst_then_the_rate() {
        let t0 = Instant::now();
        let mut b = Bucket::new(&L, t0);
        assert_eq!(b.take(60, &L, t0), Ok(()));
        assert_eq!(b.take(40, &L, t0), Ok(()));
        let wait = b.take(10, &L, t0).expect_err("empty");
        assert_eq!(wait, Duration::from_millis(10));
        // 10 ms later 10 blocks fit; nothing was taken by the refusal.
        assert_eq!(b.take(10, &L, t0 + Duration::from_millis(10)), Ok(()));
        // Refill is capped at the burst.
        let later = t0 + Duration::from_secs(60);
        assert_eq!(b.take(100, &L, later), Ok(()));
        assert!(b.take(1, &L, later).is_err());
    }

    #[test]
    fn oversized_updates_get_a_bounded_hint_and_zero_rate_is_unlimited() {
        let t0 = Instant::now();
        let mut b = Bucket::new(&L, t0);
        let wait = b
            .take(1_000_000, &L, t0)
            .expect_err("larger than the bucket");
        assert!(wait <= Duration::from_millis(100), "{wait:?}");
        let free = Limits {
            blocks_per_second: 0,
            ..L
        };
        assert_eq!(b.take(u64::MAX, &free, t0), Ok(()));
    }

    #[test]
    fn blocks_of_an_update() {
        use inferencecache_proto::v1alpha1::{CacheStateUpdate, PrefixEntry};
        let chain = PrefixEntry {
            block_hashes: vec![vec![1], vec![2], vec![3]],
            block_token_counts: vec![16, 16, 16],
            prefix_hash: vec![9],
            ..Default::default()
        };
        let legacy = PrefixEntry {
            prefix_hash: vec![7],
            ..Default::default()
        };
        let u = CacheStateUpdate {
            prefixes: vec![chain, legacy],
            ..Default::default()
        };
        assert_eq!(update_blocks(&u), 5);
        assert_eq!(update_blocks(&CacheStateUpdate::default()), 1);
    }
}

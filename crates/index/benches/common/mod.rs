//! What the index benches share: random block hashes and the criterion
//! settings.

use criterion::Criterion;
use std::time::Duration;

/// splitmix64 of (`seed`, `i`): uniformly random 64-bit block hashes like
/// the real fingerprint's.
pub(crate) fn splitmix(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(i);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 30 samples, 1 s warm-up, 3 s measurement: these machines are noisy and
/// a bench run is one of several in a session.
pub(crate) fn config() -> Criterion {
    Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

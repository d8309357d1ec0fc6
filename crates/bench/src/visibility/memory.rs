//! The sidecar's memory per tracked block: RSS growth while one rank's map
//! tracks a million blocks.

use inferencecache_subscriber::loopback::{Stored, stored_batch};
use inferencecache_subscriber::mapping::MappingConfig;
use inferencecache_subscriber::{Mapping, decode_batch};

use super::BLOCK;

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// RSS growth while one rank's map tracks 1,000,000 blocks (u64 hashes).
pub(super) fn memory_per_block() -> anyhow::Result<()> {
    const N: u64 = 1_000_000;
    let before = rss_bytes();
    let mut m = Mapping::new(MappingConfig {
        max_tracked_blocks: N as usize,
        ..MappingConfig::default()
    });
    let mut out = Vec::new();
    for i in 0..N / 64 {
        let events: Vec<Stored> = (0..16u64)
            .map(|e| {
                let base = i * 64 + e * 4;
                Stored {
                    hashes: (base..base + 4).map(|h| u64::MAX - h).collect(),
                    parent: None,
                    tokens: (base as u32 * BLOCK)..((base as u32 + 4) * BLOCK),
                }
            })
            .collect();
        let batch = decode_batch(&stored_batch(1.0, &events, BLOCK));
        out.clear();
        m.apply_all(&batch.events, &mut out);
    }
    let after = rss_bytes();
    anyhow::ensure!(m.tracked_blocks() == N as usize, "map did not fill");
    println!(
        "memory per tracked block: {} bytes (RSS +{:.1} MiB for {} blocks)",
        after.saturating_sub(before) / N,
        after.saturating_sub(before) as f64 / 1048576.0,
        N
    );
    Ok(())
}

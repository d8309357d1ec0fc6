//! AFFINITY_HINT picker (§2.6.7) and its seed helpers.

use crate::index::Index;
use crate::sync::read;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Big-endian u64 of the first 8 bytes of SHA-256(seed).
pub fn affinity_seed_value(seed: &[u8]) -> u64 {
    let d = Sha256::digest(seed);
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[..8]);
    u64::from_be_bytes(b)
}

/// Canonical chain seed: concatenation of `u32_be(len(hash)) ‖ hash`.
pub fn chain_seed<H: AsRef<[u8]>>(block_hashes: &[H]) -> Vec<u8> {
    let mut out = Vec::with_capacity(block_hashes.iter().map(|h| 4 + h.as_ref().len()).sum());
    for h in block_hashes {
        let h = h.as_ref();
        out.extend_from_slice(&(h.len() as u32).to_be_bytes());
        out.extend_from_slice(h);
    }
    out
}

/// Index into a sorted replica set of size `n` (`n > 0`).
pub fn affinity_index(seed: &[u8], n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    (affinity_seed_value(seed) % n as u64) as usize
}

/// The default ranking's tie (`routing.rs`, `cold.rs`): the k-th of `n`
/// tied replicas in name order, k = XXH3-64(seed) mod `n` (`n > 0`). Not
/// the AFFINITY_HINT rule's SHA-256: that rule is the reference's and
/// stays exact in [`Index::affinity_hint`]; the default ranking is ours,
/// and a SHA-256 of the chain seed (12 bytes a block) was 7 % of its
/// lookup (docs/decisions.md, issue 36, session 42). The pick stays a
/// function of the seed bytes alone (identical prompts co-locate, an idle
/// fleet is spread by the prompt).
pub(crate) fn tie_index(seed: &[u8], n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    (xxhash_rust::xxh3::xxh3_64(seed) % n as u64) as usize
}

impl Index {
    /// Deterministic pick among the replicas serving (tenant, model, scheme),
    /// sorted byte-wise: `SHA-256(seed)[0..8]` (BE u64) mod count. `None` if
    /// the seed or scheme is empty or nobody serves the scope.
    pub fn affinity_hint(
        &self,
        tenant: &str,
        model: &str,
        scheme: &str,
        seed: &[u8],
    ) -> Option<Arc<str>> {
        if seed.is_empty() || scheme.is_empty() {
            return None;
        }
        let scope = read(&self.store.catalog).find_scope(tenant, model, scheme)?;
        let ids: Vec<u32> = read(&self.store.counters)
            .scope(scope)?
            .replicas()
            .collect();
        if ids.is_empty() {
            return None;
        }
        let mut names: Vec<Arc<str>> = {
            let c = read(&self.store.catalog);
            ids.iter().map(|&r| c.replica_name(r)).collect()
        };
        names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        let i = affinity_index(seed, names.len());
        names.into_iter().nth(i)
    }
}

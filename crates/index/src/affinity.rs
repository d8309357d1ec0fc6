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
/// tied replicas in name order (`n > 0`), k from a hash of the seed's
/// length and its last [`TIE_TAIL`] bytes. Not the AFFINITY_HINT rule's
/// SHA-256: that rule is the reference's and stays exact in
/// [`Index::affinity_hint`]; the default ranking is ours. The pick stays a
/// function of the seed bytes alone (identical prompts co-locate, an idle
/// fleet is spread by the prompt). The tail identifies the prompt: a chain
/// seed ends with its last block's hash, which identifies the whole chain,
/// and an exact key is a hash; hashing the whole chain seed (12 bytes a
/// block) was 3-5 % of the default path, mostly reading the seed's lines
/// (docs/decisions.md, issue 36, sessions 45 and 46).
pub(crate) fn tie_index(seed: &[u8], n: usize) -> usize {
    if n <= 1 {
        return 0;
    }
    let tail = &seed[seed.len().saturating_sub(TIE_TAIL)..];
    let mut h = (seed.len() as u64).wrapping_mul(TIE_K1);
    for c in tail.chunks(8) {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        h = tie_mix(h ^ u64::from_le_bytes(w), TIE_K2);
    }
    let h = tie_mix(h ^ (h >> 32), TIE_K1);
    // The hash's high bits scaled to `n` (no division).
    ((u128::from(h) * n as u128) >> 64) as usize
}

/// Bytes of the seed's end the tie hashes.
const TIE_TAIL: usize = 32;
const TIE_K1: u64 = 0x9E37_79B9_7F4A_7C15;
const TIE_K2: u64 = 0xD6E8_FEB8_6659_FD93;

/// A folded 64x64 -> 128-bit multiply: every input bit reaches the high
/// bits.
fn tie_mix(a: u64, b: u64) -> u64 {
    let m = u128::from(a) * u128::from(b);
    (m as u64) ^ ((m >> 64) as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Pearson's statistic of `counts` against a uniform spread.
    fn chi2(counts: &[u64]) -> f64 {
        let total: u64 = counts.iter().sum();
        let e = total as f64 / counts.len() as f64;
        counts.iter().map(|&c| (c as f64 - e).powi(2) / e).sum()
    }

    /// A bound the statistic stays under for a uniform spread (about
    /// p = 1e-4 for `n - 1` degrees of freedom).
    fn bound(n: usize) -> f64 {
        let df = (n - 1) as f64;
        df + 6.0 * (2.0 * df).sqrt() + 12.0
    }

    fn mix(x: u64) -> u64 {
        tie_mix(x ^ 0x1234_5678, TIE_K1)
    }

    #[test]
    fn ties_spread_evenly_over_chains_turns_and_keys() {
        for n in [2usize, 3, 5, 7, 16, 33, 64] {
            let mut kinds: Vec<(&str, Vec<u64>)> = Vec::new();
            // Random chains of 1 to 40 blocks.
            let mut c = vec![0u64; n];
            for i in 0..20_000u64 {
                let blocks: Vec<u64> = (0..1 + i % 40).map(|b| mix(i * 64 + b)).collect();
                c[tie_index(
                    &chain_seed(&blocks.iter().map(|b| b.to_be_bytes()).collect::<Vec<_>>()),
                    n,
                )] += 1;
            }
            kinds.push(("random chains", c));
            // A conversation's turns: each chain one block longer.
            let mut c = vec![0u64; n];
            let blocks: Vec<[u8; 8]> = (0..20_000u64).map(|b| mix(b).to_be_bytes()).collect();
            for len in 1..=blocks.len() {
                c[tie_index(&chain_seed(&blocks[..len]), n)] += 1;
            }
            kinds.push(("turns", c));
            // Short exact keys and plain counters.
            let mut c = vec![0u64; n];
            let mut d = vec![0u64; n];
            for i in 0..20_000u64 {
                c[tie_index(&mix(i).to_be_bytes(), n)] += 1;
                d[tie_index(&i.to_le_bytes(), n)] += 1;
            }
            kinds.push(("keys", c));
            kinds.push(("counters", d));
            for (kind, counts) in kinds {
                assert!(chi2(&counts) < bound(n), "{kind} n={n}: {counts:?}");
            }
        }
    }

    #[test]
    fn a_tie_is_a_function_of_the_seed() {
        let seed = chain_seed(&[[1u8; 8], [2; 8], [3; 8], [4; 8]]);
        assert_eq!(tie_index(&seed, 7), tie_index(&seed.clone(), 7));
        assert_eq!(tie_index(&seed, 1), 0);
        assert!(tie_index(&[], 5) < 5);
    }
}

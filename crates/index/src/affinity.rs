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
/// tied replicas in name order, k = [`tie_hash`]`(seed)` scaled to `n`
/// (`n > 0`). Not the AFFINITY_HINT rule's SHA-256: that rule is the
/// reference's and stays exact in [`Index::affinity_hint`]; the default
/// ranking is ours, and a SHA-256 of the chain seed (12 bytes a block) was
/// 7 % of its lookup (docs/decisions.md, issue 36, session 42), an XXH3 of
/// it still 4-5 % (session 44). The pick stays a function of the seed
/// bytes alone (identical prompts co-locate, an idle fleet is spread by the
/// prompt).
pub(crate) fn tie_index(seed: &[u8], n: usize) -> usize {
    if n == 0 {
        return 0;
    }
    // Multiply-shift: the hash's high bits scaled to n (as even as a
    // modulo, without the division).
    ((u128::from(tie_hash(seed)) * n as u128) >> 64) as usize
}

/// The tie's hash of a seed, O(1) in its length: the seed's length and
/// its last 32 bytes (all of a seed up to 32 bytes), mixed by two 64x64 ->
/// 128-bit multiplies (wyhash's folded multiply).
///
/// Why the end is enough: the default ranking's seed is the chain seed
/// (`u32_be(len) || hash` per block) or, without a chain, the exact key (a
/// hash, at most a few dozen bytes). A chain's block hashes are chained,
/// each identifies its whole prefix, so the last 12 bytes (the last block's
/// length and hash) already tell two chains apart wherever they differ;
/// hashing the rest too (XXH3 of ~12 bytes a block) cost 4-5 % of the
/// default lookup for no spread, most of it reading the seed's lines. The
/// spread is tested (`the_tie_spreads_chain_seeds_evenly`): chains that
/// differ in one block, conversation turns that extend one another, and
/// random short keys.
pub(crate) fn tie_hash(seed: &[u8]) -> u64 {
    const P0: u64 = 0xa076_1d64_78bd_642f;
    const P1: u64 = 0xe703_7ed1_a0b4_28db;
    const P2: u64 = 0x8ebc_6af0_9c88_c6e3;
    const P3: u64 = 0x5899_65cc_7537_4cc3;
    let fold = |a: u64, b: u64| {
        let m = u128::from(a) * u128::from(b);
        (m as u64) ^ ((m >> 64) as u64)
    };
    // The 8 bytes at `at` of the last 32 (little-endian, zero-padded when
    // the seed is shorter).
    let len = seed.len();
    let tail = &seed[len.saturating_sub(32)..];
    let word = |at: usize| {
        let mut b = [0u8; 8];
        let end = tail.len().min(at + 8);
        if at < end {
            b[..end - at].copy_from_slice(&tail[at..end]);
        }
        u64::from_le_bytes(b)
    };
    let a = fold(word(0) ^ P0, word(8) ^ P1);
    let b = fold(word(16) ^ P2, word(24) ^ (len as u64) ^ P3);
    fold(a ^ P1, b ^ P0)
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

    /// A deterministic stream of 64-bit values (splitmix64).
    fn stream(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
    }

    /// Pearson's statistic of `seeds` dealt into `n` ties must stay within
    /// what a uniform pick gives (mean n - 1, sd sqrt(2 (n - 1))): six
    /// standard deviations, so the test is deterministic and not flaky.
    fn assert_even(what: &str, seeds: &[Vec<u8>]) {
        for n in [2usize, 3, 5, 7, 16, 31, 64] {
            let mut counts = vec![0f64; n];
            for s in seeds {
                let k = tie_index(s, n);
                assert!(k < n);
                counts[k] += 1.0;
            }
            let e = seeds.len() as f64 / n as f64;
            let chi: f64 = counts.iter().map(|c| (c - e) * (c - e) / e).sum();
            let df = (n - 1) as f64;
            assert!(
                chi < df + 6.0 * (2.0 * df).sqrt(),
                "{what}: n {n}, chi-square {chi:.1} (df {df}), counts {counts:?}"
            );
        }
    }

    fn chain(hashes: &[u64]) -> Vec<u8> {
        chain_seed(&hashes.iter().map(|h| h.to_be_bytes()).collect::<Vec<_>>())
    }

    #[test]
    fn the_tie_spreads_chain_seeds_evenly() {
        let mut next = stream(7);
        // Random chains of 1..64 blocks.
        let random: Vec<Vec<u8>> = (0..20_000)
            .map(|_| {
                let len = 1 + (next() % 64) as usize;
                chain(&(0..len).map(|_| next()).collect::<Vec<_>>())
            })
            .collect();
        assert_even("random chains", &random);
        // Conversations: each turn extends the one before by 1-4 blocks.
        let mut turns = Vec::new();
        for _ in 0..2_000 {
            let mut c: Vec<u64> = (0..1 + next() % 8).map(|_| next()).collect();
            for _ in 0..10 {
                c.extend((0..1 + next() % 4).map(|_| next()));
                turns.push(chain(&c));
            }
        }
        assert_even("conversation turns", &turns);
        // One shared prefix of 40 blocks, a different last block each.
        let shared: Vec<u64> = (0..40).map(|_| next()).collect();
        let last: Vec<Vec<u8>> = (0..20_000)
            .map(|_| {
                let mut c = shared.clone();
                c.push(next());
                chain(&c)
            })
            .collect();
        assert_even("one block apart", &last);
        // Exact keys (no chain): 8-32 random bytes, and small counters.
        let keys: Vec<Vec<u8>> = (0..20_000)
            .map(|_| {
                let len = 8 + (next() % 25) as usize;
                (0..len).map(|_| next() as u8).collect()
            })
            .collect();
        assert_even("exact keys", &keys);
        let counters: Vec<Vec<u8>> = (0..20_000u64).map(|i| i.to_be_bytes().to_vec()).collect();
        assert_even("counters", &counters);
    }

    #[test]
    fn the_tie_reads_every_byte_of_a_short_seed_and_the_end_of_a_long_one() {
        let base: Vec<u8> = (0..32u8).collect();
        for i in 0..base.len() {
            let mut s = base.clone();
            s[i] ^= 1;
            assert_ne!(tie_hash(&s), tie_hash(&base), "byte {i}");
        }
        // A chain's last block (its hash identifies the whole chain).
        let a = chain(&[1, 2, 3, 4, 5]);
        let b = chain(&[1, 2, 3, 4, 6]);
        assert_ne!(tie_hash(&a), tie_hash(&b));
        assert_ne!(tie_hash(&a), tie_hash(&chain(&[1, 2, 3, 4])));
        assert_eq!(tie_index(&a, 1), 0);
        assert_eq!(tie_index(&a, 0), 0);
    }
}

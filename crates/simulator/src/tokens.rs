//! Turns trace block ids into token ids and content fingerprints.
//!
//! The trace carries no text: each hash id stands for one block of
//! `block_size` tokens. The simulator expands an id into a fixed pseudo-random
//! token sequence (SplitMix64 seeded by `--seed` and the id), so equal ids give
//! equal tokens and therefore equal fingerprints on every side: the engine's
//! events, the subscriber mapping, the gateway and the oracle.

use crate::trace::TraceRequest;
use inferencecache_fingerprint::{chain_step, content_hash};
use std::collections::HashMap;

/// Token ids are drawn below this (a Llama-3-sized vocabulary).
pub const VOCAB: u32 = 128_000;

/// Expands block ids into tokens, deterministically for a seed.
#[derive(Debug, Clone)]
pub struct BlockTokens {
    seed: u64,
    block_size: usize,
    content: HashMap<u64, u64>,
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl BlockTokens {
    /// A generator for `block_size`-token blocks.
    pub fn new(seed: u64, block_size: usize) -> Self {
        Self {
            seed,
            block_size,
            content: HashMap::new(),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Appends the tokens of block `id` to `out`.
    pub fn extend_block(&self, id: u64, out: &mut Vec<u32>) {
        let mut state = self.seed ^ id.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        out.extend((0..self.block_size).map(|_| (splitmix(&mut state) % u64::from(VOCAB)) as u32));
    }

    /// The prompt's token ids: the blocks of `hash_ids` concatenated and cut
    /// to `input_length` (the last trace block is usually partial).
    pub fn prompt(&self, req: &TraceRequest) -> Vec<u32> {
        let n = (req.input_length as usize).min(req.hash_ids.len() * self.block_size);
        let mut out = Vec::with_capacity(n + self.block_size);
        for &id in &req.hash_ids {
            if out.len() >= n {
                break;
            }
            self.extend_block(id, &mut out);
        }
        out.truncate(n);
        out
    }

    /// Number of full blocks of a prompt: only those are cached and hashed.
    pub fn full_blocks(&self, req: &TraceRequest) -> usize {
        (req.input_length as usize / self.block_size).min(req.hash_ids.len())
    }

    /// Positional prefix hashes (the shared fingerprint) of the full blocks.
    pub fn prefix_hashes(&mut self, req: &TraceRequest) -> Vec<u64> {
        let n = self.full_blocks(req);
        let mut out = Vec::with_capacity(n);
        let mut previous = None;
        let mut buf = Vec::with_capacity(self.block_size);
        for &id in &req.hash_ids[..n] {
            let content = match self.content.get(&id) {
                Some(c) => *c,
                None => {
                    buf.clear();
                    self.extend_block(id, &mut buf);
                    let c = content_hash(&buf);
                    self.content.insert(id, c);
                    c
                }
            };
            let prefix = previous.map_or(content, |p| chain_step(p, content));
            out.push(prefix);
            previous = Some(prefix);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn req(input: u32, ids: &[u64]) -> TraceRequest {
        TraceRequest {
            timestamp: 0,
            input_length: input,
            output_length: 1,
            hash_ids: ids.to_vec(),
        }
    }

    #[test]
    fn prefix_hashes_match_the_gateway_fingerprint() {
        let mut t = BlockTokens::new(7, 16);
        let r = req(40, &[3, 9, 4]);
        let tokens = t.prompt(&r);
        assert_eq!(tokens.len(), 40);
        let chain = inferencecache_fingerprint::chain(&tokens, 16);
        let ours: Vec<_> = t
            .prefix_hashes(&r)
            .into_iter()
            .map(inferencecache_fingerprint::to_wire)
            .collect();
        assert_eq!(ours, chain.block_hashes);
        assert_eq!(ours.len(), 2);
    }

    #[test]
    fn equal_ids_equal_tokens_and_seed_matters() {
        let (a, b) = (BlockTokens::new(1, 8), BlockTokens::new(2, 8));
        let (mut x, mut y, mut z) = (vec![], vec![], vec![]);
        a.extend_block(5, &mut x);
        a.extend_block(5, &mut y);
        b.extend_block(5, &mut z);
        assert_eq!(x, y);
        assert_ne!(x, z);
        assert!(x.iter().all(|&t| t < VOCAB));
    }
}

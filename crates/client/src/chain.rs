//! Client-side fingerprinting: the same content hash the subscriber ingests,
//! for gateways that prefer to send a chain rather than token ids.

/// Default tokens per KV block (vLLM's default, and the server's
/// `--engine-block-size` default). Must match the engines.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// Fingerprints `token_ids` into `(block_hashes, block_token_counts)`, the
/// parallel arrays of `LookupRouteRequest` / `PrefixEntry`. A partial
/// trailing block is dropped (engines cache only full blocks), so fewer than
/// `block_size` tokens give empty arrays.
pub fn block_hashes(token_ids: &[u32], block_size: usize) -> (Vec<Vec<u8>>, Vec<i32>) {
    block_hashes_salted(token_ids, block_size, "")
}

/// As [`block_hashes`] for a request carrying a `cache_salt` (our
/// extension): the salt is folded into the first block as the engine does,
/// so the chain matches only blocks stored under the same salt. `""` is no
/// salt.
pub fn block_hashes_salted(
    token_ids: &[u32],
    block_size: usize,
    salt: &str,
) -> (Vec<Vec<u8>>, Vec<i32>) {
    let chain = inferencecache_fingerprint::chain_salted(token_ids, block_size, salt);
    let hashes = chain.block_hashes.iter().map(|h| h.to_vec()).collect();
    (hashes, chain.block_token_counts)
}

//! The content fingerprint that engine sidecars and gateways must agree on byte
//! for byte.
//!
//! A prompt is cut into blocks of `block_size` tokens (a partial tail is
//! dropped). Each block gets a content hash, XXH3-64 with seed 1337 over the
//! little-endian `u32` token ids. Content hashes are chained into positional
//! prefix hashes, so `prefix[i]` identifies blocks `0..=i` together:
//!
//! - `prefix[0] = content[0]`, or `XXH3(le_u64(parent) ‖ le_u64(content[0]))`
//!   when the chain continues a parent prefix;
//! - `prefix[i] = XXH3(le_u64(prefix[i-1]) ‖ le_u64(content[i]))`.
//!
//! On the wire each prefix hash is 8 bytes, big-endian. The scheme is pinned by
//! `tests/data/golden_vectors.json`, shared with every other implementation.
//!
//! **Extra keys (our extension).** An engine keys some blocks by more than
//! their tokens: a `cache_salt` (the first block of a salted request in vLLM,
//! every page in SGLang), multimodal identifiers (image blocks whose
//! placeholder tokens are identical), prompt-embedding digests. Such a block
//! is reused only by a request carrying the same keys, so its content hash
//! folds them in: `content' = XXH3(le_u64(content) ‖ keys)`, where `keys` is
//! the [`ExtraKeys`] encoding (each key tagged and length-prefixed). A block
//! without extra keys hashes exactly as before, so the golden vectors hold
//! for every unsalted prompt. The chain carries the fold onward, so salting
//! the first block salts the whole prompt.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// XXH3-64 seed of the scheme.
pub const SEED: u64 = 1337;

/// A prefix hash in its 8-byte big-endian wire form.
pub type WireHash = [u8; 8];

/// Content hash of one block: XXH3-64 (seed 1337) over the little-endian `u32`
/// encoding of each token.
pub fn content_hash(block: &[u32]) -> u64 {
    // Blocks are small (16 tokens is typical); a stack buffer avoids a heap
    // allocation per block. Larger blocks are hashed in one pass over a Vec.
    const STACK_TOKENS: usize = 64;
    if block.len() <= STACK_TOKENS {
        let mut buf = [0u8; STACK_TOKENS * 4];
        let bytes = encode_tokens(block, &mut buf);
        xxh3_64_with_seed(bytes, SEED)
    } else {
        let mut buf = vec![0u8; block.len() * 4];
        let bytes = encode_tokens(block, &mut buf);
        xxh3_64_with_seed(bytes, SEED)
    }
}

fn encode_tokens<'a>(block: &[u32], buf: &'a mut [u8]) -> &'a [u8] {
    let len = block.len() * 4;
    for (chunk, token) in buf[..len].chunks_exact_mut(4).zip(block) {
        chunk.copy_from_slice(&token.to_le_bytes());
    }
    &buf[..len]
}

/// Chains a content hash onto a previous prefix hash.
pub fn chain_step(previous: u64, content: u64) -> u64 {
    let mut buf = [0u8; 16];
    buf[..8].copy_from_slice(&previous.to_le_bytes());
    buf[8..].copy_from_slice(&content.to_le_bytes());
    xxh3_64_with_seed(&buf, SEED)
}

/// The canonical byte encoding of one block's extra keys: each key is a tag
/// byte, a little-endian `u32` length and its bytes. Strings (a cache salt)
/// are tagged `s`; any other value is tagged `v` and carries its MessagePack
/// encoding as the engine published it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraKeys(Vec<u8>);

impl ExtraKeys {
    /// No keys.
    pub fn new() -> Self {
        Self::default()
    }

    /// The keys of a request's cache salt (what an engine folds into the
    /// first block).
    pub fn salt(salt: &str) -> Self {
        let mut k = Self::new();
        k.push_str(salt);
        k
    }

    /// Appends a string key.
    pub fn push_str(&mut self, s: &str) {
        self.push(b's', s.as_bytes());
    }

    /// Appends a non-string key as its MessagePack bytes.
    pub fn push_encoded(&mut self, msgpack: &[u8]) {
        self.push(b'v', msgpack);
    }

    fn push(&mut self, tag: u8, bytes: &[u8]) {
        self.0.push(tag);
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        self.0.extend_from_slice(&len.to_le_bytes());
        self.0.extend_from_slice(&bytes[..len as usize]);
    }

    /// True when there is no key (the block hashes as its tokens alone).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The encoded bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Folds a block's extra keys into its content hash; `content` unchanged
/// when there are none.
pub fn with_extra_keys(content: u64, keys: &ExtraKeys) -> u64 {
    if keys.is_empty() {
        return content;
    }
    let mut buf = Vec::with_capacity(8 + keys.0.len());
    buf.extend_from_slice(&content.to_le_bytes());
    buf.extend_from_slice(&keys.0);
    xxh3_64_with_seed(&buf, SEED)
}

/// Iterates the full blocks of `tokens`; nothing when `block_size` is 0.
fn full_blocks(tokens: &[u32], block_size: usize) -> std::slice::ChunksExact<'_, u32> {
    // chunks_exact drops the partial tail, which is exactly the scheme's rule.
    let tokens = if block_size == 0 { &[][..] } else { tokens };
    tokens.chunks_exact(block_size.max(1))
}

/// The part of a whole prompt whose full blocks an engine can serve from
/// its prefix cache: every token but the last, which vLLM always recomputes
/// (a prefix hit is capped at `num_tokens - 1`), so a block-aligned
/// prompt's last block is never reused. The server, the SDK and the gateway
/// all cut a prompt here.
pub fn reusable_prefix(tokens: &[u32]) -> &[u32] {
    &tokens[..tokens.len().saturating_sub(1)]
}

/// [`reusable_prefix`] as a count: the most of a `prompt_tokens`-token prompt
/// an engine with `block_size`-token blocks can serve from cache.
pub fn reusable_tokens(prompt_tokens: u64, block_size: u32) -> u64 {
    let bs = u64::from(block_size.max(1));
    (prompt_tokens.saturating_sub(1) / bs) * bs
}

/// Content hash of every full block.
pub fn content_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    full_blocks(tokens, block_size).map(content_hash).collect()
}

/// Positional prefix hashes of every full block, starting a new chain.
pub fn prefix_hashes(tokens: &[u32], block_size: usize) -> Vec<u64> {
    prefix_hashes_from(tokens, block_size, None)
}

/// Positional prefix hashes of every full block, continuing `parent` when given
/// (the engine reports a stored block's parent, so a continuation chains onto it).
pub fn prefix_hashes_from(tokens: &[u32], block_size: usize, parent: Option<u64>) -> Vec<u64> {
    let mut previous = parent;
    full_blocks(tokens, block_size)
        .map(|block| {
            let content = content_hash(block);
            let prefix = previous.map_or(content, |p| chain_step(p, content));
            previous = Some(prefix);
            prefix
        })
        .collect()
}

/// Wire form of a prefix hash: 8 bytes, big-endian.
pub fn to_wire(hash: u64) -> WireHash {
    hash.to_be_bytes()
}

/// Parses the wire form back; `None` unless exactly 8 bytes.
pub fn from_wire(bytes: &[u8]) -> Option<u64> {
    let arr: [u8; 8] = bytes.try_into().ok()?;
    Some(u64::from_be_bytes(arr))
}

/// The chain a gateway sends in `LookupRouteRequest.block_hashes` /
/// `block_token_counts`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chain {
    /// Big-endian wire bytes of each positional prefix hash.
    pub block_hashes: Vec<WireHash>,
    /// Tokens in each block (always `block_size`, since partial tails are dropped).
    pub block_token_counts: Vec<i32>,
}

impl Chain {
    /// Number of full blocks in the chain.
    pub fn len(&self) -> usize {
        self.block_hashes.len()
    }

    /// True when the prompt held no full block.
    pub fn is_empty(&self) -> bool {
        self.block_hashes.is_empty()
    }
}

/// Fingerprints `tokens` into a wire chain: one hash and count per full block.
/// Empty when `block_size` is 0 or shorter than one block.
pub fn chain(tokens: &[u32], block_size: usize) -> Chain {
    chain_with_first_keys(tokens, block_size, &ExtraKeys::new())
}

/// As [`chain`], with the request's cache salt folded into the first block
/// (as the engine does); an empty salt is no salt.
pub fn chain_salted(tokens: &[u32], block_size: usize, salt: &str) -> Chain {
    if salt.is_empty() {
        return chain(tokens, block_size);
    }
    chain_with_first_keys(tokens, block_size, &ExtraKeys::salt(salt))
}

fn chain_with_first_keys(tokens: &[u32], block_size: usize, first: &ExtraKeys) -> Chain {
    // A block size beyond i32 cannot be expressed on the wire; treat it as
    // "no full block" rather than wrapping the count.
    let Ok(count) = i32::try_from(block_size) else {
        return Chain::default();
    };
    // One pass straight to wire form: no intermediate Vec<u64>.
    let mut previous: Option<u64> = None;
    let block_hashes: Vec<WireHash> = full_blocks(tokens, block_size)
        .map(|block| {
            let content = content_hash(block);
            let prefix = match previous {
                None => with_extra_keys(content, first),
                Some(p) => chain_step(p, content),
            };
            previous = Some(prefix);
            to_wire(prefix)
        })
        .collect();
    let block_token_counts = vec![count; block_hashes.len()];
    Chain {
        block_hashes,
        block_token_counts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_block_size_gives_nothing() {
        assert!(chain(&[1, 2, 3], 0).is_empty());
        assert!(prefix_hashes(&[1, 2, 3], 0).is_empty());
        assert!(content_hashes(&[1, 2, 3], 0).is_empty());
    }

    #[test]
    fn no_tokens_gives_nothing() {
        assert!(chain(&[], 16).is_empty());
    }

    #[test]
    fn wire_round_trip() {
        let h = 0x0123_4567_89ab_cdef;
        assert_eq!(to_wire(h), [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef]);
        assert_eq!(from_wire(&to_wire(h)), Some(h));
        assert_eq!(from_wire(&[1, 2, 3]), None);
    }

    #[test]
    fn a_salt_changes_every_block_and_no_salt_changes_nothing() {
        let tokens: Vec<u32> = (0..64).collect();
        let plain = chain(&tokens, 16);
        assert_eq!(chain_salted(&tokens, 16, ""), plain);
        let a = chain_salted(&tokens, 16, "tenant-a");
        let b = chain_salted(&tokens, 16, "tenant-b");
        for i in 0..plain.len() {
            assert_ne!(a.block_hashes[i], plain.block_hashes[i], "block {i}");
            assert_ne!(a.block_hashes[i], b.block_hashes[i], "block {i}");
        }
        assert_eq!(a, chain_salted(&tokens, 16, "tenant-a"));
        assert_eq!(with_extra_keys(7, &ExtraKeys::new()), 7);
    }

    #[test]
    fn keys_are_length_prefixed_and_tagged() {
        // "ab" + "c" must not hash like "a" + "bc", nor a string like bytes.
        let mut x = ExtraKeys::new();
        x.push_str("ab");
        x.push_str("c");
        let mut y = ExtraKeys::new();
        y.push_str("a");
        y.push_str("bc");
        assert_ne!(with_extra_keys(1, &x), with_extra_keys(1, &y));
        let mut z = ExtraKeys::new();
        z.push_encoded(b"ab");
        assert_ne!(ExtraKeys::salt("ab"), z);
    }

    #[test]
    fn large_blocks_hash_like_small_ones() {
        // The heap path (blocks > 64 tokens) must hash exactly like the stack path.
        let tokens: Vec<u32> = (0..512).collect();
        let mut bytes = Vec::new();
        for t in &tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        assert_eq!(content_hash(&tokens), xxh3_64_with_seed(&bytes, SEED));
    }
}

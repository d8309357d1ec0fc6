//! Engine KV-cache events after decoding: one domain type for every vLLM and
//! SGLang wire variant (positional tuples or tagged maps, old or new fields).

use crate::hash::EngineHash;

/// Where the engine says a block lives (`medium`).
///
/// Parsed case-insensitively; anything unrecognised is kept verbatim so it
/// can be logged, and is treated as a colder tier by the mapping.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Medium {
    /// `"GPU"`: device memory, the engine's own prefix cache.
    Gpu,
    /// `"CPU"`: vLLM's CPU offload.
    Cpu,
    /// `"CPU_TIER1"`: SGLang hierarchical cache, host memory.
    CpuTier1,
    /// `"CPU_TIER2"`: SGLang hierarchical cache, second host tier.
    CpuTier2,
    /// `"DISK"` (any case).
    Disk,
    /// `"EXTERNAL"`: SGLang's shared or remote pool (T3).
    External,
    /// Any other medium name, verbatim.
    Other(String),
}

impl Medium {
    /// Parses a wire `medium` string.
    pub fn parse(s: &str) -> Self {
        if s.eq_ignore_ascii_case("gpu") {
            Self::Gpu
        } else if s.eq_ignore_ascii_case("cpu") {
            Self::Cpu
        } else if s.eq_ignore_ascii_case("cpu_tier1") {
            Self::CpuTier1
        } else if s.eq_ignore_ascii_case("cpu_tier2") {
            Self::CpuTier2
        } else if s.eq_ignore_ascii_case("disk") {
            Self::Disk
        } else if s.eq_ignore_ascii_case("external") {
            Self::External
        } else {
            Self::Other(s.to_owned())
        }
    }
}

/// `BlockStored`: the engine cached `block_hashes` (in order, each chaining on
/// the previous one, the first on `parent_block_hash`) holding `token_ids`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockStored {
    /// Engine hashes of the stored blocks, in chain order.
    pub block_hashes: Vec<EngineHash>,
    /// Engine hash of the block preceding the first one; `None` for a root.
    pub parent_block_hash: Option<EngineHash>,
    /// Tokens of all stored blocks, concatenated (`nil` decodes as empty).
    pub token_ids: Vec<u32>,
    /// Tokens per block; always > 0 and ≤ `i32::MAX` after decoding.
    pub block_size: u32,
    /// vLLM's load-order LoRA id (deprecated upstream in favour of `lora_name`).
    pub lora_id: Option<i64>,
    /// Where the blocks were stored.
    pub medium: Option<Medium>,
    /// LoRA adapter name (vLLM ≥ #27577).
    pub lora_name: Option<String>,
    /// Per-block extra hash keys (multimodal ids, LoRA name, cache salt, ...),
    /// kept opaque: the content fingerprint covers tokens only.
    pub extra_keys: Option<Vec<Option<rmpv::Value>>>,
    /// Hybrid-memory KV-cache group.
    pub group_idx: Option<i64>,
    /// KV-cache spec kind of the group, e.g. `"full_attention"`.
    pub kv_cache_spec_kind: Option<String>,
    /// Sliding window of the group's spec, when it has one.
    pub kv_cache_spec_sliding_window: Option<i64>,
    /// vLLM 0.33 `locality`, informational.
    pub locality: Option<String>,
    /// vLLM 0.33 `ownership`, informational.
    pub ownership: Option<String>,
    /// SGLang / vLLM `session_id`, informational.
    pub session_id: Option<String>,
    /// SGLang `cache_salt` (salted hashes), informational.
    pub cache_salt: Option<String>,
    /// vLLM 0.33 `lookahead_token_ids`, informational.
    pub lookahead_token_ids: Vec<u32>,
}

/// `BlockRemoved`: the engine dropped `block_hashes` from `medium`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockRemoved {
    /// Engine hashes of the removed blocks.
    pub block_hashes: Vec<EngineHash>,
    /// Which medium they left; `None` from engines that predate `medium`.
    pub medium: Option<Medium>,
    /// Hybrid-memory KV-cache group.
    pub group_idx: Option<i64>,
}

/// One decoded engine event.
// Almost every event is a BlockStored, so boxing it would add an allocation
// to the common case to shrink the rare ones.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// Blocks were cached.
    BlockStored(BlockStored),
    /// Blocks were evicted from a medium.
    BlockRemoved(BlockRemoved),
    /// The engine reset its whole prefix cache.
    AllBlocksCleared,
}

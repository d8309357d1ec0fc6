//! What a gateway asks: the routing keys plus one form of the prompt.

use inferencecache_proto::v1alpha1::{LookupRouteRequest, Slo};
use std::time::Duration;

/// One LookupRoute question.
///
/// `tenant_id`, `model_id`, `hash_scheme` and `adapter_id` must be the
/// values the producers (kvevent-subscriber) ingest under, or every lookup
/// misses; the server answers `UNKNOWN_*` reason codes to help spot that.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteQuery {
    /// Tenant (by convention the Kubernetes namespace of the engines).
    pub tenant_id: String,
    /// Model id as the engines serve it.
    pub model_id: String,
    /// Hash scheme the producers report under; `vllm` for the content
    /// fingerprint ([`crate::DEFAULT_HASH_SCHEME`]).
    pub hash_scheme: String,
    /// LoRA adapter partition; empty for base-model traffic.
    pub adapter_id: String,
    /// The prompt, in whichever form the gateway has.
    pub input: RouteInput,
    /// Time-to-first-token SLO in ms forwarded to the server (0 = none).
    pub slo_ttft_ms: i32,
    /// Overrides the client's default lookup deadline for this call.
    pub deadline: Option<Duration>,
    /// The request's cache salt (our extension; `""` = none): with token
    /// ids or prompt text the server folds it into the fingerprint, so the
    /// lookup matches only blocks the engine stored under the same salt.
    /// A [`RouteInput::BlockHashes`] chain must be salted by the gateway
    /// itself ([`RouteInput::chain_for_prompt`]).
    pub cache_salt: String,
    /// Ask without delivering (our extension: the `x-inferencecache-shadow`
    /// metadata): the same answer, but the server records no delivery,
    /// queued work or tentative holding, because no request will follow.
    /// For probes, dashboards and `inferencecache lookup --shadow`; a
    /// gateway that sends the request must leave it off, or the server's
    /// load and eviction model miss that request.
    pub shadow: bool,
}

/// The prompt of a query. Every form ends in the same block-chain match.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteInput {
    /// Token ids; the server fingerprints them with its engine block size.
    TokenIds(Vec<u32>),
    /// A chain the gateway fingerprinted itself (see
    /// [`block_hashes`](crate::block_hashes)); `hashes` and `token_counts`
    /// are parallel.
    BlockHashes {
        /// Wire bytes of each positional block hash.
        hashes: Vec<Vec<u8>>,
        /// Tokens in each block.
        token_counts: Vec<i32>,
    },
    /// One legacy exact-match prefix hash.
    PrefixHash {
        /// Wire bytes of the prefix hash.
        hash: Vec<u8>,
        /// Tokens the prefix covers.
        token_count: i32,
    },
    /// Raw prompt text: the server applies the model's chat template and
    /// tokenizes (needs a server started with `--tokenizer-models-dir`).
    PromptText(String),
}

impl RouteQuery {
    /// A query for `tenant`/`model` under the `vllm` hash scheme, default
    /// partition, no SLO, the client's default deadline.
    pub fn new(tenant: impl Into<String>, model: impl Into<String>, input: RouteInput) -> Self {
        Self {
            tenant_id: tenant.into(),
            model_id: model.into(),
            hash_scheme: crate::DEFAULT_HASH_SCHEME.to_owned(),
            adapter_id: String::new(),
            input,
            slo_ttft_ms: 0,
            deadline: None,
            cache_salt: String::new(),
            shadow: false,
        }
    }

    /// Sets the request's cache salt (default: none).
    pub fn cache_salt(mut self, salt: impl Into<String>) -> Self {
        self.cache_salt = salt.into();
        self
    }

    /// Sets the hash scheme (default `vllm`).
    pub fn hash_scheme(mut self, scheme: impl Into<String>) -> Self {
        self.hash_scheme = scheme.into();
        self
    }

    /// Sets the LoRA adapter partition (default: none).
    pub fn adapter(mut self, adapter_id: impl Into<String>) -> Self {
        self.adapter_id = adapter_id.into();
        self
    }

    /// Sets the time-to-first-token SLO sent to the server, in ms.
    pub fn slo_ttft_ms(mut self, ms: i32) -> Self {
        self.slo_ttft_ms = ms;
        self
    }

    /// Overrides the client's lookup deadline for this query.
    pub fn deadline(mut self, deadline: std::time::Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// The wire request.
    pub fn to_request(&self) -> LookupRouteRequest {
        let mut req = LookupRouteRequest {
            model_id: self.model_id.clone(),
            tenant_id: self.tenant_id.clone(),
            hash_scheme: self.hash_scheme.clone(),
            adapter_id: self.adapter_id.clone(),
            cache_salt: self.cache_salt.clone(),
            slo: (self.slo_ttft_ms > 0).then_some(Slo {
                ttft_ms: self.slo_ttft_ms,
                tbt_ms: 0,
            }),
            ..Default::default()
        };
        match &self.input {
            RouteInput::TokenIds(ids) => req.token_ids = ids.clone(),
            RouteInput::BlockHashes {
                hashes,
                token_counts,
            } => {
                req.block_hashes = hashes.iter().map(|h| h.clone().into()).collect();
                req.block_token_counts = token_counts.clone();
            }
            RouteInput::PrefixHash { hash, token_count } => {
                req.prefix_hash = hash.clone();
                req.prefix_token_count = *token_count;
            }
            RouteInput::PromptText(text) => req.prompt_text = text.clone(),
        }
        req
    }
}

impl RouteInput {
    /// Fingerprints `tokens` client-side into a block chain, so the server
    /// does no hashing and the tokens never leave the gateway.
    pub fn chain_from_tokens(tokens: &[u32], block_size: usize) -> Self {
        let (hashes, token_counts) = crate::block_hashes(tokens, block_size);
        Self::BlockHashes {
            hashes,
            token_counts,
        }
    }

    /// The chain of a whole prompt as the engine can reuse it: the last
    /// prompt token is always recomputed (vLLM caps a prefix hit at
    /// `num_tokens - 1`), so it is left out and a block-aligned prompt's
    /// last block is not claimed; `salt` is the request's cache salt (`""`
    /// = none). Use this rather than [`RouteInput::chain_from_tokens`] when
    /// the tokens are the complete prompt the engine will see.
    pub fn chain_for_prompt(tokens: &[u32], block_size: usize, salt: &str) -> Self {
        let reusable = inferencecache_fingerprint::reusable_prefix(tokens);
        let (hashes, token_counts) = crate::block_hashes_salted(reusable, block_size, salt);
        Self::BlockHashes {
            hashes,
            token_counts,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_input_fills_its_own_fields() {
        let mut q = RouteQuery::new("t", "m", RouteInput::TokenIds(vec![1, 2])).slo_ttft_ms(200);
        let r = q.to_request();
        assert_eq!(
            (
                r.tenant_id.as_str(),
                r.model_id.as_str(),
                r.hash_scheme.as_str()
            ),
            ("t", "m", "vllm")
        );
        assert_eq!(r.token_ids, vec![1, 2]);
        assert_eq!(r.slo.map(|s| s.ttft_ms), Some(200));
        q.input = RouteInput::PrefixHash {
            hash: vec![1; 8],
            token_count: 64,
        };
        let r = q.to_request();
        assert!(r.token_ids.is_empty());
        assert_eq!((r.prefix_hash.len(), r.prefix_token_count), (8, 64));
        q.input = RouteInput::PromptText("hi".into());
        assert_eq!(q.to_request().prompt_text, "hi");
        let r = q.adapter("lora-a").hash_scheme("sglang").to_request();
        assert_eq!(
            (r.adapter_id.as_str(), r.hash_scheme.as_str()),
            ("lora-a", "sglang")
        );
    }

    #[test]
    fn client_side_chain_matches_the_fingerprint_crate() {
        let tokens: Vec<u32> = (0..40).collect();
        let RouteInput::BlockHashes {
            hashes,
            token_counts,
        } = RouteInput::chain_from_tokens(&tokens, 16)
        else {
            panic!("chain expected");
        };
        let c = inferencecache_fingerprint::chain(&tokens, 16);
        assert_eq!(hashes.len(), 2, "the partial tail is dropped");
        assert_eq!(hashes[1], c.block_hashes[1].to_vec());
        assert_eq!(token_counts, vec![16, 16]);
    }

    #[test]
    fn a_whole_prompt_leaves_its_last_token_out_and_carries_its_salt() {
        let aligned: Vec<u32> = (0..32).collect();
        let RouteInput::BlockHashes { hashes, .. } = RouteInput::chain_for_prompt(&aligned, 16, "")
        else {
            panic!("chain expected");
        };
        assert_eq!(hashes.len(), 1, "the block of the last token is recomputed");
        let RouteInput::BlockHashes { hashes: salted, .. } =
            RouteInput::chain_for_prompt(&aligned, 16, "s")
        else {
            panic!("chain expected");
        };
        let want = inferencecache_fingerprint::chain_salted(&aligned[..16], 16, "s");
        assert_eq!(salted[0], want.block_hashes[0].to_vec());
        assert_ne!(salted[0], hashes[0]);
        let q = RouteQuery::new("t", "m", RouteInput::TokenIds(aligned)).cache_salt("s");
        assert_eq!(q.to_request().cache_salt, "s");
    }
}

//! Dual-input resolution (`server.md` §3.3): explicit fingerprint (prefix hash
//! and/or chain) > `token_ids` > `prompt_text`. Never mutates the request and
//! borrows its hashes rather than copying them.

use super::request::RouteRequest;
use inferencecache_fingerprint as fingerprint;

/// Most tokens a lookup may carry (1 Mi).
pub const MAX_LOOKUP_TOKENS: usize = 1 << 20;
/// Largest `prompt_text` in bytes (1 MiB).
pub const MAX_PROMPT_TEXT_BYTES: usize = 1 << 20;

/// The chain a lookup uses: the request's own hashes, or hashes the server
/// computed from tokens.
#[derive(Debug)]
pub(super) enum ChainHashes<'a> {
    /// From `block_hashes` (borrowed).
    Request(&'a [&'a [u8]]),
    /// Fingerprinted from `token_ids` / `prompt_text`.
    Computed(Vec<fingerprint::WireHash>),
}

/// The resolved fingerprint of a request.
#[derive(Debug)]
pub(super) struct Resolved<'a> {
    /// Exact (legacy) key; empty when absent.
    pub exact_hash: ExactHash<'a>,
    /// Tokens of the exact key.
    pub exact_count: i32,
    /// Chain hashes.
    pub chain: ChainHashes<'a>,
    /// Chain token counts.
    pub counts: Counts<'a>,
    /// Tokens to echo (prompt_text path only).
    pub echo_tokens: Vec<u32>,
}

/// Exact key bytes: borrowed from the request or computed.
#[derive(Debug)]
pub(super) enum ExactHash<'a> {
    /// `prefix_hash` of the request (may be empty).
    Request(&'a [u8]),
    /// Last block hash of a computed chain.
    Computed(fingerprint::WireHash),
}

impl ExactHash<'_> {
    /// The key bytes.
    pub(super) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Request(b) => b,
            Self::Computed(b) => b,
        }
    }
}

/// Chain token counts: borrowed or computed.
#[derive(Debug)]
pub(super) enum Counts<'a> {
    /// `block_token_counts` of the request.
    Request(&'a [i32]),
    /// One count per computed block.
    Computed(Vec<i32>),
}

impl Counts<'_> {
    /// The counts.
    pub(super) fn as_slice(&self) -> &[i32] {
        match self {
            Self::Request(c) => c,
            Self::Computed(c) => c,
        }
    }
}

impl<'a> Resolved<'a> {
    fn exact_only(req: &RouteRequest<'a>) -> Self {
        Self {
            exact_hash: ExactHash::Request(req.prefix_hash),
            exact_count: req.prefix_token_count,
            chain: ChainHashes::Request(&[]),
            counts: Counts::Request(&[]),
            echo_tokens: Vec::new(),
        }
    }

    /// Tokens the prompt is known to cover: the chain's sum if there is a
    /// chain, else the exact count.
    pub(super) fn effective_prefix_tokens(&self) -> i64 {
        let counts = self.counts.as_slice();
        if counts.is_empty() {
            i64::from(self.exact_count)
        } else {
            counts.iter().map(|&c| i64::from(c)).sum()
        }
    }

    /// Drops the chain (chain matching disabled by policy).
    pub(super) fn clear_chain(&mut self) {
        self.chain = ChainHashes::Request(&[]);
        self.counts = Counts::Request(&[]);
    }
}

/// How the server fingerprints the tokens it sees itself (`token_ids`,
/// `prompt_text`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Cut<'a> {
    /// The engines' block size for the lookup's scope.
    pub block_size: u32,
    /// The request's cache salt (`""` = none), folded into the first block
    /// as the engine does.
    pub salt: &'a str,
    /// The engine's reuse rule: the last prompt token is always recomputed
    /// (vLLM caps a prefix-cache hit at `num_tokens - 1`), so only the full
    /// blocks before it can be reused and hinted. Off in contract mode, which
    /// counts every full block as the reference does.
    pub reuse_rule: bool,
}

impl Cut<'_> {
    /// Blocks of `block_size`, no salt, every full block counted.
    #[cfg(test)]
    pub(super) fn plain(block_size: u32) -> Self {
        Cut {
            block_size,
            salt: "",
            reuse_rule: false,
        }
    }

    /// The tokens whose full blocks the engine can reuse.
    fn reusable<'t>(&self, tokens: &'t [u32]) -> &'t [u32] {
        if self.reuse_rule {
            inferencecache_fingerprint::reusable_prefix(tokens)
        } else {
            tokens
        }
    }
}

/// Why resolution failed open (the response is NO_HINT, echoing tokens if any).
#[derive(Debug, Default)]
pub(super) struct FailOpen {
    /// Tokens produced before failing (prompt_text sub-block case).
    pub echo_tokens: Vec<u32>,
}

/// Fingerprints tokens into a resolved chain + exact key (last block).
pub(super) fn from_tokens<'a>(
    tokens: &[u32],
    cut: Cut<'_>,
    chain_enabled: bool,
    echo_tokens: Vec<u32>,
) -> Result<Resolved<'a>, FailOpen> {
    if tokens.len() > MAX_LOOKUP_TOKENS {
        return Err(FailOpen { echo_tokens });
    }
    let chain = fingerprint::chain_salted(cut.reusable(tokens), cut.block_size as usize, cut.salt);
    let Some(&last) = chain.block_hashes.last() else {
        return Err(FailOpen { echo_tokens });
    };
    let sum: i64 = chain.block_token_counts.iter().map(|&c| i64::from(c)).sum();
    let exact_count = i32::try_from(sum).unwrap_or(i32::MAX);
    let (hashes, counts) = if chain_enabled {
        (chain.block_hashes, chain.block_token_counts)
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(Resolved {
        exact_hash: ExactHash::Computed(last),
        exact_count,
        chain: ChainHashes::Computed(hashes),
        counts: Counts::Computed(counts),
        echo_tokens,
    })
}

/// What input a request carries, after the chain-matching switch.
pub(super) enum Input<'a> {
    /// Resolved without tokenization.
    Ready(Resolved<'a>),
    /// Needs the tokenizer.
    PromptText,
    /// Fails open.
    FailOpen,
}

/// Resolves everything that needs no tokenizer.
pub(super) fn resolve<'a>(req: &RouteRequest<'a>, cut: Cut<'_>, chain_enabled: bool) -> Input<'a> {
    let has_chain = req.has_chain();
    let mut ignored_chain = false;
    if !chain_enabled {
        if !req.prefix_hash.is_empty() {
            return Input::Ready(Resolved::exact_only(req));
        }
        ignored_chain = has_chain;
    } else if has_chain || !req.prefix_hash.is_empty() {
        if req.block_hashes.len() != req.block_token_counts.len() {
            return Input::FailOpen;
        }
        return Input::Ready(Resolved {
            chain: ChainHashes::Request(req.block_hashes),
            counts: Counts::Request(req.block_token_counts),
            ..Resolved::exact_only(req)
        });
    }
    if !req.token_ids.is_empty() {
        return match from_tokens(req.token_ids, cut, chain_enabled, Vec::new()) {
            Ok(r) => Input::Ready(r),
            Err(_) => Input::FailOpen,
        };
    }
    if !req.prompt_text.is_empty() {
        return Input::PromptText;
    }
    if ignored_chain {
        return Input::FailOpen;
    }
    Input::Ready(Resolved::exact_only(req))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready(i: Input<'_>) -> Resolved<'_> {
        match i {
            Input::Ready(r) => r,
            Input::PromptText => panic!("unexpected prompt text"),
            Input::FailOpen => panic!("unexpected fail open"),
        }
    }

    #[test]
    fn explicit_chain_beats_token_ids() {
        let req = RouteRequest {
            block_hashes: &[&[1; 8]],
            block_token_counts: &[16],
            token_ids: &(0..64).collect::<Vec<u32>>(),
            ..Default::default()
        };
        let r = ready(resolve(&req, Cut::plain(16), true));
        assert!(matches!(r.chain, ChainHashes::Request(h) if h.len() == 1));
        assert_eq!(r.effective_prefix_tokens(), 16);
    }

    #[test]
    fn token_ids_equal_the_explicit_chain() {
        let tokens: Vec<u32> = (0..40).collect();
        let req = RouteRequest {
            token_ids: &tokens,
            ..Default::default()
        };
        let r = ready(resolve(&req, Cut::plain(16), true));
        let want = fingerprint::chain(&tokens, 16);
        match &r.chain {
            ChainHashes::Computed(h) => assert_eq!(h, &want.block_hashes),
            ChainHashes::Request(_) => panic!("computed expected"),
        }
        assert_eq!(r.counts.as_slice(), &[16, 16]);
        assert_eq!(r.exact_hash.as_bytes(), &want.block_hashes[1]);
        assert_eq!(r.exact_count, 32);
        assert!(r.echo_tokens.is_empty());
    }

    #[test]
    fn chain_disabled_token_ids_use_the_last_block_as_exact_key() {
        let tokens: Vec<u32> = (0..48).collect();
        let req = RouteRequest {
            token_ids: &tokens,
            ..Default::default()
        };
        let r = ready(resolve(&req, Cut::plain(16), false));
        assert!(matches!(&r.chain, ChainHashes::Computed(h) if h.is_empty()));
        assert_eq!(r.exact_count, 48);
        assert_eq!(
            r.exact_hash.as_bytes(),
            &fingerprint::chain(&tokens, 16).block_hashes[2]
        );
    }

    #[test]
    fn fail_open_cases() {
        let sub_block = RouteRequest {
            token_ids: &[1, 2, 3],
            ..Default::default()
        };
        assert!(matches!(
            resolve(&sub_block, Cut::plain(16), true),
            Input::FailOpen
        ));
        let counts_only = RouteRequest {
            block_token_counts: &[16],
            ..Default::default()
        };
        assert!(matches!(
            resolve(&counts_only, Cut::plain(16), true),
            Input::FailOpen
        ));
        let too_many = RouteRequest {
            token_ids: &vec![0; MAX_LOOKUP_TOKENS + 1],
            ..Default::default()
        };
        assert!(matches!(
            resolve(&too_many, Cut::plain(16), true),
            Input::FailOpen
        ));
        // Chain ignored (matching disabled) and nothing else to go on.
        let ignored = RouteRequest {
            block_hashes: &[&[1; 8]],
            block_token_counts: &[16],
            ..Default::default()
        };
        assert!(matches!(
            resolve(&ignored, Cut::plain(16), false),
            Input::FailOpen
        ));
    }

    #[test]
    fn chain_disabled_with_prefix_hash_uses_only_the_exact_key() {
        let req = RouteRequest {
            prefix_hash: &[9; 8],
            prefix_token_count: 100,
            block_hashes: &[&[1; 8]],
            block_token_counts: &[16, 16],
            ..Default::default()
        };
        let r = ready(resolve(&req, Cut::plain(16), false));
        assert!(matches!(r.chain, ChainHashes::Request(h) if h.is_empty()));
        assert_eq!(r.effective_prefix_tokens(), 100);
    }

    #[test]
    fn the_reuse_rule_leaves_out_the_block_of_the_last_token() {
        let aligned: Vec<u32> = (0..64).collect();
        let req = RouteRequest {
            token_ids: &aligned,
            ..Default::default()
        };
        let rule = Cut {
            reuse_rule: true,
            ..Cut::plain(16)
        };
        assert_eq!(ready(resolve(&req, rule, true)).exact_count, 48);
        assert_eq!(ready(resolve(&req, Cut::plain(16), true)).exact_count, 64);
        let unaligned: Vec<u32> = (0..70).collect();
        let req = RouteRequest {
            token_ids: &unaligned,
            ..Default::default()
        };
        assert_eq!(ready(resolve(&req, rule, true)).exact_count, 64);
        let one_block: Vec<u32> = (0..16).collect();
        let req = RouteRequest {
            token_ids: &one_block,
            ..Default::default()
        };
        assert!(matches!(resolve(&req, rule, true), Input::FailOpen));
    }

    #[test]
    fn a_salted_lookup_fingerprints_like_the_salted_engine() {
        let tokens: Vec<u32> = (0..40).collect();
        let req = RouteRequest {
            token_ids: &tokens,
            ..Default::default()
        };
        let salted = Cut {
            salt: "s",
            ..Cut::plain(16)
        };
        let r = ready(resolve(&req, salted, true));
        let want = fingerprint::chain_salted(&tokens, 16, "s");
        assert!(matches!(&r.chain, ChainHashes::Computed(h) if h == &want.block_hashes));
        assert_ne!(want, fingerprint::chain(&tokens, 16));
    }

    #[test]
    fn prompt_text_needs_the_tokenizer() {
        let req = RouteRequest {
            prompt_text: "hello",
            ..Default::default()
        };
        assert!(matches!(
            resolve(&req, Cut::plain(16), true),
            Input::PromptText
        ));
    }
}

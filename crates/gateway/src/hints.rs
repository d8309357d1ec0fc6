//! Asking for a hint: the in-process index's LookupRoute pipeline (the same
//! code `inferencecache serve` answers gRPC with), or a remote server through
//! the fail-open SDK (`crates/client`). Either way the answer is a [`Hint`],
//! and every failure is a hint with no candidates and a reason code: asking
//! can never fail a request.

use inferencecache_client::{Client, Hint as SdkHint, RouteInput, RouteQuery};
use inferencecache_proto::Reason;
use inferencecache_server::route::{LookupPipeline, RouteRequest};
use std::sync::Arc;
use std::time::Duration;

/// What kind of answer a hint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HintKind {
    /// `PREFIX_MATCH`: candidates hold part of the prompt.
    PrefixMatch,
    /// `AFFINITY_HINT`: a stable replica for a new prefix.
    Affinity,
    /// `TENANT_HOT`.
    TenantHot,
    /// No hint (any other code, a timeout, an unreachable server).
    None,
}

/// One candidate replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The replica id (an engine's `id`).
    pub replica_id: Arc<str>,
    /// Prompt tokens it holds, by the index.
    pub matched_tokens: u64,
}

/// A hint, best candidate first.
#[derive(Debug, Clone)]
pub struct Hint {
    /// Its kind.
    pub kind: HintKind,
    /// The reason code (the contract's, or the SDK's client-side label).
    pub reason: String,
    /// Ranked candidates; empty for every no-hint answer.
    pub candidates: Vec<Candidate>,
}

impl Hint {
    /// A no-hint answer with `reason`.
    pub fn none(reason: &str) -> Self {
        Self {
            kind: HintKind::None,
            reason: reason.to_owned(),
            candidates: Vec::new(),
        }
    }
}

/// The lookup's keys.
#[derive(Debug, Clone, Copy)]
pub struct HintQuery<'a> {
    /// Tenant the engines' blocks are indexed under.
    pub tenant: &'a str,
    /// The base model the engines report.
    pub model: &'a str,
    /// LoRA adapter (empty for the base model).
    pub adapter: &'a str,
    /// Hash scheme.
    pub hash_scheme: &'a str,
    /// The prompt's token ids, as the engine will see them.
    pub tokens: &'a [u32],
    /// The request's `cache_salt` (vLLM): the index matches only blocks the
    /// engine stored under the same salt (our `cache_salt` extension of
    /// `LookupRouteRequest`; remotely, the SDK's salted chain).
    pub cache_salt: Option<&'a str>,
}

/// Where hints come from.
#[derive(Clone)]
pub enum HintSource {
    /// The in-process index.
    Embedded(LookupPipeline),
    /// A remote server.
    Remote(Client),
}

impl std::fmt::Debug for HintSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Embedded(_) => f.write_str("HintSource::Embedded"),
            Self::Remote(_) => f.write_str("HintSource::Remote"),
        }
    }
}

fn kind_of(reason: Reason) -> HintKind {
    match reason {
        Reason::PrefixMatch => HintKind::PrefixMatch,
        Reason::AffinityHint => HintKind::Affinity,
        Reason::TenantHot => HintKind::TenantHot,
        _ => HintKind::None,
    }
}

impl HintSource {
    /// One lookup, never longer than `timeout`.
    pub async fn lookup(&self, q: &HintQuery<'_>, block_size: u32, timeout: Duration) -> Hint {
        if q.tokens.is_empty() {
            return Hint::none("NO_HINT");
        }
        match self {
            Self::Embedded(pipeline) => {
                let req = RouteRequest {
                    tenant: q.tenant,
                    model: q.model,
                    hash_scheme: q.hash_scheme,
                    adapter: q.adapter,
                    token_ids: q.tokens,
                    cache_salt: q.cache_salt.unwrap_or_default(),
                    ..RouteRequest::default()
                };
                // Token-id lookups run inline (no tokenization, no I/O); the
                // pipeline checks the deadline around the index walk.
                let out = pipeline.route(&req, Some(timeout)).await;
                let kind = if out.scores.is_empty() {
                    HintKind::None
                } else {
                    kind_of(out.reason)
                };
                Hint {
                    kind,
                    reason: out.reason.as_str().to_owned(),
                    candidates: out
                        .scores
                        .iter()
                        .map(|s| Candidate {
                            replica_id: out.names.arc(s.replica),
                            matched_tokens: u64::try_from(s.matched_tokens).unwrap_or(0),
                        })
                        .collect(),
                }
            }
            Self::Remote(client) => {
                let query = RouteQuery::new(
                    q.tenant,
                    q.model,
                    // The whole prompt, salted, without the last token
                    // (the engine always recomputes it).
                    RouteInput::chain_for_prompt(
                        q.tokens,
                        block_size as usize,
                        q.cache_salt.unwrap_or_default(),
                    ),
                )
                .hash_scheme(q.hash_scheme)
                .adapter(q.adapter)
                .deadline(timeout);
                let answer = client.lookup_route(&query).await;
                let kind = match &answer.hint {
                    SdkHint::PrefixMatch(_) => HintKind::PrefixMatch,
                    SdkHint::Affinity(_) => HintKind::Affinity,
                    SdkHint::TenantHot(_) => HintKind::TenantHot,
                    SdkHint::NoHint(_) => HintKind::None,
                };
                Hint {
                    kind,
                    reason: answer.hint.reason_code().to_owned(),
                    candidates: answer
                        .hint
                        .candidates()
                        .iter()
                        .map(|c| Candidate {
                            replica_id: Arc::from(c.replica_id.as_str()),
                            matched_tokens: u64::try_from(c.matched_tokens).unwrap_or(0),
                        })
                        .collect(),
                }
            }
        }
    }
}

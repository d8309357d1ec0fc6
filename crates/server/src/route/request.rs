//! The pipeline's own request and outcome types. `convert.rs` builds a
//! [`RouteRequest`] by borrowing a wire `LookupRouteRequest` (no copy) and
//! turns a [`RouteOutcome`] into the wire response, so nothing in `route/`
//! depends on the protobuf types.

use inferencecache_index::{ReplicaId, ReplicaNames, ScoreById, Strategy, Tier};
use inferencecache_proto::Reason;
use std::sync::Arc;
use std::time::Duration;

/// One LookupRoute, borrowed from the request that carried it.
#[derive(Debug, Clone, Copy, Default)]
pub struct RouteRequest<'a> {
    /// Tenant.
    pub tenant: &'a str,
    /// Model.
    pub model: &'a str,
    /// Hash scheme of the fingerprint.
    pub hash_scheme: &'a str,
    /// LoRA adapter (echoed on answers that rank replicas).
    pub adapter: &'a str,
    /// Legacy exact key (may be empty).
    pub prefix_hash: &'a [u8],
    /// Tokens the exact key covers.
    pub prefix_token_count: i32,
    /// Block chain, first block first (may be empty): slices of the
    /// request's buffer, however the edge decoded it.
    pub block_hashes: &'a [&'a [u8]],
    /// Tokens per chain block.
    pub block_token_counts: &'a [i32],
    /// Canonical token ids, when the gateway sends tokens.
    pub token_ids: &'a [u32],
    /// Prompt text, when the gateway sends text.
    pub prompt_text: &'a str,
    /// The request's time-to-first-token objective in ms (0 = none).
    pub slo_ttft_ms: i32,
    /// The request's cache salt (`""` = none; our extension).
    pub cache_salt: &'a str,
    /// A shadow lookup (the `x-inferencecache-shadow` header): answered as
    /// any other, but it is no request on its way to an engine, so it
    /// records no delivery (no queued work, no tentative holding, nothing
    /// in eviction foresight's model) and credits no LFU hit.
    pub shadow: bool,
}

impl RouteRequest<'_> {
    /// True when the request carries any chain field.
    pub(crate) fn has_chain(&self) -> bool {
        !self.block_hashes.is_empty() || !self.block_token_counts.is_empty()
    }
}

/// What the pipeline answered.
#[derive(Debug, Clone)]
pub struct RouteOutcome {
    /// The reason code.
    pub reason: Reason,
    /// Ranked replicas by id, best first; empty for every no-hint answer.
    pub scores: Vec<ScoreById>,
    /// The names of the scores' ids (read as the response is encoded).
    pub names: ReplicaNames,
    /// Token ids to echo (the prompt_text path only).
    pub echo_tokens: Vec<u32>,
    /// True when the response echoes the request's adapter (answers that
    /// ranked replicas); fail-open envelopes do not.
    pub echo_adapter: bool,
    /// Handler time up to the answer.
    pub latency: Duration,
}

impl RouteOutcome {
    /// A fail-open envelope: no replicas, no adapter echo.
    pub(crate) fn envelope(reason: Reason, latency: Duration, echo_tokens: Vec<u32>) -> Self {
        Self {
            reason,
            scores: Vec::new(),
            names: ReplicaNames::default(),
            echo_tokens,
            echo_adapter: false,
            latency,
        }
    }

    /// An answer from ranked scores (possibly empty), echoing the adapter.
    pub(crate) fn ranked(
        reason: Reason,
        (scores, names): (Vec<ScoreById>, ReplicaNames),
        latency: Duration,
        echo_tokens: Vec<u32>,
    ) -> Self {
        Self {
            reason,
            scores,
            names,
            echo_tokens,
            echo_adapter: true,
            latency,
        }
    }

    /// The single-replica answer of an AFFINITY_HINT: no cache evidence.
    pub(crate) fn affinity_scores(replica: Arc<str>) -> (Vec<ScoreById>, ReplicaNames) {
        let score = ScoreById {
            replica: ReplicaId::listed(0),
            score: 0.0,
            matched_tokens: 0,
            estimated_cache_hit_prob: 0.0,
            tier: Tier::UNSPECIFIED,
        };
        (vec![score], ReplicaNames::listed([replica]))
    }

    /// The name of a score's replica.
    pub fn name(&self, s: &ScoreById) -> &str {
        self.names.name(s.replica)
    }

    /// True when the answer carries replicas (the metrics' `hint_used`).
    pub fn hint_used(&self) -> bool {
        !self.scores.is_empty()
    }
}

/// Equal when everything but the names' storage is: scores compare with
/// their names resolved.
impl PartialEq for RouteOutcome {
    fn eq(&self, o: &Self) -> bool {
        self.reason == o.reason
            && self.echo_tokens == o.echo_tokens
            && self.echo_adapter == o.echo_adapter
            && self.latency == o.latency
            && self.scores.len() == o.scores.len()
            && self.scores.iter().zip(&o.scores).all(|(a, b)| {
                self.name(a) == o.name(b)
                    && ScoreById {
                        replica: b.replica,
                        ..*a
                    } == *b
            })
    }
}

/// The reason code of the index's strategy.
pub fn strategy_reason(s: Strategy) -> Reason {
    match s {
        Strategy::PrefixMatch => Reason::PrefixMatch,
        Strategy::TenantHot => Reason::TenantHot,
        Strategy::UnknownTenant => Reason::UnknownTenant,
        Strategy::UnknownModel => Reason::UnknownModel,
        Strategy::UnknownHashScheme => Reason::UnknownHashScheme,
        Strategy::None => Reason::NoHint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_strategy_maps_to_its_contract_code() {
        let codes = [
            (Strategy::PrefixMatch, "PREFIX_MATCH"),
            (Strategy::TenantHot, "TENANT_HOT"),
            (Strategy::UnknownTenant, "UNKNOWN_TENANT"),
            (Strategy::UnknownModel, "UNKNOWN_MODEL"),
            (Strategy::UnknownHashScheme, "UNKNOWN_HASH_SCHEME"),
            (Strategy::None, "NO_HINT"),
        ];
        for (strategy, code) in codes {
            assert_eq!(strategy_reason(strategy).as_str(), code);
        }
    }
}

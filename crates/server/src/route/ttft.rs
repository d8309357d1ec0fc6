//! Steps 11–13 under the estimated-TTFT ranking (the default; see
//! `inferencecache_index::routing` for the formula). Steps 1–10 (probe,
//! budget, TIMEOUT, POLICY_REQUIRES_CHAIN, dual-input resolution, the
//! minimum-prefix gate) are shared with the contract ranking.
//!
//! The index ranks every live replica of (tenant, model) by estimated time to
//! first token. The handler then:
//! - answers PREFIX_MATCH (the pick first) when the pick holds a match of at
//!   least `minimumMatchedTokens`, crediting LFU hits;
//! - otherwise answers AFFINITY_HINT with the pick when the tenant's
//!   `affinityRouting` allows it, and the index's miss reason (NO_HINT or
//!   UNKNOWN_*) when it does not or nobody is live;
//! - reports every delivered hint back to the index, which queues its
//!   prefill work on the replica (the delivered-hint window) and, unless
//!   `routing.tentativeTTLSeconds` is 0, records the chain as tentative
//!   holdings there (approximate mode). A shadow lookup
//!   (`RouteRequest::shadow`) gets the same answer and delivers nothing.

use super::request::{RouteOutcome, RouteRequest, strategy_reason};
use super::resolve::{ChainHashes, Resolved};
use super::{LookupPipeline, affinity_allowed, affinity_seed, envelope, expired, index_request};
use crate::policy::TenantPolicy;
use inferencecache_index::{
    Delivery, LookupRequest, ReplicaNames, RouteParams, ScoreById, Strategy, TtftRoute,
};
use inferencecache_proto::Reason;
use std::time::Instant;

/// What the ranking decided, before the response takes the echo tokens.
enum Decision {
    Answer {
        reason: Reason,
        scores: (Vec<ScoreById>, ReplicaNames),
    },
    Timeout,
}

impl LookupPipeline {
    pub(super) fn run_ttft(
        &self,
        req: &RouteRequest<'_>,
        policy: &TenantPolicy,
        resolved: Resolved<'_>,
        below_min_prefix: bool,
        start: Instant,
        deadline: Option<Instant>,
    ) -> RouteOutcome {
        let seed = affinity_seed(&resolved);
        let prompt_tokens = prompt_tokens(req, &resolved);
        let decision = match &resolved.chain {
            ChainHashes::Request(h) => self.decide(
                req,
                policy,
                index_request(req, policy, &resolved, h),
                &seed,
                below_min_prefix,
                deadline,
                prompt_tokens,
            ),
            ChainHashes::Computed(h) => self.decide(
                req,
                policy,
                index_request(req, policy, &resolved, h),
                &seed,
                below_min_prefix,
                deadline,
                prompt_tokens,
            ),
        };
        match decision {
            Decision::Timeout => envelope(Reason::Timeout, start, resolved.echo_tokens),
            Decision::Answer { reason, scores } => {
                RouteOutcome::ranked(reason, scores, start.elapsed(), resolved.echo_tokens)
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn decide<H: AsRef<[u8]>>(
        &self,
        req: &RouteRequest<'_>,
        policy: &TenantPolicy,
        ireq: LookupRequest<'_, H>,
        seed: &[u8],
        below_min_prefix: bool,
        deadline: Option<Instant>,
        prompt_tokens: u64,
    ) -> Decision {
        let params = RouteParams {
            weights: policy.ttft,
            min_matched_tokens: policy.minimum_matched_tokens,
            ignore_matches: below_min_prefix,
            seed,
        };
        // Read only when the tenant has a lookup budget (a clock read per
        // lookup otherwise).
        let lookup_start = policy.lookup_timeout.map(|_| Instant::now());
        if crate::decision_log::enabled() {
            crate::decision_log::ranking(&self.index, &ireq, &params, prompt_tokens);
        }
        let TtftRoute {
            mut result,
            pick,
            delivery,
            ..
        } = self.index.route_ttft_by_id(&ireq, &params);
        let over_budget = policy
            .lookup_timeout
            .zip(lookup_start)
            .is_some_and(|(b, t)| t.elapsed() > b);
        if expired(deadline) || over_budget {
            return Decision::Timeout;
        }
        // A shadow lookup is answered as any other and records nothing.
        let delivery = delivery.filter(|_| !req.shadow);
        if result.strategy == Strategy::PrefixMatch {
            self.foresee(&ireq, &result.names, &mut result.scores);
            if let Some(d) = &delivery {
                self.deliver(&ireq, d, policy, prompt_tokens);
            }
            if !req.shadow && !result.hits.is_empty() {
                self.index.credit(&result.hits);
            }
            return Decision::Answer {
                reason: Reason::PrefixMatch,
                scores: (result.scores, result.names),
            };
        }
        if let Some(pick) = pick.filter(|_| affinity_allowed(req, policy)) {
            if let Some(d) = &delivery {
                self.deliver(&ireq, d, policy, prompt_tokens);
            }
            return Decision::Answer {
                reason: Reason::AffinityHint,
                scores: RouteOutcome::affinity_scores(pick),
            };
        }
        Decision::Answer {
            reason: strategy_reason(result.strategy),
            scores: (Vec::new(), ReplicaNames::default()),
        }
    }

    /// Shortens each candidate's claim to what its engine will still hold
    /// behind the requests hinted to it before ([`crate::foresight`]).
    fn foresee<H: AsRef<[u8]>>(
        &self,
        ireq: &LookupRequest<'_, H>,
        names: &ReplicaNames,
        scores: &mut [ScoreById],
    ) {
        if !self.foresight.enabled() {
            return;
        }
        for s in scores {
            s.matched_tokens = self.foresight.claimable(
                ireq.tenant,
                ireq.model,
                names.name(s.replica),
                ireq.block_hashes,
                ireq.block_token_counts,
                s.matched_tokens,
            );
        }
    }

    fn deliver<H: AsRef<[u8]>>(
        &self,
        ireq: &LookupRequest<'_, H>,
        delivery: &Delivery,
        policy: &TenantPolicy,
        prompt_tokens: u64,
    ) {
        self.foresight.delivered(
            ireq.tenant,
            ireq.model,
            &delivery.replica_id,
            ireq.block_hashes,
            prompt_tokens,
        );
        let out = self
            .index
            .record_delivery(ireq, delivery, policy.ttft.tentative_ttl);
        if self.deliveries.is_enabled() && !crate::reserved_tenant::is_reserved(ireq.tenant) {
            self.deliveries
                .record(&delivery.replica_id, delivery.work_us, unix_now_ns());
        }
        let m = &self.metrics.routing;
        m.delivered_hints.inc();
        m.delivered(out.tentative_stored, out.tentative_dropped);
    }
}

/// The request's prompt length in tokens: its `token_ids`, the tokenized
/// `prompt_text`, else its chain's tokens (whole blocks only: a caller that
/// sends hashes does not say how many tokens follow them).
fn prompt_tokens(req: &RouteRequest<'_>, r: &Resolved<'_>) -> u64 {
    if !req.token_ids.is_empty() {
        return req.token_ids.len() as u64;
    }
    if !r.echo_tokens.is_empty() {
        return r.echo_tokens.len() as u64;
    }
    r.counts
        .as_slice()
        .iter()
        .map(|&c| u64::try_from(c).unwrap_or(0))
        .sum()
}

/// Wall-clock now, Unix ns (the index's `SystemClock` reads the same clock).
fn unix_now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

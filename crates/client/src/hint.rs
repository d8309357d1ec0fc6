//! Typed routing hints: what a `LookupRouteResponse` means for a gateway.
//!
//! The contract's forward-compatibility rule decides the parsing: only a
//! known positive reason code with at least one replica is a hint; an empty
//! `replica_scores` is a no-op whatever the code, and a code this SDK does
//! not know is treated as no hint.

use inferencecache_proto::Reason;
use inferencecache_proto::v1alpha1::{CacheTier, LookupRouteResponse, ReplicaScore};
use std::time::Duration;

/// The outcome of one `lookup_route`.
#[derive(Debug, Clone, PartialEq)]
pub struct RouteHint {
    /// What to do with the request.
    pub hint: Hint,
    /// Wall time of the call as the client saw it (never much above the
    /// deadline).
    pub latency: Duration,
    /// The server's own `lookup_latency_us`; 0 when no response arrived.
    pub server_latency_us: i64,
    /// The canonical token ids the server tokenized a `PromptText` into
    /// (echoed only on that path): forward these to the engine so its cache
    /// key matches the routing key. Empty otherwise.
    pub token_ids: Vec<u32>,
}

/// Where to send a request, best candidate first.
#[derive(Debug, Clone, PartialEq)]
pub enum Hint {
    /// Replicas that already cache a leading part of the prompt (`PREFIX_MATCH`).
    PrefixMatch(Vec<Candidate>),
    /// A stable content-hash assignment with no cache evidence
    /// (`AFFINITY_HINT`); route on it like a prefix match so repeats warm up.
    Affinity(Vec<Candidate>),
    /// Replicas that are hot for this tenant (`TENANT_HOT`).
    TenantHot(Vec<Candidate>),
    /// No hint: route as you would without the cache plane.
    NoHint(NoHintReason),
}

/// One ranked replica of a hint.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// The replica to send the request to.
    pub replica_id: String,
    /// Ranking score (higher is better).
    pub score: f32,
    /// Prompt tokens the replica already caches (0 for affinity/tenant-hot).
    pub matched_tokens: i32,
    /// The server's estimate that the request hits the cache there.
    pub hit_probability: f32,
    /// The tier the matched prefix is served from.
    pub tier: Tier,
}

/// Cache tier, most local first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Tier {
    /// No per-prefix evidence (tenant-hot and affinity hints), or a value
    /// newer than this SDK.
    #[default]
    Unspecified,
    /// Engine KV cache (GPU memory).
    T1,
    /// External offload (e.g. LMCache): reloadable.
    T2,
    /// Remote / disaggregated.
    T3,
}

impl Tier {
    /// The wire enum value → tier; unknown values are `Unspecified`.
    pub fn from_wire(value: i32) -> Self {
        match CacheTier::try_from(value) {
            Ok(CacheTier::T1) => Self::T1,
            Ok(CacheTier::T2) => Self::T2,
            Ok(CacheTier::T3) => Self::T3,
            _ => Self::Unspecified,
        }
    }

    /// Short label: `T1`, `T2`, `T3` or `-`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unspecified => "-",
            Self::T1 => "T1",
            Self::T2 => "T2",
            Self::T3 => "T3",
        }
    }
}

/// Why there is no hint. The first group are server reason codes; the last
/// three are client-side outcomes that never appear on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoHintReason {
    /// `NO_HINT`: nothing known about this prefix.
    NoHint,
    /// `TIMEOUT`: the server's own lookup budget (policy `lookupTimeoutMs`) ran out.
    Timeout,
    /// `POLICY_REQUIRES_CHAIN`: the tenant's policy wants `block_hashes`.
    PolicyRequiresChain,
    /// `UNKNOWN_TENANT`: the index has no entries for this tenant — usually
    /// a gateway/producer tenant mismatch.
    UnknownTenant,
    /// `UNKNOWN_MODEL`: the tenant is known, this model is not.
    UnknownModel,
    /// `UNKNOWN_HASH_SCHEME`: tenant and model known, not under this hash scheme.
    UnknownHashScheme,
    /// A reason code this SDK does not know, or a positive code with no
    /// replicas; carries the code as sent.
    UnknownReason(String),
    /// Client side: no answer within the lookup deadline.
    DeadlineExceeded,
    /// Client side: the server could not be reached.
    Unavailable,
    /// Client side: any other failure (a gRPC error status, a bad request).
    Error(String),
}

impl NoHintReason {
    /// The wire reason code, or a client-side label (`DEADLINE_EXCEEDED`,
    /// `UNAVAILABLE`, `ERROR`) for outcomes that never reached the wire.
    pub fn code(&self) -> &str {
        match self {
            Self::NoHint => Reason::NoHint.as_str(),
            Self::Timeout => Reason::Timeout.as_str(),
            Self::PolicyRequiresChain => Reason::PolicyRequiresChain.as_str(),
            Self::UnknownTenant => Reason::UnknownTenant.as_str(),
            Self::UnknownModel => Reason::UnknownModel.as_str(),
            Self::UnknownHashScheme => Reason::UnknownHashScheme.as_str(),
            Self::UnknownReason(code) => code,
            Self::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Self::Unavailable => "UNAVAILABLE",
            Self::Error(_) => "ERROR",
        }
    }

    /// True for the diagnostic codes that point at a gateway/producer key
    /// mismatch: worth a log line or a metric, still routed normally.
    pub fn is_misconfiguration(&self) -> bool {
        matches!(
            self,
            Self::UnknownTenant | Self::UnknownModel | Self::UnknownHashScheme
        )
    }
}

impl Hint {
    /// The top-ranked candidate; `None` for `NoHint`.
    pub fn best(&self) -> Option<&Candidate> {
        self.candidates().first()
    }

    /// All candidates, best first (empty for `NoHint`).
    pub fn candidates(&self) -> &[Candidate] {
        match self {
            Self::PrefixMatch(c) | Self::Affinity(c) | Self::TenantHot(c) => c,
            Self::NoHint(_) => &[],
        }
    }

    /// True unless `NoHint`.
    pub fn is_hint(&self) -> bool {
        !matches!(self, Self::NoHint(_))
    }

    /// The reason code: the wire code for server answers, a client-side
    /// label for failures (see [`NoHintReason::code`]).
    pub fn reason_code(&self) -> &str {
        match self {
            Self::PrefixMatch(_) => Reason::PrefixMatch.as_str(),
            Self::Affinity(_) => Reason::AffinityHint.as_str(),
            Self::TenantHot(_) => Reason::TenantHot.as_str(),
            Self::NoHint(reason) => reason.code(),
        }
    }

    /// Interprets a response per the contract's fail-open and
    /// forward-compatibility rules.
    pub fn from_response(response: &LookupRouteResponse) -> Self {
        let candidates = || {
            response
                .replica_scores
                .iter()
                .map(Candidate::from_wire)
                .collect::<Vec<_>>()
        };
        let code = response.reason_code.as_str();
        if code.is_empty() {
            return Self::NoHint(NoHintReason::NoHint);
        }
        let Some(reason) = Reason::from_wire(code) else {
            return Self::NoHint(NoHintReason::UnknownReason(code.to_owned()));
        };
        if reason.is_hint() && response.replica_scores.is_empty() {
            // Empty replicas make any positive code a no-op (fail open); keep
            // the code visible for diagnostics.
            return Self::NoHint(NoHintReason::UnknownReason(code.to_owned()));
        }
        match reason {
            Reason::PrefixMatch => Self::PrefixMatch(candidates()),
            Reason::AffinityHint => Self::Affinity(candidates()),
            Reason::TenantHot => Self::TenantHot(candidates()),
            Reason::NoHint => Self::NoHint(NoHintReason::NoHint),
            Reason::Timeout => Self::NoHint(NoHintReason::Timeout),
            Reason::PolicyRequiresChain => Self::NoHint(NoHintReason::PolicyRequiresChain),
            Reason::UnknownTenant => Self::NoHint(NoHintReason::UnknownTenant),
            Reason::UnknownModel => Self::NoHint(NoHintReason::UnknownModel),
            Reason::UnknownHashScheme => Self::NoHint(NoHintReason::UnknownHashScheme),
            // RenderTemplate's codes are not LookupRoute answers.
            Reason::Ok | Reason::TemplateNotFound | Reason::RenderError => {
                Self::NoHint(NoHintReason::UnknownReason(code.to_owned()))
            }
        }
    }
}

impl Candidate {
    /// Converts one wire `ReplicaScore`.
    pub fn from_wire(score: &ReplicaScore) -> Self {
        Self {
            replica_id: score.replica_id.clone(),
            score: score.score,
            matched_tokens: score.matched_tokens,
            hit_probability: score.estimated_cache_hit_prob,
            tier: Tier::from_wire(score.tier),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(code: &str, replicas: &[&str]) -> LookupRouteResponse {
        LookupRouteResponse {
            reason_code: code.into(),
            replica_scores: replicas
                .iter()
                .map(|r| ReplicaScore {
                    replica_id: (*r).into(),
                    tier: CacheTier::T2 as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn positive_codes_with_replicas_are_hints() {
        let h = Hint::from_response(&response("PREFIX_MATCH", &["a", "b"]));
        assert_eq!(h.reason_code(), "PREFIX_MATCH");
        assert_eq!(h.best().map(|c| c.replica_id.as_str()), Some("a"));
        assert_eq!(h.candidates()[1].tier, Tier::T2);
        assert!(matches!(
            Hint::from_response(&response("AFFINITY_HINT", &["a"])),
            Hint::Affinity(_)
        ));
        assert!(matches!(
            Hint::from_response(&response("TENANT_HOT", &["a"])),
            Hint::TenantHot(_)
        ));
    }

    #[test]
    fn empty_replicas_are_no_hint_whatever_the_code() {
        let h = Hint::from_response(&response("PREFIX_MATCH", &[]));
        assert_eq!(
            h,
            Hint::NoHint(NoHintReason::UnknownReason("PREFIX_MATCH".into()))
        );
        assert!(h.best().is_none());
    }

    #[test]
    fn unknown_codes_are_no_hint_even_with_replicas() {
        let h = Hint::from_response(&response("FUTURE_CODE", &["a"]));
        assert_eq!(
            h,
            Hint::NoHint(NoHintReason::UnknownReason("FUTURE_CODE".into()))
        );
        assert_eq!(h.reason_code(), "FUTURE_CODE");
    }

    #[test]
    fn diagnostic_codes_map_one_to_one() {
        for (code, reason) in [
            ("NO_HINT", NoHintReason::NoHint),
            ("TIMEOUT", NoHintReason::Timeout),
            ("POLICY_REQUIRES_CHAIN", NoHintReason::PolicyRequiresChain),
            ("UNKNOWN_TENANT", NoHintReason::UnknownTenant),
            ("UNKNOWN_MODEL", NoHintReason::UnknownModel),
            ("UNKNOWN_HASH_SCHEME", NoHintReason::UnknownHashScheme),
        ] {
            let h = Hint::from_response(&response(code, &[]));
            assert_eq!(h, Hint::NoHint(reason), "{code}");
            assert_eq!(h.reason_code(), code);
        }
    }

    #[test]
    fn unknown_tier_values_are_unspecified() {
        assert_eq!(Tier::from_wire(99), Tier::Unspecified);
        assert_eq!(Tier::from_wire(1), Tier::T1);
    }
}

//! CachePolicy version 8: the `routing` object (estimated-TTFT ranking,
//! approximate mode) and its resolution.
//!
//! ```json
//! {"version": 8, "policies": [{"namespace": "team-a", "routing": {
//!   "ranking": "ttft",                 // or "contract"; null = the server's --ranking
//!   "prefillMicrosPerToken": 50,       // uncached prompt token cost
//!   "requestOverheadMicros": 5000,     // fixed cost of a prefill
//!   "pressureMicros": 50000,           // queued work per unit of reported pressure
//!   "t2ReloadCost": 0.25,              // host-memory match: fraction of a recompute
//!   "t3ReloadCost": 0.75,              // disk / remote / shared-pool match
//!   "affinityMaxPressure": 1.0,        // skip replicas at or above (unless they match)
//!   "tentativeTTLSeconds": 120         // approximate mode; 0 = off
//! }}]}
//! ```
//!
//! Every field is optional; null and absent take the default. Negative
//! numbers are clamped to 0 and reload costs to [0, 1]. A `routing` object
//! in a body of version 3–7 is ignored (those versions are resolved exactly
//! as before).

use inferencecache_index::{RankingMode, TtftWeights};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The `routing` object of a v8 policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RoutingWire {
    /// `ttft` or `contract`; null = the server's `--ranking`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranking: Option<String>,
    /// µs per uncached prompt token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefill_micros_per_token: Option<f64>,
    /// µs of fixed cost per prefill.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_overhead_micros: Option<f64>,
    /// µs of queued work per unit of reported pressure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pressure_micros: Option<f64>,
    /// Reload cost of a T2 match, as a fraction of recomputing it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t2_reload_cost: Option<f64>,
    /// Reload cost of a T3 match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub t3_reload_cost: Option<f64>,
    /// Pressure at or above which a replica without a match is skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_max_pressure: Option<f32>,
    /// Lifetime of tentative holdings, seconds; 0 turns approximate mode off.
    #[serde(
        default,
        rename = "tentativeTTLSeconds",
        skip_serializing_if = "Option::is_none"
    )]
    pub tentative_ttl_seconds: Option<f64>,
}

/// Why a `routing` object was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("routing.ranking must be \"ttft\" or \"contract\", got {0:?}")]
pub struct BadRanking(
    /// The refused value.
    pub String,
);

fn non_negative(v: Option<f64>, default: f64) -> f64 {
    v.filter(|x| x.is_finite()).map_or(default, |x| x.max(0.0))
}

impl RoutingWire {
    /// Resolves into (ranking override, weights).
    pub fn resolve(&self) -> Result<(Option<RankingMode>, TtftWeights), BadRanking> {
        let ranking = match self.ranking.as_deref() {
            None | Some("") => None,
            Some(s) => Some(RankingMode::parse(s).ok_or_else(|| BadRanking(s.to_owned()))?),
        };
        let d = TtftWeights::default();
        let unit = |v: Option<f64>, default: f64| non_negative(v, default).min(1.0);
        let ttl = non_negative(self.tentative_ttl_seconds, d.tentative_ttl.as_secs_f64());
        Ok((
            ranking,
            TtftWeights {
                prefill_us_per_token: non_negative(
                    self.prefill_micros_per_token,
                    d.prefill_us_per_token,
                ),
                request_overhead_us: non_negative(
                    self.request_overhead_micros,
                    d.request_overhead_us,
                ),
                pressure_us: non_negative(self.pressure_micros, d.pressure_us),
                t2_reload: unit(self.t2_reload_cost, d.t2_reload),
                t3_reload: unit(self.t3_reload_cost, d.t3_reload),
                affinity_max_pressure: self
                    .affinity_max_pressure
                    .filter(|x| x.is_finite())
                    .map_or(d.affinity_max_pressure, |x| x.max(0.0)),
                // A day at most: tentative holdings are meant to be short-lived.
                tentative_ttl: Duration::from_secs_f64(ttl.min(86_400.0)),
            },
        ))
    }
}

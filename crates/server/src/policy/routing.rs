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
//!   "tentativeTTLSeconds": 120,        // approximate mode; 0 = off (the tenant's
//!                                      // TTL on replicas that publish no KV events)
//!   "loadBound": 1.25                  // skip replicas over 1.25 × the fleet's mean
//!                                      // recent hints (+ 1); 0 = off
//! }}]}
//! ```
//!
//! Every field is optional; null and absent take the default. The strict
//! decoder refuses numbers outside the CachePolicy schema's ranges (negative,
//! reload costs above 1, holdings over a day: `validate.rs`); resolution
//! clamps them, which is what `--lenient-policy-validation` gets. A `routing`
//! object in a body of version 3–7 is ignored (those versions are resolved
//! exactly as before).

pub use inferencecache_control_api::policy::RoutingWire;
use inferencecache_index::{RankingMode, TtftWeights};
use std::time::Duration;

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

/// Resolves a `routing` object into (ranking override, weights).
pub fn resolve_routing(w: &RoutingWire) -> Result<(Option<RankingMode>, TtftWeights), BadRanking> {
    let ranking = match w.ranking.as_deref() {
        None | Some("") => None,
        Some(s) => Some(RankingMode::parse(s).ok_or_else(|| BadRanking(s.to_owned()))?),
    };
    let d = TtftWeights::default();
    let unit = |v: Option<f64>, default: f64| non_negative(v, default).min(1.0);
    let ttl = non_negative(w.tentative_ttl_seconds, d.tentative_ttl.as_secs_f64());
    Ok((
        ranking,
        TtftWeights {
            prefill_us_per_token: non_negative(w.prefill_micros_per_token, d.prefill_us_per_token),
            request_overhead_us: non_negative(w.request_overhead_micros, d.request_overhead_us),
            pressure_us: non_negative(w.pressure_micros, d.pressure_us),
            t2_reload: unit(w.t2_reload_cost, d.t2_reload),
            t3_reload: unit(w.t3_reload_cost, d.t3_reload),
            affinity_max_pressure: w
                .affinity_max_pressure
                .filter(|x| x.is_finite())
                .map_or(d.affinity_max_pressure, |x| x.max(0.0)),
            // A day at most: tentative holdings are meant to be short-lived.
            tentative_ttl: Duration::from_secs_f64(ttl.min(86_400.0)),
            load_bound: non_negative(w.load_bound, d.load_bound),
        },
    ))
}

//! Ranking math (§2.6.2–§2.6.5), kept bit-exact with the reference formulas.

use crate::config::RankingConfig;

/// Linear freshness: `ttl <= 0` → 0; age ≤ 0 → 1; age ≥ ttl → 0; else
/// `f32(1 − f64(age)/f64(ttl))`. All times in nanoseconds.
#[inline]
pub fn freshness(now_ns: i64, last_seen_ns: i64, ttl_ns: i64) -> f32 {
    if ttl_ns <= 0 {
        return 0.0;
    }
    let age = now_ns.saturating_sub(last_seen_ns);
    if age <= 0 {
        return 1.0;
    }
    if age >= ttl_ns {
        return 0.0;
    }
    (1.0 - age as f64 / ttl_ns as f64) as f32
}

/// Distinguishing power: `total <= 1` or `matching < 0` → 1; `matching >= total`
/// → 0; else `1 − matching/total` (f64).
#[inline]
pub fn distinguishing_power(matching: i64, total: i64) -> f64 {
    if total <= 1 || matching < 0 {
        return 1.0;
    }
    if matching >= total {
        return 0.0;
    }
    1.0 - matching as f64 / total as f64
}

/// `clamp(1 − weight × pressure, 0, 1)` in f32.
#[inline]
pub fn pressure_factor(weight: f32, pressure: f32) -> f32 {
    let pf = 1.0 - weight * pressure;
    if pf.is_nan() {
        return 0.0;
    }
    pf.clamp(0.0, 1.0)
}

/// SLO bias coefficient `c`: the tight bias if `0 < ttft < tight` and both
/// knobs are positive, else 0. The bias is `1 + freshness × c`.
#[inline]
pub fn slo_coefficient(r: &RankingConfig, ttft_ms: i32) -> f32 {
    if r.slo_tight_ttft_ms > 0
        && r.slo_tight_bias > 0.0
        && ttft_ms > 0
        && ttft_ms < r.slo_tight_ttft_ms
    {
        r.slo_tight_bias
    } else {
        0.0
    }
}

/// Exact/chain score: `f32(tokens) * fresh * pf * (1 + fresh * c)`, left to
/// right; entries with `tokens <= 0` score 0.
#[inline]
pub fn prefix_score(tokens: i32, fresh: f32, pf: f32, c: f32) -> f32 {
    if tokens <= 0 {
        return 0.0;
    }
    let slo = 1.0 + fresh * c;
    tokens as f32 * fresh * pf * slo
}

/// TENANT_HOT recency: 1 if age ≤ 0, 0 if age ≥ max, else `1 − f32(age)/f32(max)`.
#[inline]
pub fn recency(age_ns: i64, max_age_ns: i64) -> f32 {
    if age_ns <= 0 {
        return 1.0;
    }
    if age_ns >= max_age_ns {
        return 0.0;
    }
    1.0 - age_ns as f32 / max_age_ns as f32
}

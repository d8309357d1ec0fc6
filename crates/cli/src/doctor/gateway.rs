//! `gateway.*` checks (`doctor --gateway URL`): the gateway's engines are
//! up, and its hints hold when the engines judge them (the accuracy series
//! every response's `usage.prompt_tokens_details.cached_tokens` feeds).

use super::http::{Answer, call, samples};
use super::report::{Check, Status};
use std::collections::BTreeMap;
use std::time::Duration;

/// Share of checked responses an engine may reuse less than the hint
/// promised before doctor calls the hints drifting.
const OVERCLAIM_WARN: f64 = 0.01;

async fn get(url: &str, timeout: Duration) -> Result<Answer, String> {
    call(url, None, None, timeout).await
}

/// Sums a per-worker counter by its `worker` label.
fn per_worker(body: &str, name: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (series, v) in samples(body, name) {
        let worker = series
            .split("worker=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default();
        *out.entry(worker.to_owned()).or_insert(0.0) += v;
    }
    out
}

/// The accuracy finding from a gateway's `/metrics` body.
pub(super) fn accuracy(base: &str, body: &str) -> Check {
    let name = format!("gateway.hints {base}");
    let checks = per_worker(body, "inferencecache_gateway_hint_checks_total");
    let over = per_worker(body, "inferencecache_gateway_hint_overclaims_total");
    let total: f64 = checks.values().sum();
    if total == 0.0 {
        return Check::new(
            name,
            Status::Warn,
            "no response has been compared with its hint yet",
            "start the engines with --enable-prompt-tokens-details (streamed requests also need \
             stream_options.include_usage), or send traffic first",
        );
    }
    let drifting: Vec<String> = checks
        .iter()
        .filter_map(|(w, &n)| {
            let o = over.get(w).copied().unwrap_or(0.0);
            (n > 0.0 && o / n > OVERCLAIM_WARN).then(|| format!("{w}: {o} of {n}"))
        })
        .collect();
    if drifting.is_empty() {
        Check::ok(
            name,
            format!(
                "{total} responses checked; the engines reused at least what the hints promised"
            ),
        )
    } else {
        Check::new(
            name,
            Status::Warn,
            format!(
                "hints over-claimed (the engine reused less than promised) on {}",
                drifting.join(", ")
            ),
            "the index holds blocks the engine no longer has or never shared: check that the \
             gateway's --block-size matches the engines', that each engine's KV events reach \
             the gateway (its subscriber's replay endpoint), and whether the traffic uses \
             cache_salt (not yet part of the lookup)",
        )
    }
}

/// Runs the gateway checks for `base`.
pub(super) async fn checks(base: &str, timeout: Duration, out: &mut Vec<Check>) {
    match get(&format!("{base}/health"), timeout).await {
        Ok(a) if a.status == 200 => out.push(Check::ok(
            format!("gateway.engines {base}"),
            format!("healthy: {}", a.body.trim()),
        )),
        Ok(a) => out.push(Check::fail(
            format!("gateway.engines {base}"),
            format!("/health answered {}: {}", a.status, a.body.trim()),
            "no engine passes GET /health: check the engines and the gateway's --engine URLs",
        )),
        Err(e) => {
            out.push(Check::fail(
                format!("gateway.engines {base}"),
                e,
                "the gateway is not running or --gateway is wrong (its --listen address)",
            ));
            out.push(Check::skip(
                format!("gateway.hints {base}"),
                "the gateway is not reachable",
            ));
            return;
        }
    }
    match get(&format!("{base}/metrics"), timeout).await {
        Ok(a) if a.status == 200 => out.push(accuracy(base, &a.body)),
        Ok(a) => out.push(Check::fail(
            format!("gateway.hints {base}"),
            format!("/metrics answered {}", a.status),
            "--gateway must be the gateway's --listen address",
        )),
        Err(e) => out.push(Check::fail(
            format!("gateway.hints {base}"),
            e,
            "the gateway's /metrics is not reachable",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overclaims_past_one_percent_are_a_finding() {
        let ok = "inferencecache_gateway_hint_checks_total{worker=\"a\"} 200\n\
                  inferencecache_gateway_hint_overclaims_total{worker=\"a\"} 1\n";
        assert_eq!(accuracy("g", ok).status, Status::Ok);
        let bad = "inferencecache_gateway_hint_checks_total{worker=\"a\"} 100\n\
                   inferencecache_gateway_hint_checks_total{worker=\"b\"} 100\n\
                   inferencecache_gateway_hint_overclaims_total{worker=\"b\"} 5\n";
        let c = accuracy("g", bad);
        assert_eq!(c.status, Status::Warn);
        assert!(c.detail.contains("b: 5 of 100"), "{}", c.detail);
        assert_eq!(accuracy("g", "").status, Status::Warn);
    }
}

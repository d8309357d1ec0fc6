//! Why a request went where it did: debug-level logs of each default-ranking
//! decision (every candidate's estimate) and of the load reports that move
//! them (an engine's counts, a caller's in-flight counts), under the target
//! [`TARGET`]. Off unless that target is enabled (`INFERENCECACHE_LOG=
//! info,inferencecache::decisions=debug`): then each lookup is ranked a
//! second time, read-only, to list the estimates, so it is a diagnosis
//! switch, not something to leave on under load. Issue 33's reporting
//! caller's split (new prefixes sent to one engine for most of a second) is
//! what it was added to read.

use inferencecache_index::{CacheUpdate, Index, LookupRequest, RouteParams};

/// The log target of every line here.
pub const TARGET: &str = "inferencecache::decisions";

/// Whether decisions are logged (one cached callsite check).
pub(crate) fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// Logs the ranking `ireq` gets now (before its delivery is recorded).
pub(crate) fn ranking<H: AsRef<[u8]>>(
    index: &Index,
    ireq: &LookupRequest<'_, H>,
    params: &RouteParams<'_>,
    prompt_tokens: u64,
) {
    let r = index.route_ttft_explained(ireq, params);
    let estimates: Vec<String> = r
        .estimates
        .iter()
        .map(|e| {
            format!(
                "{} matched={} tentative={} queued_ms={:.1} work_ms={:.1} pressure={:.2} ttft_ms={:.1}",
                e.replica_id,
                e.matched_tokens,
                e.tentative_tokens,
                e.queued_us / 1e3,
                e.work_us / 1e3,
                e.pressure,
                e.ttft_us / 1e3
            )
        })
        .collect();
    tracing::debug!(
        target: TARGET,
        tenant = ireq.tenant,
        model = ireq.model,
        prompt_tokens,
        pick = r.delivery.as_ref().map_or("", |d| &*d.replica_id),
        strategy = ?r.result.strategy,
        estimates = ?estimates,
        "route"
    );
}

/// Logs an engine load report as it reaches the index.
pub(crate) fn engine_load(u: &CacheUpdate) {
    if let Some(l) = u.stats.as_ref().and_then(|s| s.load.as_ref()) {
        tracing::debug!(
            target: TARGET,
            replica = %u.replica_id,
            running = l.running_requests,
            waiting = l.waiting_requests,
            kv_usage = l.kv_cache_usage,
            "engine load"
        );
    }
}

/// Logs a caller's count for one replica (`in_flight` requests with
/// `prefill_tokens` to prefill, counted `age_ns` ago) and whether it was
/// applied.
pub(crate) fn caller_load(
    caller: &str,
    replica: &str,
    (in_flight, prefill_tokens): (u32, u64),
    age_ns: i64,
    applied: bool,
) {
    tracing::debug!(
        target: TARGET,
        caller,
        replica,
        in_flight,
        prefill_tokens,
        age_ms = age_ns as f64 / 1e6,
        applied,
        "caller load"
    );
}

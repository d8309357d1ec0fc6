//! Remote mode (`--server`): this gateway's requests in flight, reported to
//! the server (`ReportCallerLoad`, our extension of v1alpha1), so the
//! server's load estimate (and, on a bus, every server replica's) counts
//! what the gateway knows exactly instead of guessing from the hints it
//! delivered (issue 36, item 4). The server side: `inferencecache_server`
//! `replicate::caller_load`.
//!
//! The engines' counts (requests in flight, prompt tokens still to
//! prefill) are compared with the last report whenever one changes
//! (`engine::LOAD_CHANGED`; an idle gateway does not wake), at most every
//! [`TICK`] so a burst of requests is one report; a change is reported at
//! once, and unchanged non-zero counts every [`REFRESH`] (the server
//! forgets a report after 2 s). A server that does not know the
//! call (the reference's, or ours before it) answers UNIMPLEMENTED: the
//! loop logs that once and stops. Reporting never blocks a request: it runs
//! beside them, each call bounded by [`CALL_TIMEOUT`].

use crate::engine::{EngineSet, LOAD_CHANGED};
use inferencecache_client::Client;
use inferencecache_index::{Clock, SystemClock};
use inferencecache_proto::v1alpha1::{CallerLoadReport, CallerReplicaLoad};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The shortest time between two comparisons of the counts.
pub(crate) const TICK: Duration = Duration::from_millis(10);
/// Unchanged non-zero counts are reported again this often.
pub(crate) const REFRESH: Duration = Duration::from_millis(500);
/// One report's bound.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// This process as a caller: host name, process id and start time (a
/// restarted gateway is another caller; its old report ages out).
pub(crate) fn caller_id() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "gateway".into());
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("{host}/{}/{t}", std::process::id())
}

/// The engines' counts as reported.
fn counts(engines: &EngineSet) -> Vec<CallerReplicaLoad> {
    engines
        .snapshot()
        .iter()
        .map(|e| CallerReplicaLoad {
            replica_id: e.id.to_string(),
            in_flight: u32::try_from(e.in_flight()).unwrap_or(u32::MAX),
            prefill_tokens: e.pending_prefill(),
        })
        .collect()
}

/// Reports until `cancel` (module docs).
pub(crate) async fn report_loop(
    client: Client,
    engines: Arc<EngineSet>,
    caller: String,
    cancel: CancellationToken,
) {
    let mut last: Vec<CallerReplicaLoad> = Vec::new();
    let mut sent_at: Option<Instant> = None;
    let mut raw = client.raw();
    loop {
        // Registered before the counts are read: a change after the read
        // wakes the next wait.
        let changed = LOAD_CHANGED.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let now = counts(&engines);
        let busy = now.iter().any(|c| c.in_flight > 0 || c.prefill_tokens > 0);
        let due = sent_at.is_none_or(|t| t.elapsed() >= REFRESH);
        if now == last && !(busy && due) {
            // Nothing to say until a count changes, or (while busy) the
            // refresh is due.
            let refresh = sent_at.map_or(REFRESH, |t| REFRESH.saturating_sub(t.elapsed()));
            tokio::select! {
                () = cancel.cancelled() => return,
                () = &mut changed => {}
                () = tokio::time::sleep(refresh), if busy => {}
            }
            // A burst of changes is one comparison.
            tokio::select! {
                () = cancel.cancelled() => return,
                () = tokio::time::sleep(TICK) => {}
            }
            continue;
        }
        let report = CallerLoadReport {
            caller: caller.clone(),
            timestamp_us: SystemClock.now_ns() / 1_000,
            replicas: now.clone(),
        };
        match tokio::time::timeout(CALL_TIMEOUT, raw.report_caller_load(report)).await {
            Ok(Ok(_)) => {}
            Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => {
                tracing::warn!(
                    "the server does not take ReportCallerLoad (an older or the reference server): its load estimate will not count this gateway's requests in flight"
                );
                return;
            }
            Ok(Err(s)) => tracing::debug!(error = %s, "caller load report failed"),
            Err(_) => tracing::debug!("caller load report timed out"),
        }
        // Sent or not, the next report is due on the next change or refresh
        // (a lost one is replaced, never retried).
        last = now;
        sent_at = Some(Instant::now());
    }
}

//! A caller's requests in flight, in every server replica's load (issue 36,
//! item 4).
//!
//! A gateway that asks this server for hints (`inferencecache gateway
//! --server`) knows exactly what it has sent to each engine and not yet seen
//! finish: the requests, and the prompt tokens the engine must still
//! prefill. The server's own view is a guess: the hints it delivered (the
//! gateway may send a request elsewhere), drained at the estimated speed,
//! corrected by the engine's load report once a second. So the gateway
//! reports its counts (`ReportCallerLoad`, our extension of v1alpha1) when
//! they change (and every 500 ms while anything is in flight), and each
//! report restarts that replica's queue from the exact work, as an engine
//! report does, held undrained for [`HOLD`] (`inferencecache_index`
//! `Index::record_caller_load`): a request in flight is not done because
//! its estimated work has passed.
//!
//! - **Several callers**: each one's last report per engine replica is kept
//!   (at most [`MAX_CALLERS`] per replica, [`MAX_REPLICAS`] replicas), and
//!   the queue restarts from their sum; a report older than [`MAX_AGE`]
//!   no longer counts (a gateway that stopped reporting is gone, and the
//!   engine's own reports have counted its requests since).
//! - **Several server replicas**: in bus mode every accepted report is also
//!   published on the bus's load subject ([`KIND_CALLER_LOAD`], beside the
//!   delivered-hint batches, fire-and-forget), and every other replica
//!   applies it the same way, so a gateway attached to one server moves the
//!   picks of all of them within the bus lag.

use inferencecache_bus::load::{CallerLoadBatch, CallerLoadEntry};
use inferencecache_index::Index;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

pub use inferencecache_bus::load::KIND_CALLER_LOAD;

/// A caller's report counts for this long after its observation.
pub const MAX_AGE: Duration = Duration::from_secs(2);
/// A caller's count holds (its work does not drain) this long: callers
/// report again within 500 ms while anything is in flight (the gateway's
/// refresh), and at once when a count changes.
pub const HOLD: Duration = Duration::from_millis(750);
/// Callers remembered per engine replica at most (past it the oldest goes).
pub const MAX_CALLERS: usize = 64;
/// Engine replicas remembered at most (past it the table starts over).
pub const MAX_REPLICAS: usize = 65_536;
/// Entries waiting to be published at most (past it new ones are dropped
/// and counted: a later report replaces them anyway).
const MAX_OUTBOX: usize = 4_096;

/// One caller's last report for one engine replica.
#[derive(Debug, Clone, Copy)]
struct Entry {
    in_flight: u32,
    prefill_tokens: u64,
    at_ns: i64,
}

/// What one report says about one engine replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallerReport<'a> {
    /// The reporting caller (unique per gateway process).
    pub caller: &'a str,
    /// The engine replica.
    pub replica_id: &'a str,
    /// Requests sent there and not finished.
    pub in_flight: u32,
    /// Their prompt tokens still to prefill.
    pub prefill_tokens: u64,
    /// When the caller observed them, Unix ns.
    pub at_ns: i64,
}

/// Every caller's last report per replica, and the ones to publish.
#[derive(Debug, Default)]
pub struct CallerLoads {
    by_replica: Mutex<HashMap<String, HashMap<String, Entry>>>,
    outbox: Mutex<Vec<CallerLoadEntry>>,
    sharing: AtomicBool,
    published: Notify,
}

impl CallerLoads {
    /// Publishes accepted reports on the bus from now on (bus mode).
    pub fn share(&self) {
        self.sharing.store(true, Ordering::Release);
    }

    /// Applies `r` at `now_ns` (a local report when `local`: then also
    /// queued for the bus). False when the replica is unknown to the index
    /// or the report is too old (nothing applied).
    pub fn apply(&self, index: &Index, r: &CallerReport<'_>, now_ns: i64, local: bool) -> bool {
        let max_age = i64::try_from(MAX_AGE.as_nanos()).unwrap_or(i64::MAX);
        if now_ns.saturating_sub(r.at_ns) > max_age {
            return false;
        }
        let (in_flight, prefill_tokens) = {
            let mut m = self.by_replica.lock().unwrap_or_else(|e| e.into_inner());
            if !m.contains_key(r.replica_id) && m.len() >= MAX_REPLICAS {
                m.clear();
            }
            let callers = m.entry(r.replica_id.to_owned()).or_default();
            callers.retain(|_, e| now_ns.saturating_sub(e.at_ns) <= max_age);
            let entry = Entry {
                in_flight: r.in_flight,
                prefill_tokens: r.prefill_tokens,
                at_ns: r.at_ns,
            };
            match callers.get_mut(r.caller) {
                // A report older than the caller's last one says nothing new.
                Some(e) if e.at_ns > r.at_ns => return false,
                Some(e) => *e = entry,
                None => {
                    if callers.len() >= MAX_CALLERS {
                        if let Some(oldest) = callers
                            .iter()
                            .min_by_key(|(_, e)| e.at_ns)
                            .map(|(k, _)| k.clone())
                        {
                            callers.remove(&oldest);
                        }
                    }
                    callers.insert(r.caller.to_owned(), entry);
                }
            }
            callers.values().fold((0u32, 0u64), |(n, t), e| {
                (
                    n.saturating_add(e.in_flight),
                    t.saturating_add(e.prefill_tokens),
                )
            })
        };
        let hold = i64::try_from(HOLD.as_nanos()).unwrap_or(i64::MAX);
        let applied = index.record_caller_load(
            r.replica_id,
            in_flight,
            prefill_tokens,
            r.at_ns,
            r.at_ns.saturating_add(hold),
        );
        if crate::decision_log::enabled() {
            crate::decision_log::caller_load(
                r.caller,
                r.replica_id,
                (r.in_flight, r.prefill_tokens),
                now_ns.saturating_sub(r.at_ns),
                applied,
            );
        }
        if applied && local && self.sharing.load(Ordering::Acquire) {
            let mut out = self.outbox.lock().unwrap_or_else(|e| e.into_inner());
            if out.len() < MAX_OUTBOX {
                out.push(CallerLoadEntry {
                    caller: r.caller.to_owned(),
                    replica_id: r.replica_id.to_owned(),
                    in_flight: r.in_flight,
                    prefill_tokens: r.prefill_tokens,
                    at_unix_ns: r.at_ns,
                });
            }
            drop(out);
            self.published.notify_one();
        }
        applied
    }

    /// Waits until a local report is queued for the bus.
    pub async fn wait_queued(&self) {
        self.published.notified().await;
    }

    /// The queued reports as one batch from `origin` (empty: none queued).
    pub fn take_batch(&self, origin: &str, now_ns: i64) -> Option<CallerLoadBatch> {
        let loads = std::mem::take(&mut *self.outbox.lock().unwrap_or_else(|e| e.into_inner()));
        (!loads.is_empty()).then(|| CallerLoadBatch {
            origin: origin.to_owned(),
            sent_unix_ns: now_ns,
            loads,
        })
    }

    /// Applies a peer's batch at `now_ns` (its own batches skipped):
    /// (applied, not applied).
    pub fn apply_batch(
        &self,
        index: &Index,
        origin: &str,
        batch: &CallerLoadBatch,
        now_ns: i64,
    ) -> (u64, u64) {
        if batch.origin == origin {
            return (0, batch.loads.len() as u64);
        }
        let mut n = (0, 0);
        for e in &batch.loads {
            let r = CallerReport {
                caller: &e.caller,
                replica_id: &e.replica_id,
                in_flight: e.in_flight,
                prefill_tokens: e.prefill_tokens,
                at_ns: e.at_unix_ns,
            };
            if self.apply(index, &r, now_ns, false) {
                n.0 += 1;
            } else {
                n.1 += 1;
            }
        }
        n
    }
}

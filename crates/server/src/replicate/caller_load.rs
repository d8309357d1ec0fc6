//! `ReportCallerLoad`: a caller's report checked and applied to the
//! server's [`CallerLoads`] (the state and the design: `caller_loads.rs`).

#[cfg(doc)]
use crate::caller_loads::CallerLoads;
use crate::caller_loads::CallerReport;
use crate::core::Core;

/// Longest caller id accepted, bytes.
pub const MAX_CALLER_BYTES: usize = 256;
/// Replicas per report at most.
pub const MAX_REPLICAS_PER_REPORT: usize = 1_024;
/// Longest replica id accepted here, bytes (the producers' default limit).
const MAX_REPLICA_ID_BYTES: usize = 256;

/// Handles one `ReportCallerLoad` at `now_ns`: every replica's count applied
/// (and queued for the bus). Returns how many replicas the index knows;
/// INVALID_ARGUMENT, applying nothing, for an empty or oversized caller id,
/// too many replicas or an oversized replica id.
pub fn report(
    core: &Core,
    r: &inferencecache_proto::v1alpha1::CallerLoadReport,
    now_ns: i64,
) -> Result<usize, tonic::Status> {
    if r.caller.is_empty() || r.caller.len() > MAX_CALLER_BYTES {
        return Err(tonic::Status::invalid_argument(format!(
            "caller must be 1 to {MAX_CALLER_BYTES} bytes (one id per gateway process); got {}",
            r.caller.len()
        )));
    }
    if r.replicas.len() > MAX_REPLICAS_PER_REPORT {
        return Err(tonic::Status::invalid_argument(format!(
            "{} replicas in one report; the limit is {MAX_REPLICAS_PER_REPORT}: split the report",
            r.replicas.len()
        )));
    }
    if let Some(e) = r
        .replicas
        .iter()
        .find(|e| e.replica_id.is_empty() || e.replica_id.len() > MAX_REPLICA_ID_BYTES)
    {
        return Err(tonic::Status::invalid_argument(format!(
            "replica_id must be 1 to {MAX_REPLICA_ID_BYTES} bytes; got {}",
            e.replica_id.len()
        )));
    }
    let at_ns = if r.timestamp_us == 0 {
        now_ns
    } else {
        // A caller's clock ahead of ours counts as now.
        r.timestamp_us.saturating_mul(1_000).min(now_ns)
    };
    let mut known = 0;
    for e in &r.replicas {
        let c = CallerReport {
            caller: &r.caller,
            replica_id: &e.replica_id,
            in_flight: e.in_flight,
            prefill_tokens: e.prefill_tokens,
            at_ns,
        };
        if core.caller_loads.apply(&core.index, &c, now_ns, true) {
            known += 1;
        }
    }
    Ok(known)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replicate::core_holding;
    use inferencecache_proto::v1alpha1::{CallerLoadReport, CallerReplicaLoad};

    fn report_of(caller: &str, replica: &str, n: u32, tokens: u64, at_us: i64) -> CallerLoadReport {
        CallerLoadReport {
            caller: caller.into(),
            timestamp_us: at_us,
            replicas: vec![CallerReplicaLoad {
                replica_id: replica.into(),
                in_flight: n,
                prefill_tokens: tokens,
            }],
        }
    }

    #[test]
    fn callers_counts_sum_per_replica_and_age_out() {
        let core = core_holding(&["r1"]);
        let now = 5_000_000_000_000_i64;
        let us = now / 1_000;
        core.caller_loads.share();
        // Two gateways: 1,000 and 2,000 tokens to prefill.
        assert_eq!(
            report(&core, &report_of("g1", "r1", 1, 1_000, us), now).unwrap(),
            1
        );
        assert_eq!(
            report(&core, &report_of("g2", "r1", 1, 2_000, us), now).unwrap(),
            1
        );
        let b = core.caller_loads.take_batch("me", now).unwrap();
        assert_eq!(b.loads.len(), 2);
        // A peer's batch is applied as a report; our own is skipped.
        assert_eq!(
            core.caller_loads.apply_batch(&core.index, "me", &b, now),
            (0, 2)
        );
        assert_eq!(
            core.caller_loads.apply_batch(&core.index, "peer", &b, now),
            (2, 0)
        );
        // Unknown replica: not applied. Garbage ids: refused.
        assert_eq!(
            report(&core, &report_of("g1", "zz", 1, 1, us), now).unwrap(),
            0
        );
        assert!(report(&core, &report_of("", "r1", 1, 1, us), now).is_err());
        assert!(report(&core, &report_of(&"x".repeat(300), "r1", 1, 1, us), now).is_err());
        // Older than MAX_AGE: not applied.
        let old = CallerReport {
            caller: "g3",
            replica_id: "r1",
            in_flight: 9,
            prefill_tokens: 9,
            at_ns: now - 3_000_000_000,
        };
        assert!(!core.caller_loads.apply(&core.index, &old, now, true));
    }
}

//! Replica records are bounded: a limit on distinct replica ids, and ids that
//! hold nothing and report nothing are released by the sweep and reused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use inferencecache_index::*;

fn names(r: &LookupRouteResult) -> Vec<String> {
    r.scores.iter().map(|s| s.replica_id.to_string()).collect()
}

#[test]
fn a_new_replica_past_the_limit_is_refused_whole() {
    let env = Env::with(|c| c.max_replicas(2));
    assert!(
        !env.put("t", "m", "vllm", "r1", &[(1, 64)])
            .refused_replica_limit
    );
    assert!(
        !env.put("t", "m", "vllm", "r2", &[(2, 64)])
            .refused_replica_limit
    );
    let out = env.put("t", "m", "vllm", "r3", &[(3, 64)]);
    assert!(out.refused_replica_limit);
    assert_eq!(out.entries_upserted, 0);
    assert!(env.exact("t", "m", "vllm", 3).scores.is_empty());
    // Stats-only reports from a new replica are refused too; known replicas go on.
    let mut u = upd("t", "m", "", "r3", vec![]);
    u.stats = Some(ReplicaStatsReport::default());
    assert!(env.idx.ingest(&u).refused_replica_limit);
    assert!(
        !env.put("t", "m", "vllm", "r1", &[(4, 64)])
            .refused_replica_limit
    );
    assert_eq!(env.idx.live_replicas(), 2);
    assert_eq!(env.idx.total_entries(), 3);
}

#[test]
fn idle_replicas_are_released_and_their_ids_reused_without_aliasing() {
    let env = Env::with(|c| c.max_replicas(2));
    env.put("t", "m", "vllm", "r1", &[(1, 64)]);
    env.stats("t", "m", "r2", 0.5, 0.0);
    // A lookup on this thread before the ids change hands (its names are
    // then re-read, not the ones it saw here).
    assert_eq!(names(&env.exact("t", "m", "vllm", 1)), ["r1"]);
    // Holding an entry or a stats record keeps a replica.
    assert_eq!(env.idx.sweep().replicas_released, 0);
    env.advance(31 * MIN);
    let out = env.idx.sweep();
    assert_eq!(out.replicas_released, 2);
    assert_eq!(env.idx.live_replicas(), 0);
    // Released ids are reused only after the next sweep.
    env.put("t", "m", "vllm", "a", &[(10, 64)]);
    env.idx.sweep();
    env.put("t", "m", "vllm", "b", &[(11, 64)]);
    env.put("t", "m", "vllm", "b", &[(10, 64)]);
    assert_eq!(env.idx.live_replicas(), 2);
    assert_eq!(names(&env.exact("t", "m", "vllm", 10)), ["a", "b"]);
    assert_eq!(names(&env.exact("t", "m", "vllm", 11)), ["b"]);
    // The limit counts live ids only: a third replica waits for a release.
    assert!(
        env.put("t", "m", "vllm", "c", &[(12, 64)])
            .refused_replica_limit
    );
}

#[test]
fn released_replicas_leave_no_trace_in_the_snapshot() {
    let env = Env::new();
    for r in 0..100 {
        env.put("t", "m", "vllm", &format!("r{r}"), &[(r, 64)]);
    }
    assert_eq!(env.idx.live_replicas(), 100);
    env.advance(31 * MIN);
    env.idx.sweep();
    assert_eq!(env.idx.live_replicas(), 0);
    assert!(env.idx.snapshot().replicas.is_empty());
    env.put("t", "m", "vllm", "fresh", &[(1, 64)]);
    let snap = env.idx.snapshot();
    assert_eq!(snap.replicas.len(), 1);
    assert_eq!(&*snap.replicas[0].replica_id, "fresh");
}

#[test]
fn all_cleared_then_sweep_releases_the_replica() {
    let env = Env::new();
    env.put("t", "m", "vllm", "r", &[(1, 64)]);
    env.event(EventKind::AllCleared, "t", "m", "r", None, "");
    assert_eq!(env.idx.sweep().replicas_released, 1);
    // A clear for an unknown replica is harmless.
    env.event(EventKind::AllCleared, "t", "m", "r", None, "");
    assert_eq!(env.idx.live_replicas(), 0);
}

#[test]
fn replicas_with_tentative_holdings_or_queued_work_are_not_released() {
    let env = Env::new();
    let hs: Vec<Vec<u8>> = [1u64, 2].iter().map(|&x| h(x)).collect();
    let counts = vec![16; hs.len()];
    let req = LookupRequest::new("t", "m", "vllm").chain(&hs, &counts);
    let deliver = |replica: &str, work_us: f64, ttl_s: u64| {
        env.idx.record_delivery(
            &req,
            &Delivery {
                replica_id: replica.into(),
                work_us,
                real_blocks: 0,
            },
            std::time::Duration::from_secs(ttl_s),
        )
    };
    // "tent" holds only tentative blocks; "busy" only queued delivered work.
    assert_eq!(deliver("tent", 0.0, 3600).tentative_stored, 2);
    deliver("busy", 3_600e6, 0);
    assert_eq!(env.idx.sweep().replicas_released, 0);
    assert_eq!(env.idx.live_replicas(), 2);
    // Once both have lapsed the ids are released, and a reused id starts
    // with no delivered history of the old replica.
    env.advance(2 * 60 * MIN);
    assert_eq!(env.idx.sweep().replicas_released, 2);
    env.idx.sweep();
    env.put("t", "m", "vllm", "fresh", &[(10, 64)]);
    assert_eq!(env.idx.delivered_hints("fresh"), 0);
}

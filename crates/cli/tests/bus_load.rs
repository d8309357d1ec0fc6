//! One load view across server replicas (issue 36, item 4), on a real
//! nats-server and real `inferencecache serve` processes under the default
//! (estimated-TTFT) ranking: hints delivered through one replica count in
//! the others' load, engine load reports reach every replica with the
//! stream, and a replica with load sharing off (`--bus-load-interval 0s`)
//! still sees only its own.
//!
//! Without nats-server the test skips with a printed reason, unless
//! INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bus_harness;
mod common;

use bus_harness::*;
use inferencecache_proto::v1alpha1::{GetCacheStateRequest, LookupRouteRequest};
use std::time::Duration;

/// The (tenant, model) both engines serve, where the picks are compared.
const SHARED: (&str, &str) = ("team-shared", "m");
/// A (tenant, model) only the loaded engine serves: every hint there goes
/// to it, whatever the bounded-load rule says.
const SOLO: (&str, &str) = ("team-solo", "m");
const ENGINES: [&str; 2] = ["engine-x", "engine-y"];

/// The replica a lookup's answer names first.
async fn pick(r: &Replica, req: &LookupRouteRequest) -> String {
    let a = r
        .client()
        .await
        .lookup_route(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(
        a.reason_code == "AFFINITY_HINT" || a.reason_code == "PREFIX_MATCH",
        "{a:?}"
    );
    a.replica_scores[0].replica_id.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hints_delivered_through_one_replica_move_the_others_picks() {
    let Some(bin) = nats_bin() else { return };
    let mut nats = Nats::start(&bin);
    let share = |name: &str| {
        let mut a = bus_args(&nats, name);
        a.extend(["--bus-load-interval", "10ms"].map(String::from));
        a
    };
    let mut alone = bus_args(&nats, "replica-c");
    alone.extend(["--bus-load-interval", "0s"].map(String::from));
    let a = Replica::start_ranked(&share("replica-a"), "ttft");
    let b = Replica::start_ranked(&share("replica-b"), "ttft");
    let c = Replica::start_ranked(&alone, "ttft");
    for r in [&a, &b, &c] {
        r.wait_ready(Duration::from_secs(30));
    }
    let all = [&a, &b, &c];

    // Both engines serve SHARED (each holding a prefix of its own) and
    // report an idle engine; reports go through A's relay.
    let mut ca = a.client().await;
    let reports: Vec<_> = ENGINES
        .iter()
        .zip([100, 101])
        .map(|(e, f)| idle_load_report(e, SHARED, f))
        .collect();
    ca.report_cache_state(futures::stream::iter(reports))
        .await
        .unwrap();
    wait_converged(&all, 2.0, Duration::from_secs(20));

    // Engine load reports replicate with the stream: every replica shows
    // both engines' load.
    for r in all {
        let state = r
            .client()
            .await
            .get_cache_state(GetCacheStateRequest {
                tenant_id: SHARED.0.into(),
                model_id: SHARED.1.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let loads: Vec<_> = state
            .replicas
            .iter()
            .map(|s| {
                (
                    s.replica_id.as_str(),
                    s.load.map(|l| l.kv_cache_capacity_tokens),
                )
            })
            .collect();
        assert_eq!(
            loads,
            vec![("engine-x", Some(100_000)), ("engine-y", Some(100_000))],
            "{}",
            r.grpc
        );
    }

    // The idle fleet's pick for a cold prompt (the seed rule): asked of C,
    // which shares nothing, so A and B do not hear of this delivery.
    let probe = cold_lookup(SHARED, 200);
    let loaded = pick(&c, &probe).await;
    let other = ENGINES.iter().find(|e| **e != loaded).unwrap().to_string();

    // The loaded engine also serves SOLO, alone; its report (an idle
    // engine again) restarts its queue on every replica, C's probe included.
    ca.report_cache_state(futures::stream::iter([idle_load_report(
        &loaded, SOLO, 300,
    )]))
    .await
    .unwrap();
    let seq = b.metric("inferencecache_bus_applied_sequence").unwrap();
    wait_converged(&all, seq + 1.0, Duration::from_secs(20));

    // 24 hints delivered through A, all to the loaded engine.
    const HINTS: u64 = 24;
    for f in 0..HINTS {
        assert_eq!(pick(&a, &cold_lookup(SOLO, 300 + f)).await, loaded);
    }
    let lag = wait_until(Duration::from_secs(10), "B applied A's hints", || {
        b.metric("inferencecache_bus_load_hints_applied_total")
            .unwrap_or(0.0)
            >= HINTS as f64
    });
    eprintln!("B applied A's {HINTS} hints within {lag:?} of the last one");

    // B counts them: the loaded engine is over the bounded-load rule in
    // SHARED, so the same cold prompt now goes to the other engine. C,
    // which shares nothing, still sends it to the loaded one; A, which
    // delivered them, agrees with B.
    assert_eq!(pick(&b, &probe).await, other, "B must see A's load");
    assert_eq!(pick(&a, &probe).await, other, "A sees its own load");
    assert_eq!(pick(&c, &probe).await, loaded, "C shares nothing");

    // Origin filtering: A skipped its own batches (it counted those hints
    // when it delivered them); C neither published nor applied.
    let own = "inferencecache_bus_load_skipped_total{reason=\"own\"}";
    assert!(
        a.metric(own).unwrap_or(0.0) >= HINTS as f64,
        "A skips its own"
    );
    for m in [
        "inferencecache_bus_load_hints_published_total",
        "inferencecache_bus_load_hints_applied_total",
    ] {
        assert_eq!(c.metric(m), Some(0.0), "{m} on C");
    }
    let hist = |r: &Replica, s: &str| {
        r.metric(&format!("inferencecache_bus_load_lag_seconds_{s}"))
            .unwrap_or(f64::NAN)
    };
    let (sum, count) = (hist(&b, "sum"), hist(&b, "count"));
    eprintln!(
        "delivery to apply lag on B: mean {:.2} ms over {count} entries",
        1e3 * sum / count
    );

    // A dead bus never holds a lookup up: A keeps answering, and the batches
    // it cannot publish are dropped and counted.
    nats.kill();
    let dropped = "inferencecache_bus_load_batches_dropped_total";
    let before = a.metric(dropped).unwrap_or(0.0);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for f in 0.. {
        let t = std::time::Instant::now();
        pick(&a, &cold_lookup(SOLO, 400 + f)).await;
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        if a.metric(dropped).unwrap_or(0.0) > before {
            break;
        }
        assert!(t < deadline, "no dropped batch counted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

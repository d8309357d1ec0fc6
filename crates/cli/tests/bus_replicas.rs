//! Active-active replicas on a real NATS JetStream, and warm restarts: real
//! nats-server processes (`-js`, loopback, random ports, killed by PID) and
//! real `inferencecache serve` processes.
//!
//! Without nats-server the bus tests skip with a printed reason, unless
//! INFERENCECACHE_REQUIRE_REAL_PARTS=1. `INFERENCECACHE_LONG_TESTS=1` runs
//! the large variants (1 M entries).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bus_harness;
mod common;

use bus_harness::*;
use inferencecache_bus::{Bus, BusConfig, BusMessage, Producer, ProducerLimits};
use inferencecache_proto::v1alpha1::{CacheStateUpdate, LookupRouteRequest, PrefixEntry};
use std::time::{Duration, Instant};

fn long() -> bool {
    std::env::var("INFERENCECACHE_LONG_TESTS").as_deref() == Ok("1")
}

fn lookup_for(tenant: &str, model: &str, f: u64, d: u64) -> LookupRouteRequest {
    LookupRouteRequest {
        model_id: model.into(),
        tenant_id: tenant.into(),
        hash_scheme: "vllm".into(),
        block_hashes: (0..d).map(|i| block(f, i).into()).collect(),
        block_token_counts: vec![64; d as usize],
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_answer_identically_whichever_path_updates_take() {
    let Some(bin) = nats_bin() else { return };
    let nats = Nats::start(&bin);
    let r: Vec<Replica> = (0..3)
        .map(|i| Replica::start(&bus_args(&nats, &format!("replica-{i}"))))
        .collect();
    for x in &r {
        x.wait_ready(Duration::from_secs(20));
    }
    // Updates through replica 0 and replica 1 (gRPC relay), concurrently, and
    // from a sidecar-like producer straight to the bus.
    let ops_a = workload(1, 1500);
    let ops_b = workload(2, 1500);
    let ops_c = workload(3, 1000);
    let (mut c0, mut c1) = (r[0].client().await, r[1].client().await);
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let direct = Producer::start(bus, ProducerLimits::default(), stop.clone());
    let (a, b) = tokio::join!(send_grpc(&mut c0, &ops_a), send_grpc(&mut c1, &ops_b));
    a.unwrap();
    b.unwrap();
    for op in &ops_c {
        let m = match op {
            Op::Report(u) => BusMessage::Update(u.clone()),
            Op::Event(e) => BusMessage::Event(e.clone()),
        };
        assert!(direct.send(m).await);
    }
    let total = (ops_a.len() + ops_b.len() + ops_c.len()) as f64;
    let refs: Vec<&Replica> = r.iter().collect();
    let t = Instant::now();
    let seq = wait_converged(&refs, total, Duration::from_secs(60));
    eprintln!(
        "converged at sequence {seq} after {:?} (metrics mirror every 1 s)",
        t.elapsed()
    );
    assert_eq!(seq, total, "every update reached the stream exactly once");
    let (differing, first, hints) = compare(&refs, &lookups(7, 10_000)).await;
    assert_eq!(
        differing,
        0,
        "first difference: {}",
        first.unwrap_or_default()
    );
    assert!(hints > 2_000, "the workload must produce hints ({hints})");
    for x in &r {
        assert_eq!(x.metric("inferencecache_bus_connected"), Some(1.0));
        assert_eq!(x.metric("inferencecache_bus_caught_up"), Some(1.0));
        assert_eq!(
            x.metric("inferencecache_bus_applied_total"),
            Some(total),
            "each replica applied every message"
        );
    }
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bus_input_is_counted_and_skipped() {
    let Some(bin) = nats_bin() else { return };
    let nats = Nats::start(&bin);
    let rep = Replica::start(&bus_args(&nats, "bad-input"));
    rep.wait_ready(Duration::from_secs(20));
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    bus.stream().await.unwrap();
    let subject =
        inferencecache_bus::subject::subject(&bus.config.subject_prefix, "team.a", "qwen");
    let publish = |kind: Option<&'static str>, body: Vec<u8>| {
        let bus = bus.clone();
        let subject = subject.clone();
        async move {
            let mut h = inferencecache_bus::async_nats::HeaderMap::new();
            if let Some(k) = kind {
                h.insert(inferencecache_bus::message::KIND_HEADER, k);
            }
            bus.js
                .publish_with_headers(subject, h, body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };
    publish(Some("CacheStateUpdate"), vec![0xff, 0xff, 0xff, 0x07]).await;
    publish(Some("CacheSomethingNew"), vec![1, 2, 3]).await;
    publish(None, vec![]).await;
    let probe = CacheStateUpdate {
        replica_id: "r".into(),
        tenant_id: inferencecache_server_probe_tenant(),
        model_id: "qwen".into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            block_hashes: vec![block(1, 0)],
            block_token_counts: vec![64],
            ..Default::default()
        }],
        ..Default::default()
    };
    publish(
        Some("CacheStateUpdate"),
        prost::Message::encode_to_vec(&probe),
    )
    .await;
    let good = CacheStateUpdate {
        tenant_id: "team.a".into(),
        ..probe.clone()
    };
    publish(
        Some("CacheStateUpdate"),
        prost::Message::encode_to_vec(&good),
    )
    .await;

    // The valid update after the bad ones is applied: no stall.
    let mut c = rep.client().await;
    until_hint(
        &mut c,
        lookup_for("team.a", "qwen", 1, 1),
        Duration::from_secs(10),
    )
    .await;
    wait_until(Duration::from_secs(5), "skips mirrored", || {
        rep.metric("inferencecache_bus_applied_sequence") == Some(5.0)
    });
    for reason in ["garbage", "unknown_kind", "missing_kind", "probe_tenant"] {
        assert_eq!(
            rep.metric(&format!(
                "inferencecache_bus_skipped_total{{reason=\"{reason}\"}}"
            )),
            Some(1.0),
            "{reason}"
        );
    }
    assert_eq!(rep.metric("inferencecache_bus_applied_total"), Some(1.0));
}

/// The reserved tenant of `/probe` (`inferencecache_control_api::PROBE_TENANT`).
fn inferencecache_server_probe_tenant() -> String {
    "inferencecache.io/probe".to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bus_down_at_start_serves_fail_open_and_catches_up() {
    let Some(bin) = nats_bin() else { return };
    let mut nats = Nats::reserve(&bin);
    let rep = Replica::start(&bus_args(&nats, "early"));
    // Not connected: ready after the grace period anyway, and it answers.
    rep.wait_ready(Duration::from_secs(15));
    // The line is logged just before readiness clears; stderr reaches the
    // harness through a reader thread, so it may land after /readyz.
    rep.wait_log(
        "bus_unreachable_at_start; ready and serving from the local index (fail-open); will catch up when it appears",
        Duration::from_secs(5),
    );
    wait_until(Duration::from_secs(5), "not-connected metric", || {
        rep.metric("inferencecache_bus_connected") == Some(0.0)
    });
    let mut c = rep.client().await;
    let miss = c
        .lookup_route(lookup_for("team.a", "qwen", 3, 2))
        .await
        .unwrap()
        .into_inner();
    assert!(miss.replica_scores.is_empty());
    // Reports while the bus is down are buffered by the relay.
    send_grpc(
        &mut c,
        &[Op::Report(CacheStateUpdate {
            replica_id: "r1".into(),
            tenant_id: "team.a".into(),
            model_id: "qwen".into(),
            hash_scheme: "vllm".into(),
            prefixes: vec![PrefixEntry {
                block_hashes: vec![block(3, 0), block(3, 1)],
                block_token_counts: vec![64, 64],
                ..Default::default()
            }],
            ..Default::default()
        })],
    )
    .await
    .unwrap();
    nats.launch();
    until_hint(
        &mut c,
        lookup_for("team.a", "qwen", 3, 2),
        Duration::from_secs(20),
    )
    .await;
    wait_until(Duration::from_secs(5), "connected metric", || {
        rep.metric("inferencecache_bus_connected") == Some(1.0)
    });
}

/// A server takes a workload and is stopped; one started on the same state
/// dir answers the same lookups as the first did (ages kept). Returns the
/// state dir and the flags.
async fn warm_restart_keeps_the_answers() -> (TempDir, Vec<String>) {
    let dir = TempDir::new("state");
    let args: Vec<String> = [
        "--state-dir",
        dir.0.to_str().unwrap(),
        "--snapshot-interval",
        "1h",
    ]
    .map(String::from)
    .to_vec();
    let mut a = Replica::start(&args);
    let mut c = a.client().await;
    let ops = workload(11, 2000);
    send_grpc(&mut c, &ops).await.unwrap();
    let reqs = lookups(5, 2000);
    let mut before = Vec::new();
    for q in &reqs {
        before.push(Answer::from(
            c.lookup_route(q.clone()).await.unwrap().into_inner(),
        ));
    }
    a.term();
    let b = Replica::start(&args);
    let restored = b.wait_log("state_restored", Duration::from_secs(10));
    assert!(restored["entries"].as_u64().unwrap() > 100, "{restored}");
    let mut c = b.client().await;
    let mut differing = Vec::new();
    for (q, was) in reqs.iter().zip(&before) {
        let now = Answer::from(c.lookup_route(q.clone()).await.unwrap().into_inner());
        // Entries kept their ages: scores only decayed by the seconds the
        // restart and these lookups took (30 min TTL: 1 % per 18 s; seen
        // 1.6 % on a loaded 2-core machine, so 5 % is allowed), ranks and
        // reasons are unchanged. A cold start would answer NO_HINT / UNKNOWN_TENANT.
        // TENANT_HOT ranks by recency over a 5 min window: it moves faster,
        // so only its replica set is compared.
        let set = |a: &Answer| {
            let mut v: Vec<String> = a.ranked.iter().map(|r| r.0.clone()).collect();
            v.sort();
            v
        };
        let close = now.reason == was.reason
            && if now.reason == "TENANT_HOT" {
                set(&now) == set(was)
            } else {
                now.ranked == was.ranked
                    && now
                        .scores
                        .iter()
                        .zip(&was.scores)
                        .all(|(x, y)| (x - y).abs() <= 0.05 * y.abs().max(1.0))
            };
        if !close {
            differing.push((q.clone(), was.clone(), now));
        }
    }
    assert!(
        differing.is_empty(),
        "{} differ; first: {:#?}",
        differing.len(),
        differing.first()
    );
    (dir, args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_dir_gives_a_single_server_a_warm_restart_with_ages_kept() {
    let (dir, args) = warm_restart_keeps_the_answers().await;
    // A corrupt snapshot is moved aside and the server starts cold.
    std::fs::write(dir.0.join("index.snapshot"), b"ICSNAP\0\x01garbage").unwrap();
    let cold = Replica::start(&args);
    cold.wait_log(
        "state_snapshot_unreadable; starting cold",
        Duration::from_secs(10),
    );
    assert!(dir.0.join("index.snapshot.bad").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_replica_under_ingest_restarts_warm_and_identical() {
    let Some(bin) = nats_bin() else { return };
    let nats = Nats::start(&bin);
    let dirs: Vec<TempDir> = (0..3).map(|_| TempDir::new("replica")).collect();
    let args = |i: usize| {
        let mut a = bus_args(&nats, &format!("replica-{i}"));
        a.extend(
            [
                "--state-dir",
                dirs[i].0.to_str().unwrap(),
                "--snapshot-interval",
                "1s",
            ]
            .map(String::from),
        );
        a
    };
    let mut r: Vec<Replica> = (0..3).map(|i| Replica::start(&args(i))).collect();
    for x in &r {
        x.wait_ready(Duration::from_secs(20));
    }
    let mut c0 = r[0].client().await;
    let first = workload(21, if long() { 20_000 } else { 3000 });
    send_grpc(&mut c0, &first).await.unwrap();
    // Let replica 2 write a snapshot, then kill it under ingest.
    wait_until(Duration::from_secs(10), "a snapshot on disk", || {
        dirs[2].0.join("index.snapshot").exists()
    });
    let second = workload(22, 3000);
    let (half_a, half_b) = second.split_at(1500);
    send_grpc(&mut c0, half_a).await.unwrap();
    r[2].kill9();
    send_grpc(&mut c0, half_b).await.unwrap();
    let restarted_at = Instant::now();
    r[2] = Replica::start(&args(2));
    let restored = r[2].wait_log("state_restored", Duration::from_secs(10));
    assert!(restored["entries"].as_u64().unwrap() > 0);
    let ready = r[2].wait_ready(Duration::from_secs(30));
    let refs: Vec<&Replica> = r.iter().collect();
    let total = (first.len() + second.len()) as f64;
    wait_converged(&refs, total, Duration::from_secs(30));
    let identical_after = restarted_at.elapsed();
    eprintln!("restart: ready after {ready:?}, identical sequence after {identical_after:?}");
    let (differing, first_diff, _) = compare(&refs, &lookups(9, 10_000)).await;
    assert_eq!(differing, 0, "{}", first_diff.unwrap_or_default());
    // The replica resumed from its snapshot's sequence, not from zero.
    let applied = r[2].metric("inferencecache_bus_applied_total").unwrap();
    assert!(
        applied < total,
        "replayed {applied} of {total}: resumed after the snapshot"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_restart_under_ingest_loses_no_valid_update() {
    let Some(bin) = nats_bin() else { return };
    let mut nats = Nats::start(&bin);
    let r: Vec<Replica> = (0..2)
        .map(|i| Replica::start(&bus_args(&nats, &format!("replica-{i}"))))
        .collect();
    for x in &r {
        x.wait_ready(Duration::from_secs(20));
    }
    // The reference: a server without a bus, fed the same updates directly.
    let reference = Replica::start(&[]);
    let mut cref = reference.client().await;
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let producer = Producer::start(bus, ProducerLimits::default(), stop.clone());
    let mut resyncs = producer.resyncs();
    // The sidecar's model: the replica state it would re-report.
    let ops = workload(31, 4000);
    let mut state = SidecarModel::default();
    for (i, op) in ops.iter().enumerate() {
        if i == 1500 {
            nats.kill();
            // The replicas keep answering from their indexes meanwhile.
            let mut c = r[0].client().await;
            let resp = c.lookup_route(lookups(1, 1)[0].clone()).await;
            assert!(resp.is_ok());
        }
        if i == 2500 {
            nats.launch();
        }
        state.apply(op);
        send_grpc(&mut cref, std::slice::from_ref(op))
            .await
            .unwrap();
        producer.send(op_message(op)).await;
        if resyncs.has_changed().unwrap_or(false) {
            resyncs.borrow_and_update();
            for m in state.resync() {
                producer.send(m).await;
            }
        }
    }
    // Converge: resyncs the producer asks for (after the outage, or a
    // replica's request) are answered from the sidecar model meanwhile.
    let refs: Vec<&Replica> = r.iter().collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if resyncs.has_changed().unwrap_or(false) {
            resyncs.borrow_and_update();
            for m in state.resync() {
                producer.send(m).await;
            }
        }
        let (d, _) = compare_entries(&refs, &reference, &lookups(3, 300)).await;
        if d == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replicas never agreed with the reference"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (differing, first_diff) = compare_entries(&refs, &reference, &lookups(4, 10_000)).await;
    assert_eq!(differing, 0, "{}", first_diff.unwrap_or_default());
    eprintln!(
        "producer: {} resyncs, {} failed publishes, {} dropped",
        producer
            .stats()
            .resyncs
            .load(std::sync::atomic::Ordering::Relaxed),
        producer
            .stats()
            .failed
            .load(std::sync::atomic::Ordering::Relaxed),
        producer
            .stats()
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed),
    );
    stop.cancel();
}

async fn until_hint(
    c: &mut inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient<
        tonic::transport::Channel,
    >,
    req: LookupRouteRequest,
    limit: Duration,
) {
    let t = Instant::now();
    loop {
        let r = c.lookup_route(req.clone()).await.unwrap().into_inner();
        if r.reason_code == "PREFIX_MATCH" {
            return;
        }
        assert!(
            t.elapsed() < limit,
            "no PREFIX_MATCH within {limit:?}: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn op_message(op: &Op) -> BusMessage {
    match op {
        Op::Report(u) => BusMessage::Update(u.clone()),
        Op::Event(e) => BusMessage::Event(e.clone()),
    }
}

/// What a sidecar tracks: per (tenant, model, replica), held blocks.
type ReplicaKey = (String, String, String);

#[derive(Default)]
struct SidecarModel {
    /// Held blocks: hash → (cumulative tokens, tier).
    held: std::collections::BTreeMap<ReplicaKey, std::collections::BTreeMap<Vec<u8>, (i32, i32)>>,
    stats: std::collections::BTreeMap<ReplicaKey, inferencecache_proto::v1alpha1::ReplicaStats>,
}

impl SidecarModel {
    fn apply(&mut self, op: &Op) {
        match op {
            Op::Report(u) => {
                let e = self
                    .held
                    .entry((
                        u.tenant_id.clone(),
                        u.model_id.clone(),
                        u.replica_id.clone(),
                    ))
                    .or_default();
                for p in &u.prefixes {
                    let mut cum = 0;
                    for (h, c) in p.block_hashes.iter().zip(&p.block_token_counts) {
                        cum += c;
                        e.insert(h.clone(), (cum, p.tier));
                    }
                }
                if let Some(st) = &u.stats {
                    self.stats.insert(
                        (
                            u.tenant_id.clone(),
                            u.model_id.clone(),
                            u.replica_id.clone(),
                        ),
                        st.clone(),
                    );
                }
            }
            Op::Event(ev) => {
                let key = (
                    ev.tenant_id.clone(),
                    ev.model_id.clone(),
                    ev.replica_id.clone(),
                );
                if ev.r#type == 4 {
                    self.held.remove(&key);
                    self.stats.remove(&key);
                } else if let Some(e) = self.held.get_mut(&key) {
                    e.remove(&ev.prefix_hash);
                }
            }
        }
    }

    /// ALL_CLEARED then every held block, per replica.
    fn resync(&self) -> Vec<BusMessage> {
        let mut out = Vec::new();
        let keys: std::collections::BTreeSet<_> =
            self.held.keys().chain(self.stats.keys()).cloned().collect();
        let empty = std::collections::BTreeMap::new();
        for key in keys {
            let (t, m, r) = &key;
            let blocks = self.held.get(&key).unwrap_or(&empty);
            out.push(BusMessage::Event(
                inferencecache_proto::v1alpha1::CacheEvent {
                    r#type: 4,
                    replica_id: r.clone(),
                    model_id: m.clone(),
                    tenant_id: t.clone(),
                    ..Default::default()
                },
            ));
            out.push(BusMessage::Update(CacheStateUpdate {
                replica_id: r.clone(),
                model_id: m.clone(),
                tenant_id: t.clone(),
                hash_scheme: "vllm".into(),
                prefixes: blocks
                    .iter()
                    .map(|(h, (c, tier))| PrefixEntry {
                        prefix_hash: h.clone(),
                        token_count: *c,
                        tier: *tier,
                        ..Default::default()
                    })
                    .collect(),
                stats: self.stats.get(&key).cloned(),
                ..Default::default()
            }));
        }
        out
    }
}

/// Compares the replicas with the reference on reason and held entries
/// (replica, matched tokens, tier), not ranks or scores: the reference
/// stamped updates with its own clock, the replicas with the stream's, and a
/// resync refreshes ages.
async fn compare_entries(
    replicas: &[&Replica],
    reference: &Replica,
    reqs: &[LookupRouteRequest],
) -> (usize, Option<String>) {
    let mut all = vec![reference];
    all.extend_from_slice(replicas);
    let (d, first, _) = compare_by(&all, reqs, same_entries).await;
    (d, first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_sidecar_publishes_straight_to_the_bus() {
    let Some(bin) = nats_bin() else { return };
    let Some(mut engine) = Engine::start() else {
        return;
    };
    let nats = Nats::start(&bin);
    let r: Vec<Replica> = (0..2)
        .map(|i| Replica::start(&bus_args(&nats, &format!("replica-{i}"))))
        .collect();
    for x in &r {
        x.wait_ready(Duration::from_secs(20));
    }
    let mut sidecar = subscribe_to_bus(&engine, &nats, "engine-0");
    engine.store(1, 4, None, 0);
    let req = LookupRouteRequest {
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        // One past the 64 stored: a prompt's last token is recomputed.
        token_ids: (0..65).collect(),
        ..Default::default()
    };
    for x in &r {
        let mut c = x.client().await;
        until_hint(&mut c, req.clone(), Duration::from_secs(20)).await;
        let resp = c.lookup_route(req.clone()).await.unwrap().into_inner();
        assert_eq!(resp.replica_scores[0].replica_id, "engine-0");
        assert_eq!(resp.replica_scores[0].matched_tokens, 64);
    }
    let _ = sidecar.kill();
    let _ = sidecar.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purged_start_point_asks_sidecars_for_a_full_resync() {
    let Some(bin) = nats_bin() else { return };
    let nats = Nats::start(&bin);
    let dir = TempDir::new("gap");
    let mut args = bus_args(&nats, "gap");
    args.extend(
        [
            "--state-dir",
            dir.0.to_str().unwrap(),
            "--snapshot-interval",
            "1h",
        ]
        .map(String::from),
    );
    let mut a = Replica::start(&args);
    a.wait_ready(Duration::from_secs(20));
    let bus = Bus::connect(BusConfig::new(nats.url())).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let sidecar = Producer::start(bus.clone(), ProducerLimits::default(), stop.clone());
    let mut resyncs = sidecar.resyncs();
    let ops = workload(41, 20);
    for op in &ops[..10] {
        assert!(sidecar.send(op_message(op)).await);
    }
    wait_converged(&[&a], 10.0, Duration::from_secs(20));
    a.term(); // final snapshot: sequence 10
    for op in &ops[10..] {
        assert!(sidecar.send(op_message(op)).await);
    }
    let mut stream = bus.stream().await.unwrap();
    let t = Instant::now();
    while stream.info().await.unwrap().state.last_sequence < 20 {
        assert!(t.elapsed() < Duration::from_secs(10), "20 messages stored");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Retention ran past the stopped replica: 11..20 are gone.
    stream.purge().await.unwrap();
    resyncs.borrow_and_update();
    let a = Replica::start(&args);
    a.wait_log(
        "bus_gap: the next sequence was purged; asking producers for a full resync",
        Duration::from_secs(20),
    );
    tokio::time::timeout(Duration::from_secs(10), resyncs.changed())
        .await
        .expect("the sidecar was asked for a resync")
        .unwrap();
    assert!(
        sidecar
            .stats()
            .resync_requests
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    wait_until(Duration::from_secs(5), "gap counted", || {
        a.metric("inferencecache_bus_gaps_total") == Some(1.0)
    });
    a.wait_ready(Duration::from_secs(10));
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_replica_warms_from_the_newest_published_snapshot() {
    let Some(bin) = nats_bin() else { return };
    let nats = Nats::start(&bin);
    let (da, db) = (TempDir::new("warm-a"), TempDir::new("warm-b"));
    let args = |name: &str, dir: &TempDir, every: &str| {
        let mut v = bus_args(&nats, name);
        v.extend(
            [
                "--state-dir",
                dir.0.to_str().unwrap(),
                "--snapshot-interval",
                every,
            ]
            .map(String::from),
        );
        v
    };
    let a = Replica::start(&args("a", &da, "1s"));
    a.wait_ready(Duration::from_secs(20));
    let mut c = a.client().await;
    let ops = workload(51, 2000);
    send_grpc(&mut c, &ops).await.unwrap();
    let total = ops.len() as f64;
    wait_converged(&[&a], total, Duration::from_secs(30));
    let published = "inferencecache_state_snapshots_total{target=\"bucket\",result=\"ok\"}";
    let before = a.metric(published).unwrap_or(0.0);
    wait_until(
        Duration::from_secs(15),
        "a snapshot published after convergence",
        || a.metric(published).unwrap_or(0.0) >= before + 2.0,
    );
    let b = Replica::start(&args("b", &db, "1h"));
    let warmed = b.wait_log("state_warmed_from_bucket", Duration::from_secs(20));
    assert_eq!(
        warmed["sequence"].as_u64(),
        Some(ops.len() as u64),
        "{warmed}"
    );
    b.wait_ready(Duration::from_secs(20));
    wait_converged(&[&a, &b], total, Duration::from_secs(20));
    // It replayed nothing: the snapshot covered the whole stream.
    assert_eq!(b.metric("inferencecache_bus_applied_total"), Some(0.0));
    let (differing, first, _) = compare(&[&a, &b], &lookups(8, 3000)).await;
    assert_eq!(differing, 0, "{}", first.unwrap_or_default());
}

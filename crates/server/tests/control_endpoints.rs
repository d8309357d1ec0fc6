//! `/snapshot` and `/probe` on the control listener over real HTTP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Running;
use inferencecache_proto::v1alpha1::*;

async fn snapshot(s: &Running) -> serde_json::Value {
    let r = reqwest::get(s.control_url("/snapshot")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let text = r.text().await.unwrap();
    assert!(text.ends_with('\n'));
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn empty_snapshot_has_arrays_and_zero_totals() {
    let s = Running::start().await;
    let v = snapshot(&s).await;
    assert_eq!(
        v,
        serde_json::json!({"replicas":[],"tenants":[],"totalPrefixes":0,"hotPrefixes":0,"templates":[],"pdTopologies":[]})
    );
    s.stop().await;
}

#[tokio::test]
async fn snapshot_maps_reported_state() {
    let s = Running::start().await;
    let mut c = s.client().await;
    let updates = vec![
        CacheStateUpdate {
            replica_id: "r1".into(),
            model_id: "m".into(),
            tenant_id: "t".into(),
            hash_scheme: "vllm".into(),
            timestamp_us: 1_796_205_600_000_000,
            prefixes: vec![PrefixEntry {
                prefix_hash: vec![1; 8],
                token_count: 16,
                ..Default::default()
            }],
            stats: Some(ReplicaStats {
                cache_memory_bytes: 77,
                hit_rate: 0.5,
                pressure: 0.25,
                client_version: "v1.2".into(),
                t2_hit_tokens: 5,
                ..Default::default()
            }),
            ..Default::default()
        },
        CacheStateUpdate {
            replica_id: "r2".into(),
            model_id: "m".into(),
            tenant_id: "t".into(),
            hash_scheme: "vllm".into(),
            prefixes: vec![PrefixEntry {
                prefix_hash: vec![2; 8],
                token_count: 16,
                ..Default::default()
            }],
            ..Default::default()
        },
    ];
    c.report_cache_state(futures::stream::iter(updates))
        .await
        .unwrap();
    let v = snapshot(&s).await;
    assert_eq!(v["totalPrefixes"], 2);
    let r1 = &v["replicas"][0];
    assert_eq!(r1["replicaId"], "r1");
    assert_eq!(r1["tenant"], "t");
    assert_eq!(r1["cacheMemoryBytes"], 77);
    assert_eq!(r1["hitRate"], 0.5);
    assert_eq!(r1["pressure"], 0.25);
    assert_eq!(r1["lastUpdate"], "2026-12-02T10:00:00Z");
    assert_eq!(r1["lastEventAt"], "2026-12-02T10:00:00Z");
    assert_eq!(r1["prefixCount"], 1);
    assert_eq!(r1["statsReported"], true);
    assert_eq!(r1["t2HitTokens"], 5);
    assert!(r1.get("t2QueryTokens").is_none(), "zero omitted");
    assert_eq!(r1["clientVersion"], "v1.2");
    let r2 = &v["replicas"][1];
    assert_eq!(
        r2["lastUpdate"], "0001-01-01T00:00:00Z",
        "no stats: zero time"
    );
    assert!(r2.get("statsReported").is_none());
    let t = &v["tenants"][0];
    assert_eq!(t["tenantId"], "t");
    assert_eq!(t["indexEntries"], 2);
    assert_eq!(t["hitRate"], 0.5);
    assert_eq!(t["hitRateReported"], true);
    assert_eq!(t["memoryUsed"], 0);
    s.stop().await;
}

#[tokio::test]
async fn snapshot_is_get_only_and_not_public() {
    let s = Running::start().await;
    let r = reqwest::Client::new()
        .post(s.control_url("/snapshot"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET");
    assert_eq!(
        reqwest::get(s.url("/snapshot")).await.unwrap().status(),
        404
    );
    s.stop().await;
}

async fn probe(s: &Running, body: &str) -> reqwest::Response {
    reqwest::Client::new()
        .post(s.control_url("/probe"))
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn probe_happy_path_leaves_no_residue() {
    let s = Running::start().await;
    let r = probe(&s, r#"{"backend":"ns/cb","model":"m","hashScheme":"vllm"}"#).await;
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"backend":"ns/cb","ingest":"ok","routing":"ok","t2":"skipped"})
    );
    // The probe tenant never shows in the snapshot, and nothing is left behind.
    assert_eq!(snapshot(&s).await["replicas"], serde_json::json!([]));
    s.stop().await;
}

#[tokio::test]
async fn probe_refuses_bad_requests() {
    let s = Running::start().await;
    let cases = [
        (
            r#"{"backend":"b","model":"m"}"#,
            "probe request missing required field (backend, model, hashScheme)\n",
        ),
        (
            r#"{"backend":"b","model":"m","hashScheme":"v"} {}"#,
            "probe request body has trailing content after the first JSON value\n",
        ),
        (
            r#"{"backend":"b","model":"m","hashScheme":"v","extra":1}"#,
            "decode probe request: unknown field",
        ),
        ("nope", "decode probe request: "),
    ];
    for (body, want) in cases {
        let r = probe(&s, body).await;
        assert_eq!(r.status(), 400, "{body}");
        let text = r.text().await.unwrap();
        assert!(text.starts_with(want), "{text:?}");
    }
    let r = reqwest::get(s.control_url("/probe")).await.unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "POST");
    s.stop().await;
}

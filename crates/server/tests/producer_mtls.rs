//! Producer identity from client certificates (`--producer-auth mtls`, real
//! certificates from rcgen): the SPIFFE URI SAN's namespace, else the CN,
//! scopes what a producer may write; per-identity ingest limits throttle a
//! flood from one identity while another identity's writes all land.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Running;
use common::certs::{Ca, Dir, channel, server_files};
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::{
    CacheEvent, CacheStateUpdate, LookupRouteRequest, PrefixEntry, cache_event,
};
use inferencecache_server::ServerConfig;
use inferencecache_server::producer::ratelimit::Limits;
use inferencecache_server::producer::{ProducerAuth, ProducerConfig};
use tonic::Code;
use tonic::transport::Channel;

const SPIFFE_A: &str = "spiffe://cluster.local/ns/team-a/sa/sidecar";

struct Pki {
    server: Ca,
    clients: Ca,
    dir: Dir,
}

async fn mtls_server(name: &str, limits: Limits) -> (Running, Pki) {
    let pki = Pki {
        server: Ca::new("server"),
        clients: Ca::new("clients"),
        dir: Dir::new(name),
    };
    let mut config = ServerConfig::ephemeral();
    config.tls = Some(server_files(&pki.dir, &pki.server, Some(&pki.clients)));
    config.producer = ProducerConfig {
        auth: ProducerAuth::Mtls,
        limits,
        ..ProducerConfig::default()
    };
    (Running::start_with(config).await, pki)
}

async fn client(
    s: &Running,
    pki: &Pki,
    cn: &str,
    uri: Option<&str>,
) -> InferenceCacheClient<Channel> {
    InferenceCacheClient::new(
        channel(s.grpc, &pki.server, Some(pki.clients.client(cn, uri)))
            .await
            .unwrap(),
    )
}

/// An update of `blocks` chain blocks starting at hash `first`.
fn update(tenant: &str, replica: &str, first: u32, blocks: u32) -> CacheStateUpdate {
    CacheStateUpdate {
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: tenant.into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            block_hashes: (first..first + blocks)
                .map(|h| h.to_be_bytes().to_vec())
                .collect(),
            block_token_counts: vec![16; blocks as usize],
            ..Default::default()
        }],
        ..Default::default()
    }
}

async fn prefixes(c: &mut InferenceCacheClient<Channel>, tenant: &str) -> i64 {
    common::cache_state(c, "m", tenant)
        .await
        .summary
        .unwrap()
        .total_prefixes
}

async fn report(
    c: &mut InferenceCacheClient<Channel>,
    updates: Vec<CacheStateUpdate>,
) -> Result<(), tonic::Status> {
    c.report_cache_state(futures::stream::iter(updates))
        .await
        .map(|_| ())
}

#[tokio::test]
async fn spiffe_namespace_and_cn_scope_writes() {
    let (s, pki) = mtls_server("scope", Limits::default()).await;
    let mut a = client(&s, &pki, "ignored-cn", Some(SPIFFE_A)).await;
    let mut b = client(&s, &pki, "team-b", None).await;

    // team-b (CN identity) writes its own tenant.
    report(&mut b, vec![update("team-b", "rb", 100, 3)])
        .await
        .unwrap();
    // team-a (SPIFFE identity) writes its tenant, tries team-b's in the
    // middle of the stream, and goes on: the entitled updates land, the
    // stream ends with PERMISSION_DENIED naming tenant and identity.
    let err = report(
        &mut a,
        vec![
            update("team-a", "ra", 1, 2),
            update("team-b", "ra", 7, 4),
            update("team-a", "ra", 3, 1),
        ],
    )
    .await
    .expect_err("cross-tenant update refused");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    for part in ["team-b", "team-a", SPIFFE_A] {
        assert!(
            err.message().contains(part),
            "{part} in {:?}",
            err.message()
        );
    }
    assert_eq!(
        prefixes(&mut a, "team-a").await,
        3,
        "both entitled updates landed"
    );
    assert_eq!(
        prefixes(&mut a, "team-b").await,
        3,
        "nothing of team-a's write to team-b"
    );

    // A unary event for another tenant is refused too, and changes nothing.
    let evict = CacheEvent {
        r#type: cache_event::Type::AllCleared as i32,
        replica_id: "rb".into(),
        model_id: "m".into(),
        tenant_id: "team-b".into(),
        ..Default::default()
    };
    let err = a.publish_event(evict.clone()).await.expect_err("refused");
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(prefixes(&mut a, "team-b").await, 3);
    // team-b may clear its own replica.
    b.publish_event(evict).await.unwrap();
    assert_eq!(prefixes(&mut b, "team-b").await, 0);

    let body = s.metrics_text().await;
    for line in [
        "inferencecache_producer_rejected_total{identity=\"team-a\",reason=\"permission_denied\"} 2",
        "inferencecache_producer_blocks_total{identity=\"team-a\"} 3",
        "inferencecache_producer_auth_total{result=\"ok\"}",
    ] {
        assert!(body.contains(line), "missing {line}\n{body}");
    }
    let body = reqwest::get(s.control_url("/snapshot"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let snap: serde_json::Value = serde_json::from_str(&body).unwrap();
    let rows = snap["producers"].as_array().expect("producers key");
    assert_eq!(rows.len(), 2, "{snap}");
    assert_eq!(rows[0]["identity"], "team-a");
    assert_eq!(rows[0]["subject"], SPIFFE_A);
    assert_eq!(rows[0]["rejectedPermission"], 2);
    assert_ne!(rows[0]["lastSeen"], "0001-01-01T00:00:00Z");
    assert_eq!(rows[1]["identity"], "team-b");
    assert_eq!(rows[1]["subject"], "CN=team-b");
    s.stop().await;
}

#[tokio::test]
async fn a_flood_from_one_identity_is_throttled_while_another_keeps_writing() {
    let limits = Limits {
        blocks_per_second: 2_000,
        burst_blocks: 4_000,
        max_streams: 2,
    };
    let (s, pki) = mtls_server("flood", limits).await;
    let mut flood = client(&s, &pki, "team-a", None).await;
    let mut quiet = client(&s, &pki, "team-b", None).await;

    // 200 updates × 100 blocks = 20,000 blocks at once: far over the burst.
    let burst: Vec<_> = (0..200)
        .map(|i| update("team-a", "ra", i * 100, 100))
        .collect();
    let flooding = tokio::spawn(async move { report(&mut flood, burst).await });
    // Meanwhile team-b writes 20 small updates, each visible at once.
    for i in 0..20u32 {
        report(&mut quiet, vec![update("team-b", "rb", i * 10, 10)])
            .await
            .unwrap_or_else(|e| panic!("team-b update {i} refused: {e:?}"));
        let hit = quiet
            .lookup_route(LookupRouteRequest {
                model_id: "m".into(),
                tenant_id: "team-b".into(),
                hash_scheme: "vllm".into(),
                block_hashes: (i * 10..i * 10 + 10)
                    .map(|h| h.to_be_bytes().to_vec().into())
                    .collect(),
                block_token_counts: vec![16; 10],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(hit.reason_code, "PREFIX_MATCH", "team-b update {i} visible");
    }
    let err = flooding.await.unwrap().expect_err("the flood is throttled");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    let hint = inferencecache_server::producer::retry_pushback(&err).expect("retry hint");
    assert!(hint.as_millis() >= 1, "{hint:?}");
    assert!(err.message().contains("team-a"), "{}", err.message());

    // Whole updates only: what landed is a multiple of 100 blocks, within
    // the burst plus what the bucket refilled meanwhile.
    let landed = prefixes(&mut quiet, "team-a").await;
    assert!(landed > 0 && landed % 100 == 0, "{landed}");
    assert!(landed < 20_000, "{landed}");
    assert_eq!(prefixes(&mut quiet, "team-b").await, 200);

    let body = s.metrics_text().await;
    assert!(
        body.contains(
            "inferencecache_producer_rejected_total{identity=\"team-a\",reason=\"rate_limited\"} 1"
        ),
        "{body}"
    );
    assert!(
        !body.contains("identity=\"team-b\",reason="),
        "team-b never refused\n{body}"
    );
    s.stop().await;
}

#[tokio::test]
async fn open_streams_are_capped_per_identity() {
    let limits = Limits {
        max_streams: 2,
        ..Limits::default()
    };
    let (s, pki) = mtls_server("streams", limits).await;
    let mut a = client(&s, &pki, "team-a", None).await;
    // Two open streams (their senders held open), then a third.
    let mut held = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = tokio::sync::mpsc::channel::<CacheStateUpdate>(1);
        tx.send(update("team-a", "ra", 1, 1)).await.unwrap();
        let mut c = a.clone();
        let call = tokio::spawn(async move {
            c.report_cache_state(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
        });
        held.push((tx, call));
    }
    // Both are open once the server's gauge says so.
    let open = "inferencecache_producer_open_streams{identity=\"team-a\"} 2";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !s.metrics_text().await.contains(open) {
        assert!(
            std::time::Instant::now() < deadline,
            "two open streams never counted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let err = report(&mut a, vec![update("team-a", "ra", 2, 1)])
        .await
        .expect_err("third stream refused");
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(inferencecache_server::producer::retry_pushback(&err).is_some());
    // Another identity is not affected.
    let mut b = client(&s, &pki, "team-b", None).await;
    report(&mut b, vec![update("team-b", "rb", 1, 1)])
        .await
        .unwrap();
    // Closing one frees a slot.
    let (tx, call) = held.pop().unwrap();
    drop(tx);
    call.await.unwrap().unwrap();
    report(&mut a, vec![update("team-a", "ra", 3, 1)])
        .await
        .unwrap();
    let body = s.metrics_text().await;
    assert!(
        body.contains("inferencecache_producer_rejected_total{identity=\"team-a\",reason=\"too_many_streams\"} 1"),
        "{body}"
    );
    drop(held);
    s.stop().await;
}

#[tokio::test]
async fn no_client_certificate_no_write() {
    // mTLS without a certificate fails the handshake already; with
    // `--producer-auth mtls` the server also refuses to start without a
    // client CA, so there is no plaintext path to write through.
    let mut config = ServerConfig::ephemeral();
    config.producer.auth = ProducerAuth::Mtls;
    let err = inferencecache_server::Server::bind(&config)
        .await
        .expect_err("mtls needs a client CA");
    assert!(err.to_string().contains("--tls-client-ca-file"), "{err}");
}

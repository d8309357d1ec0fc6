//! `--producer-auth token` against a real kube-apiserver + etcd: tokens
//! minted through TokenRequest for service accounts of two namespaces
//! (audience `inferencecache.io/producer`). A sidecar of namespace A writes
//! tenant A (and a tenant granted by `--producer-tenants-file`); its write
//! to tenant B is refused and nothing of it lands; no token, a token for
//! another audience and an expired token are refused; `--consumer-auth`
//! gates lookups. Skipped with a printed reason when the binaries are
//! absent, unless INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Running;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::{
    CacheEvent, CacheStateUpdate, GetCacheStateRequest, LookupPdRouteRequest, LookupRouteRequest,
    PrefixEntry, RenderTemplateRequest, cache_event,
};
use inferencecache_server::ServerConfig;
use inferencecache_server::producer::{
    DEFAULT_CONSUMER_AUDIENCE, DEFAULT_PRODUCER_AUDIENCE, ProducerAuth, ProducerConfig,
};
use inferencecache_testkit::kube::{Cluster, apiserver_binary};
use tonic::Code;
use tonic::transport::Channel;

fn update(tenant: &str, replica: &str, first: u8, blocks: u8) -> CacheStateUpdate {
    CacheStateUpdate {
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: tenant.into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            block_hashes: (first..first + blocks).map(|h| vec![h]).collect(),
            block_token_counts: vec![16; blocks as usize],
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn with_token<T>(msg: T, token: Option<&str>) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    if let Some(t) = token {
        r.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    r
}

async fn report(
    c: &mut InferenceCacheClient<Channel>,
    token: Option<&str>,
    updates: Vec<CacheStateUpdate>,
) -> Result<(), tonic::Status> {
    c.report_cache_state(with_token(futures::stream::iter(updates), token))
        .await
        .map(|_| ())
}

async fn prefixes(c: &mut InferenceCacheClient<Channel>, token: &str, tenant: &str) -> i64 {
    c.get_cache_state(with_token(
        GetCacheStateRequest {
            model_id: "m".into(),
            tenant_id: tenant.into(),
        },
        Some(token),
    ))
    .await
    .unwrap()
    .into_inner()
    .summary
    .unwrap()
    .total_prefixes
}

#[tokio::test]
async fn producers_write_only_their_namespaces_tenants() {
    let Some(bin) = apiserver_binary() else {
        return;
    };
    let cluster = Cluster::start(&bin).await;
    for ns in ["team-a", "team-b", "gateways"] {
        cluster.service_account(ns, "sidecar").await;
    }
    let grants = cluster.path("grants.yaml");
    std::fs::write(&grants, "team-a: [shared]\n").unwrap();
    let mut config = ServerConfig::ephemeral();
    config.kubeconfig = Some(cluster.kubeconfig.clone());
    config.producer = ProducerConfig {
        auth: ProducerAuth::Token,
        tenants_file: Some(grants),
        consumer_auth: true,
        ..ProducerConfig::default()
    };
    let s = Running::start_with(config).await;
    let mut c = s.client().await;
    let a = cluster
        .mint("team-a", "sidecar", DEFAULT_PRODUCER_AUDIENCE)
        .await;
    let b = cluster
        .mint("team-b", "sidecar", DEFAULT_PRODUCER_AUDIENCE)
        .await;
    let reader = cluster
        .mint("gateways", "sidecar", DEFAULT_CONSUMER_AUDIENCE)
        .await;

    // Entitled writes land: own namespace, and a granted tenant.
    report(&mut c, Some(&b), vec![update("team-b", "rb", 100, 3)])
        .await
        .unwrap();
    report(
        &mut c,
        Some(&a),
        vec![update("team-a", "ra", 1, 2), update("shared", "ra", 9, 1)],
    )
    .await
    .unwrap();
    assert_eq!(prefixes(&mut c, &reader, "team-a").await, 2);
    assert_eq!(prefixes(&mut c, &reader, "shared").await, 1);
    assert_eq!(prefixes(&mut c, &reader, "team-b").await, 3);

    // A's write to B: refused whole, named, and the stream goes on for A.
    let err = report(
        &mut c,
        Some(&a),
        vec![update("team-b", "ra", 50, 4), update("team-a", "ra", 3, 1)],
    )
    .await
    .expect_err("cross-tenant write");
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    for part in [
        "\"team-b\"",
        "team-a",
        "system:serviceaccount:team-a:sidecar",
    ] {
        assert!(err.message().contains(part), "{part} in {}", err.message());
    }
    assert_eq!(
        prefixes(&mut c, &reader, "team-b").await,
        3,
        "nothing landed in B"
    );
    assert_eq!(
        prefixes(&mut c, &reader, "team-a").await,
        3,
        "A's next update landed"
    );
    let clear_b = CacheEvent {
        r#type: cache_event::Type::AllCleared as i32,
        replica_id: "rb".into(),
        model_id: "m".into(),
        tenant_id: "team-b".into(),
        ..Default::default()
    };
    let err = c
        .publish_event(with_token(clear_b.clone(), Some(&a)))
        .await
        .expect_err("A may not clear B's replica");
    assert_eq!(err.code(), Code::PermissionDenied);
    assert_eq!(prefixes(&mut c, &reader, "team-b").await, 3);

    // Refused credentials write nothing: none, garbage, another audience,
    // expired. The expired one is A's valid token re-dated and re-signed.
    let wrong_audience = cluster.mint("team-a", "sidecar", "someone-else").await;
    let expired = cluster.expired(&a);
    for (what, token) in [
        ("no token", None),
        ("garbage", Some("garbage")),
        ("wrong audience", Some(wrong_audience.as_str())),
        ("expired", Some(expired.as_str())),
    ] {
        let err = report(&mut c, token, vec![update("team-a", "ra", 200, 1)])
            .await
            .expect_err(what);
        assert_eq!(err.code(), Code::Unauthenticated, "{what}: {err:?}");
        let err = c
            .publish_event(with_token(clear_b.clone(), token))
            .await
            .expect_err(what);
        assert_eq!(err.code(), Code::Unauthenticated, "{what}: {err:?}");
    }
    assert_eq!(
        prefixes(&mut c, &reader, "team-a").await,
        3,
        "nothing landed"
    );
    assert_eq!(prefixes(&mut c, &reader, "team-b").await, 3);

    // B clears its own replica.
    c.publish_event(with_token(clear_b, Some(&b)))
        .await
        .unwrap();
    assert_eq!(prefixes(&mut c, &reader, "team-b").await, 0);

    // --consumer-auth: lookups need a consumer-audience token.
    let lookup = || LookupRouteRequest {
        model_id: "m".into(),
        tenant_id: "team-a".into(),
        hash_scheme: "vllm".into(),
        block_hashes: vec![vec![1].into(), vec![2].into()],
        block_token_counts: vec![16, 16],
        ..Default::default()
    };
    let hit = c
        .lookup_route(with_token(lookup(), Some(&reader)))
        .await
        .unwrap()
        .into_inner();
    assert!(!hit.reason_code.is_empty(), "served: {hit:?}");
    for (what, token) in [("no token", None), ("producer audience", Some(a.as_str()))] {
        let err = c
            .lookup_route(with_token(lookup(), token))
            .await
            .expect_err(what);
        assert_eq!(err.code(), Code::Unauthenticated, "{what}");
    }
    // The other read RPCs a gateway calls are consumers too.
    let pd = LookupPdRouteRequest {
        tenant_id: "team-a".into(),
        ..Default::default()
    };
    let render = RenderTemplateRequest {
        tenant_id: "team-a".into(),
        ..Default::default()
    };
    assert!(
        c.lookup_pd_route(with_token(pd.clone(), Some(&reader)))
            .await
            .is_ok()
    );
    assert!(
        c.render_template(with_token(render.clone(), Some(&reader)))
            .await
            .is_ok()
    );
    let err = c
        .lookup_pd_route(with_token(pd, None))
        .await
        .expect_err("pd");
    assert_eq!(err.code(), Code::Unauthenticated, "LookupPDRoute");
    let err = c
        .render_template(with_token(render, None))
        .await
        .expect_err("render");
    assert_eq!(err.code(), Code::Unauthenticated, "RenderTemplate");

    let body = s.metrics_text().await;
    for line in [
        "inferencecache_producer_rejected_total{identity=\"team-a\",reason=\"permission_denied\"} 2",
        "inferencecache_producer_auth_total{result=\"unauthenticated\"} 8",
        "inferencecache_consumer_auth_total{result=\"unauthenticated\"} 4",
    ] {
        assert!(body.contains(line), "missing {line}\n{body}");
    }
    s.stop().await;
}

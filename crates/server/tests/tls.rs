//! gRPC TLS with real certificates made in the test (rcgen): TLS clients are
//! served, plaintext ones refused, a rotated certificate is served after
//! reload, a bad rotation keeps the last good pair, and mTLS refuses clients
//! without a certificate from the client CA.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Running;
use common::certs::{Ca, Dir, server_files, write_newer};
use inferencecache_proto::v1alpha1::LookupRouteRequest;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_server::ServerConfig;
use std::time::Duration;
use tonic::transport::Channel;

async fn tls_server(dir: &Dir, ca: &Ca, client_ca: Option<&Ca>) -> Running {
    let mut config = ServerConfig::ephemeral();
    config.tls = Some(server_files(dir, ca, client_ca));
    Running::start_with(config).await
}

async fn call(
    s: &Running,
    trust: &Ca,
    identity: Option<(String, String)>,
) -> Result<String, String> {
    let channel = common::certs::channel(s.grpc, trust, identity).await?;
    let resp = InferenceCacheClient::new(channel)
        .lookup_route(LookupRouteRequest::default())
        .await
        .map_err(|e| format!("call: {e:?}"))?;
    Ok(resp.into_inner().reason_code)
}

#[tokio::test]
async fn tls_client_is_served_and_the_gauge_says_so() {
    let dir = Dir::new("basic");
    let ca = Ca::new("ca");
    let s = tls_server(&dir, &ca, None).await;
    assert_eq!(call(&s, &ca, None).await.unwrap(), "NO_HINT");
    let body = s.metrics_text().await;
    assert!(
        body.contains("\ninferencecache_server_grpc_tls_enabled 1\n"),
        "{body}"
    );
    s.stop().await;
}

#[tokio::test]
async fn plaintext_client_is_refused_by_a_tls_server() {
    let dir = Dir::new("plain");
    let ca = Ca::new("ca");
    let s = tls_server(&dir, &ca, None).await;
    let attempt = async {
        let ch = Channel::from_shared(format!("http://{}", s.grpc))
            .unwrap()
            .connect()
            .await?;
        InferenceCacheClient::new(ch)
            .lookup_route(LookupRouteRequest::default())
            .await
            .map_err(|e| -> Box<dyn std::error::Error> { Box::new(e) })?;
        Ok::<_, Box<dyn std::error::Error>>(())
    };
    let r = tokio::time::timeout(Duration::from_secs(10), attempt).await;
    assert!(
        matches!(r, Ok(Err(_)) | Err(_)),
        "plaintext must not be served"
    );
    s.stop().await;
}

#[tokio::test]
async fn rotated_certificate_is_served_after_reload_and_a_bad_one_is_ignored() {
    let dir = Dir::new("rotate");
    let (ca1, ca2) = (Ca::new("ca1"), Ca::new("ca2"));
    let s = tls_server(&dir, &ca1, None).await;
    assert!(call(&s, &ca1, None).await.is_ok());

    // Rotate to a certificate from another CA.
    let (cert, key) = ca2.leaf();
    write_newer(&dir.path("tls.key"), &key, Duration::from_secs(2));
    write_newer(&dir.path("tls.crt"), &cert, Duration::from_secs(2));
    assert_eq!(
        call(&s, &ca2, None).await.unwrap(),
        "NO_HINT",
        "new pair served"
    );
    assert!(
        call(&s, &ca1, None).await.is_err(),
        "old CA no longer matches"
    );

    // A broken rotation keeps the last good pair.
    write_newer(
        &dir.path("tls.crt"),
        "not a certificate",
        Duration::from_secs(4),
    );
    assert_eq!(
        call(&s, &ca2, None).await.unwrap(),
        "NO_HINT",
        "last good pair kept"
    );
    s.stop().await;
}

#[tokio::test]
async fn mtls_refuses_clients_without_a_certificate_from_the_client_ca() {
    let dir = Dir::new("mtls");
    let (server_ca, client_ca, rogue_ca) =
        (Ca::new("server"), Ca::new("clients"), Ca::new("rogue"));
    let s = tls_server(&dir, &server_ca, Some(&client_ca)).await;
    assert!(
        call(&s, &server_ca, None).await.is_err(),
        "no client certificate"
    );
    assert!(
        call(&s, &server_ca, Some(rogue_ca.leaf())).await.is_err(),
        "untrusted client CA"
    );
    assert_eq!(
        call(&s, &server_ca, Some(client_ca.leaf())).await.unwrap(),
        "NO_HINT"
    );
    s.stop().await;
}

//! Every failure of a lookup is a `NoHint`; only creating a client from a
//! malformed endpoint is an error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Running;
use inferencecache_client::{
    Client, ClientConfig, ClientError, Code, Hint, NoHintReason, RouteInput, RouteQuery, TlsOptions,
};
use std::time::{Duration, Instant};

fn query(input: RouteInput) -> RouteQuery {
    RouteQuery::new("t", "m", input)
}

fn tokens() -> RouteQuery {
    query(RouteInput::TokenIds((0..64).collect()))
}

/// A loopback port with nothing listening.
async fn closed_port() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable_and_lazy_connect_does_not_fail() {
    let addr = closed_port().await;
    let client = Client::connect_lazy(
        ClientConfig::new(format!("http://{addr}")).lookup_deadline(Duration::from_secs(2)),
    )
    .expect("lazy connect never dials");
    let started = Instant::now();
    let answer = client.lookup_route(&tokens()).await;
    assert_eq!(answer.hint, Hint::NoHint(NoHintReason::Unavailable));
    assert_eq!(answer.hint.reason_code(), "UNAVAILABLE");
    assert!(started.elapsed() < Duration::from_secs(2));
    // The eager connect reports the same thing as an error, for tools.
    let err = Client::connect(ClientConfig::new(addr.clone()))
        .await
        .unwrap_err();
    assert!(err.is_unreachable(), "{err}");
    assert!(err.to_string().contains(&addr), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unresolvable_host_is_unavailable() {
    let client = Client::connect_lazy(
        ClientConfig::new("http://no-such-host.invalid:9090")
            .lookup_deadline(Duration::from_secs(3)),
    )
    .unwrap();
    let answer = client.lookup_route(&tokens()).await;
    assert!(
        matches!(
            answer.hint,
            Hint::NoHint(NoHintReason::Unavailable | NoHintReason::DeadlineExceeded)
        ),
        "{:?}",
        answer.hint
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_endpoints_and_tls_files_are_refused_up_front() {
    for bad in ["", "ftp://h:1", "http://", "http://bad host:1"] {
        let err = Client::connect_lazy(ClientConfig::new(bad)).unwrap_err();
        assert!(
            matches!(err, ClientError::InvalidEndpoint { .. }),
            "{bad}: {err}"
        );
    }
    let err = Client::connect_lazy(
        ClientConfig::new("https://h:1").tls(TlsOptions::with_ca("/no/such/ca.pem")),
    )
    .unwrap_err();
    assert!(matches!(err, ClientError::Tls(_)), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_error_from_the_real_server_is_no_hint() {
    let s = Running::start().await;
    let client = common::sdk(&s).await;
    // 2 Mi ids of 5 varint bytes each (10 MiB) pass the client's 16 MiB
    // limit but not the server's 8 MiB one: the server refuses the message
    // with a gRPC status (RESOURCE_EXHAUSTED).
    let answer = client
        .lookup_route(&query(RouteInput::TokenIds(vec![u32::MAX; 2 << 20])))
        .await;
    let Hint::NoHint(NoHintReason::Error(message)) = &answer.hint else {
        panic!("{:?}", answer.hint);
    };
    assert!(message.contains("too large"), "{message}");
    assert_eq!(answer.hint.reason_code(), "ERROR");
    // The raw call shows the status itself.
    let raw = client
        .lookup_route_raw(
            query(RouteInput::TokenIds(vec![u32::MAX; 2 << 20])).to_request(),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&raw, ClientError::Status(st) if st.code() == Code::ResourceExhausted),
        "{raw}"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_that_is_not_grpc_is_no_hint() {
    let s = Running::start().await;
    // The server's public HTTP listener answers gRPC paths with HTTP 404.
    let client = Client::connect(
        ClientConfig::new(format!("http://{}", s.http)).lookup_deadline(Duration::from_secs(5)),
    )
    .await
    .unwrap();
    let answer = client.lookup_route(&tokens()).await;
    assert!(
        matches!(
            answer.hint,
            Hint::NoHint(NoHintReason::Error(_) | NoHintReason::Unavailable)
        ),
        "{:?}",
        answer.hint
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_against_a_plaintext_server_is_unavailable() {
    let s = Running::start().await;
    let client = Client::connect_lazy(
        ClientConfig::new(format!("https://{}", s.grpc)).lookup_deadline(Duration::from_secs(5)),
    )
    .unwrap();
    let answer = client.lookup_route(&tokens()).await;
    assert_eq!(answer.hint, Hint::NoHint(NoHintReason::Unavailable));
    s.stop().await;
}

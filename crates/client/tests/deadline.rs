//! A lookup never waits past its deadline: against a peer that accepts and
//! never answers, and against a real server kept busy by a huge prompt.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Isolated, Running};
use inferencecache_client::{Client, ClientConfig, Hint, NoHintReason, RouteInput, RouteQuery};
use std::time::{Duration, Instant};

/// Allowance for scheduling on a loaded 2-core test machine.
const SLACK: Duration = Duration::from_millis(50);

fn query(input: RouteInput) -> RouteQuery {
    RouteQuery::new("t", "m", input)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_never_answers_costs_at_most_the_deadline() {
    // The one stand-in in these tests: a TCP listener that accepts and then
    // says nothing, which is what a wedged server looks like on the wire.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            conns.push(conn);
        }
    });
    let deadline = Duration::from_millis(30);
    let client =
        Client::connect_lazy(ClientConfig::new(addr.to_string()).lookup_deadline(deadline))
            .unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        let answer = client
            .lookup_route(&query(RouteInput::TokenIds((0..64).collect())))
            .await;
        let elapsed = started.elapsed();
        assert_eq!(answer.hint, Hint::NoHint(NoHintReason::DeadlineExceeded));
        assert!(elapsed >= deadline, "{elapsed:?}");
        assert!(elapsed < deadline + SLACK, "{elapsed:?}");
        assert!(answer.latency < deadline + SLACK);
        assert_eq!(answer.server_latency_us, 0);
    }
    // A per-query deadline overrides the client default.
    let mut q = query(RouteInput::PromptText("hello".into()));
    q.deadline = Some(Duration::from_millis(5));
    let started = Instant::now();
    let answer = client.lookup_route(&q).await;
    assert_eq!(answer.hint, Hint::NoHint(NoHintReason::DeadlineExceeded));
    assert!(started.elapsed() < Duration::from_millis(5) + SLACK);
    held.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_real_server_costs_at_most_the_deadline() {
    let s = Isolated::start().await;
    let deadline = Duration::from_millis(5);
    let client = Client::connect(ClientConfig::new(s.endpoint()).lookup_deadline(deadline))
        .await
        .unwrap();
    // Warm the connection so the deadline is spent on the lookup itself.
    let warm = query(RouteInput::TokenIds(vec![1; 16])).deadline(Duration::from_secs(5));
    assert_eq!(
        client.lookup_route(&warm).await.hint,
        Hint::NoHint(NoHintReason::NoHint)
    );
    // 1 Mi token ids (the largest the server accepts): megabytes to move
    // and 65,536 blocks to fingerprint, far more than 5 ms of work even in a
    // release build.
    let big = query(RouteInput::TokenIds(vec![7; 1 << 20]));
    let started = Instant::now();
    let answer = client.lookup_route(&big).await;
    let elapsed = started.elapsed();
    assert_eq!(answer.hint, Hint::NoHint(NoHintReason::DeadlineExceeded));
    assert!(elapsed >= deadline, "{elapsed:?}");
    assert!(elapsed < deadline + SLACK, "{elapsed:?}");
    // The connection is still usable afterwards.
    assert_eq!(
        client.lookup_route(&warm).await.hint,
        Hint::NoHint(NoHintReason::NoHint)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_own_budget_is_a_timeout_no_hint() {
    let s = Running::start().await;
    s.policy(r#"{"version":7,"policies":[{"namespace":"t","lookupTimeoutMs":1}]}"#)
        .await;
    let client = common::sdk(&s).await;
    let answer = client
        .lookup_route(&query(RouteInput::TokenIds(vec![7; 1 << 20])))
        .await;
    assert_eq!(answer.hint, Hint::NoHint(NoHintReason::Timeout));
    assert_eq!(answer.hint.reason_code(), "TIMEOUT");
    assert!(answer.server_latency_us >= 1_000);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zero_deadline_answers_at_once() {
    let s = Running::start().await;
    let client = common::sdk(&s).await;
    let mut q = query(RouteInput::TokenIds(vec![1; 16]));
    q.deadline = Some(Duration::ZERO);
    let answer = client.lookup_route(&q).await;
    assert_eq!(answer.hint, Hint::NoHint(NoHintReason::DeadlineExceeded));
    assert!(answer.latency < SLACK);
    s.stop().await;
}

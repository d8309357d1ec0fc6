//! `/policy` on the control listener over real HTTP (`server.md` §4.2).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Running;

async fn push(
    s: &Running,
    method: reqwest::Method,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    reqwest::Client::new()
        .request(method, s.control_url("/policy"))
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn post_and_put_replace_the_policy_set_with_204() {
    let s = Running::start().await;
    let r = push(
        &s,
        reqwest::Method::POST,
        r#"{"version":7,"policies":[{"namespace":"t","minimumPrefixTokens":128,"eviction":"lfu"}],"tenants":[{"tenantID":"t","maxIndexEntries":10}]}"#,
    )
    .await;
    assert_eq!(r.status(), 204);
    assert!(r.bytes().await.unwrap().is_empty());
    assert_eq!(s.policies.policy("t").minimum_prefix_tokens, 128);
    assert_eq!(s.policies.quota("t"), Some(10));

    let r = push(&s, reqwest::Method::PUT, r#"{"version":7}"#).await;
    assert_eq!(r.status(), 204);
    assert_eq!(
        s.policies.policy("t").minimum_prefix_tokens,
        0,
        "absent reverts to defaults"
    );
    assert_eq!(s.policies.quota("t"), None);

    let metrics = s.metrics_text().await;
    assert!(
        metrics.contains("inferencecache_policy_version 7\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains(
            "inferencecache_policy_updates_total{source=\"http\",result=\"applied\"} 2\n"
        )
    );
    s.stop().await;
}

#[tokio::test]
async fn other_methods_get_405_with_allow() {
    let s = Running::start().await;
    for m in [
        reqwest::Method::GET,
        reqwest::Method::DELETE,
        reqwest::Method::PATCH,
    ] {
        let r = push(&s, m.clone(), "").await;
        assert_eq!(r.status(), 405, "{m}");
        assert_eq!(r.headers()["allow"], "POST, PUT");
        assert_eq!(r.text().await.unwrap(), "method not allowed\n");
    }
    s.stop().await;
}

#[tokio::test]
async fn bad_bodies_get_400_with_the_reason_and_keep_the_old_set() {
    let s = Running::start().await;
    push(
        &s,
        reqwest::Method::POST,
        r#"{"version":7,"policies":[{"namespace":"t","minimumPrefixTokens":9}]}"#,
    )
    .await;
    let cases = [
        (
            r#"{"version":2}"#.to_owned(),
            "unsupported policy snapshot version\n",
        ),
        (
            r#"{"version":9}"#.to_owned(),
            "unsupported policy snapshot version\n",
        ),
        ("not json".to_owned(), "decode policy snapshot: "),
        (
            r#"{"version":7,"unknown":true}"#.to_owned(),
            "decode policy snapshot: unknown field",
        ),
        (
            format!(r#"{{"version":7,"pad":"{}"}}"#, "x".repeat(1 << 20)),
            "decode policy snapshot: http: request body too large\n",
        ),
    ];
    for (body, want) in cases {
        let r = push(&s, reqwest::Method::POST, body).await;
        assert_eq!(r.status(), 400);
        assert_eq!(r.headers()["content-type"], "text/plain; charset=utf-8");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        let text = r.text().await.unwrap();
        assert!(
            text.starts_with(want),
            "{text:?} should start with {want:?}"
        );
    }
    assert_eq!(
        s.policies.policy("t").minimum_prefix_tokens,
        9,
        "refused pushes change nothing"
    );
    s.stop().await;
}

#[tokio::test]
async fn policy_is_not_on_the_public_listener() {
    let s = Running::start().await;
    let r = reqwest::Client::new()
        .post(s.url("/policy"))
        .body(r#"{"version":7}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    s.stop().await;
}

//! Control-endpoint authentication against a real kube-apiserver (built by
//! `.ci/build-kube-apiserver`) with a real etcd (`common::kube`): tokens minted through
//! TokenRequest for the allowed service account pass, another account is
//! forbidden, a wrong audience or garbage is unauthorized, and with the
//! apiserver stopped a cached token still passes while a new one gets 503.
//! Skipped with a printed reason when the binaries are absent, unless
//! INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Running;
use inferencecache_server::{ControlAuth, ServerConfig};
use inferencecache_testkit::kube::{Cluster, apiserver_binary};

const ALLOWED: &str = "system:serviceaccount:default:controller";

async fn mint(cluster: &Cluster, sa: &str, audience: &str) -> String {
    cluster.mint("default", sa, audience).await
}

async fn get(s: &Running, path: &str, token: Option<&str>) -> u16 {
    let mut r = reqwest::Client::new().get(s.control_url(path));
    if let Some(t) = token {
        r = r.header("authorization", format!("Bearer {t}"));
    }
    r.send().await.unwrap().status().as_u16()
}

async fn post(s: &Running, path: &str, token: &str, body: &str) -> u16 {
    reqwest::Client::new()
        .post(s.control_url(path))
        .header("authorization", format!("Bearer {token}"))
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[tokio::test]
async fn control_endpoints_admit_only_the_controller_service_account() {
    let Some(bin) = apiserver_binary() else {
        return;
    };
    let mut cluster = Cluster::start(&bin).await;
    cluster.service_account("default", "controller").await;
    cluster.service_account("default", "other").await;
    let mut config = ServerConfig::ephemeral();
    config.control_auth = ControlAuth::TokenReview {
        allowed_sa: ALLOWED.into(),
        controller_audience: "inferencecache.io/controller".into(),
        policy_audience: "inferencecache.io/policy".into(),
    };
    config.kubeconfig = Some(cluster.kubeconfig.clone());
    let s = Running::start_with(config).await;

    let controller = mint(&cluster, "controller", "inferencecache.io/controller").await;
    let controller_policy = mint(&cluster, "controller", "inferencecache.io/policy").await;
    let other = mint(&cluster, "other", "inferencecache.io/controller").await;
    let wrong_audience = mint(&cluster, "controller", "someone-else").await;

    assert_eq!(get(&s, "/snapshot", Some(&controller)).await, 200);
    assert_eq!(get(&s, "/snapshot", Some(&other)).await, 403);
    assert_eq!(get(&s, "/snapshot", Some(&wrong_audience)).await, 401);
    assert_eq!(get(&s, "/snapshot", Some("garbage")).await, 401);
    assert_eq!(get(&s, "/snapshot", None).await, 401);
    // The status page's data passes the /snapshot gate; its shell holds no
    // data and opens without a token (docs/decisions.md, issue 17).
    for path in ["/ui/state", "/ui/events"] {
        assert_eq!(get(&s, path, Some(&controller)).await, 200, "{path}");
        assert_eq!(get(&s, path, Some(&other)).await, 403, "{path}");
        assert_eq!(get(&s, path, None).await, 401, "{path}");
    }
    assert_eq!(get(&s, "/ui", None).await, 200);
    assert_eq!(
        post(&s, "/policy", &controller_policy, r#"{"version":7}"#).await,
        204
    );
    assert_eq!(
        post(&s, "/policy", &controller, r#"{"version":7}"#).await,
        401,
        "the controller audience is not the policy audience"
    );
    assert_eq!(
        post(
            &s,
            "/probe",
            &controller,
            r#"{"backend":"b","model":"m","hashScheme":"vllm"}"#
        )
        .await,
        200
    );

    // The operator's pushes: the same audience and rules as /policy.
    let other_policy = mint(&cluster, "other", "inferencecache.io/policy").await;
    for path in ["/templates", "/pd-topologies"] {
        assert_eq!(
            post(&s, path, &controller_policy, "[]").await,
            204,
            "{path}"
        );
        assert_eq!(
            post(&s, path, &controller, "[]").await,
            401,
            "{path}: the controller audience is not the policy audience"
        );
        assert_eq!(post(&s, path, &other_policy, "[]").await, 403, "{path}");
        assert_eq!(post(&s, path, "garbage", "[]").await, 401, "{path}");
    }

    // Apiserver gone: the cached token still passes (no second review), an
    // unseen one cannot be reviewed.
    cluster.stop_apiserver();
    assert_eq!(
        get(&s, "/snapshot", Some(&controller)).await,
        200,
        "cache hit"
    );
    let fresh = format!("{other}x");
    assert_eq!(get(&s, "/snapshot", Some(&fresh)).await, 503);

    let body = s.metrics_text().await;
    for line in [
        // (/ui/state and /ui/events count with /snapshot: +2 of each.)
        "inferencecache_snapshot_auth_total{result=\"ok\"} 4",
        "inferencecache_snapshot_auth_total{result=\"forbidden\"} 3",
        "inferencecache_snapshot_auth_total{result=\"unauth\"} 5",
        "inferencecache_snapshot_auth_total{result=\"error\"} 1",
        "inferencecache_policy_auth_total{result=\"ok\"} 1",
        "inferencecache_policy_auth_total{result=\"unauth\"} 1",
        "inferencecache_probe_auth_total{result=\"ok\"} 1",
        "inferencecache_templates_auth_total{result=\"ok\"} 1",
        "inferencecache_templates_auth_total{result=\"unauth\"} 2",
        "inferencecache_templates_auth_total{result=\"forbidden\"} 1",
        "inferencecache_pd_topologies_auth_total{result=\"ok\"} 1",
        "inferencecache_pd_topologies_auth_total{result=\"unauth\"} 2",
        "inferencecache_pd_topologies_auth_total{result=\"forbidden\"} 1",
    ] {
        assert!(body.contains(line), "missing {line}\n{body}");
    }
    s.stop().await;
}

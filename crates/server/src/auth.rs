//! Control-endpoint authentication (`server.md` §5.2): a bearer token is
//! checked with a Kubernetes TokenReview bound to the endpoint's audience,
//! and the reviewed username must be the controller's service account.
//! Validated tokens are cached for 30 s (32 entries, keyed by the token's
//! SHA-256, never the token itself). Each endpoint has its own
//! authenticator, cache and `inferencecache_<endpoint>_auth_total` counter.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a validated token is trusted without a new review.
pub(crate) const CACHE_TTL: Duration = Duration::from_secs(30);
/// Most cached tokens per authenticator.
pub(crate) const CACHE_MAX: usize = 32;

/// Label of the auth counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub(crate) struct ResultLabel {
    /// ok, unauth, forbidden or error.
    pub(crate) result: String,
}

/// Authentication outcomes of the control endpoints, one family per
/// endpoint (each endpoint has its own authenticator and cache). The HTTP
/// edge registers them; `serve` hands each authenticator its counter.
#[derive(Debug, Default)]
pub(crate) struct ControlAuthMetrics {
    /// `/snapshot` (and `/ui/state`, `/ui/events`).
    pub(crate) snapshot: Family<ResultLabel, Counter>,
    /// `/policy`.
    pub(crate) policy: Family<ResultLabel, Counter>,
    /// `/probe`.
    pub(crate) probe: Family<ResultLabel, Counter>,
    /// `/templates`.
    pub(crate) templates: Family<ResultLabel, Counter>,
    /// `/pd-topologies`.
    pub(crate) pd_topologies: Family<ResultLabel, Counter>,
}

impl ControlAuthMetrics {
    /// Creates the families and registers them.
    pub(crate) fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Self::default();
        for (name, endpoint, family) in [
            ("inferencecache_snapshot_auth", "/snapshot", &m.snapshot),
            ("inferencecache_policy_auth", "/policy", &m.policy),
            ("inferencecache_probe_auth", "/probe", &m.probe),
            ("inferencecache_templates_auth", "/templates", &m.templates),
            (
                "inferencecache_pd_topologies_auth",
                "/pd-topologies",
                &m.pd_topologies,
            ),
        ] {
            registry.register(
                name,
                format!(
                    "Authentication outcomes for the internal {endpoint} endpoint (ok|unauth|forbidden|error)"
                ),
                family.clone(),
            );
        }
        m
    }
}

/// The outcome of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthOutcome {
    /// Admitted.
    Ok,
    /// 401: missing/malformed token, or the review did not authenticate it.
    Unauthorized,
    /// 403: authenticated as someone else.
    Forbidden,
    /// 503: the review could not be made.
    Unavailable,
}

impl AuthOutcome {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Unauthorized => "unauth",
            Self::Forbidden => "forbidden",
            Self::Unavailable => "error",
        }
    }
}

/// Reviews bearer tokens for one endpoint.
pub(crate) struct Authenticator {
    client: kube::Client,
    audience: String,
    expected_user: String,
    cache: Mutex<HashMap<[u8; 32], Instant>>,
    counter: Family<ResultLabel, Counter>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("audience", &self.audience)
            .field("expected_user", &self.expected_user)
            .finish_non_exhaustive()
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme compared
/// case-insensitively, token trimmed); `None` when missing or malformed.
pub(crate) fn bearer_token(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let token = token.trim();
    (!token.is_empty()).then_some(token)
}

impl Authenticator {
    /// An authenticator whose outcomes are counted in `counter`.
    pub(crate) fn new(
        client: kube::Client,
        audience: &str,
        expected_user: &str,
        counter: Family<ResultLabel, Counter>,
    ) -> Self {
        Self {
            client,
            audience: audience.to_owned(),
            expected_user: expected_user.to_owned(),
            cache: Mutex::new(HashMap::new()),
            counter,
        }
    }

    /// Checks one request's `Authorization` header.
    pub(crate) async fn check(&self, authorization: Option<&str>) -> AuthOutcome {
        let outcome = self.review(authorization).await;
        self.counter
            .get_or_create(&ResultLabel {
                result: outcome.label().to_owned(),
            })
            .inc();
        outcome
    }

    fn cached(&self, key: &[u8; 32]) -> bool {
        let cache = match self.cache.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        cache.get(key).is_some_and(|&exp| Instant::now() < exp)
    }

    fn remember(&self, key: [u8; 32]) {
        let mut cache = match self.cache.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        let now = Instant::now();
        if cache.len() >= CACHE_MAX && !cache.contains_key(&key) {
            cache.retain(|_, exp| *exp > now);
            if cache.len() >= CACHE_MAX {
                if let Some(soonest) = cache.iter().min_by_key(|(_, e)| **e).map(|(k, _)| *k) {
                    cache.remove(&soonest);
                }
            }
        }
        cache.insert(key, now + CACHE_TTL);
    }

    async fn review(&self, authorization: Option<&str>) -> AuthOutcome {
        let Some(token) = bearer_token(authorization) else {
            return AuthOutcome::Unauthorized;
        };
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if self.cached(&key) {
            return AuthOutcome::Ok;
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: (!self.audience.is_empty()).then(|| vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let reviewed = match api.create(&PostParams::default(), &review).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "auth_token_review_failed");
                return AuthOutcome::Unavailable;
            }
        };
        let Some(status) = reviewed.status else {
            return AuthOutcome::Unavailable;
        };
        if status.authenticated != Some(true) {
            let error = status.error.unwrap_or_default();
            tracing::warn!(error = %error, "auth_token_review_unauthenticated");
            return AuthOutcome::Unauthorized;
        }
        let user = status.user.and_then(|u| u.username).unwrap_or_default();
        if user != self.expected_user {
            return AuthOutcome::Forbidden;
        }
        self.remember(key);
        AuthOutcome::Ok
    }
}

/// Builds the Kubernetes client: `kubeconfig` when given, else `KUBECONFIG`
/// / in-cluster configuration.
pub(crate) async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
) -> Result<kube::Client, String> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("read kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            format!("no in-cluster config or KUBECONFIG ({e}); pass --kubeconfig when running outside a cluster")
        })?,
    };
    kube::Client::try_from(config).map_err(|e| format!("kubernetes client: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer_token(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(Some("bearer   abc  ")), Some("abc"));
        assert_eq!(bearer_token(Some("BEARER abc")), Some("abc"));
        assert_eq!(bearer_token(Some("Basic abc")), None);
        assert_eq!(bearer_token(Some("Bearer ")), None);
        assert_eq!(bearer_token(Some("Bearer")), None);
        assert_eq!(bearer_token(None), None);
    }
}

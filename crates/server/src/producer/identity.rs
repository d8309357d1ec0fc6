//! Who is calling: a producer's identity from a projected service-account
//! token (reviewed with a Kubernetes TokenReview) or from a verified client
//! certificate (mTLS: SPIFFE URI SAN, else CN).
//!
//! The identity that scopes writes is the pod's **namespace**; the full
//! principal (service-account username, SPIFFE id or CN) is kept for
//! messages and grants. Reviews are cached by the token's SHA-256 (never the
//! token) for a short TTL, in a bounded map: a sidecar's stream opens and its
//! `PublishEvent`s cost one review per token per TTL, not one per call.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// How long a successful review is trusted without a new one.
pub const REVIEW_TTL: Duration = Duration::from_secs(30);
/// How long a refused token stays refused without a new review (a client
/// retrying a bad token must not turn into a TokenReview flood).
pub const REFUSAL_TTL: Duration = Duration::from_secs(5);
/// Most cached reviews (one per live token: a pod's projected token, so
/// roughly one per sidecar and gateway replica).
pub const REVIEW_CACHE_MAX: usize = 4096;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    /// The identity writes are scoped to: the namespace (token: from the
    /// service-account username; mTLS: from the SPIFFE id), or the
    /// certificate's CN when it carries no SPIFFE id.
    pub identity: String,
    /// The full principal: `system:serviceaccount:<ns>:<sa>`,
    /// `spiffe://<td>/ns/<ns>/sa/<sa>` or `CN=<cn>`.
    pub subject: String,
}

/// Why a caller was not authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No usable credential, or the review refused it (gRPC UNAUTHENTICATED).
    Unauthenticated(String),
    /// The review could not be made (gRPC UNAVAILABLE: retry later).
    Unavailable(String),
}

/// The namespace of a service-account username
/// (`system:serviceaccount:<namespace>:<name>`).
pub fn namespace_of_username(username: &str) -> Option<&str> {
    let rest = username.strip_prefix("system:serviceaccount:")?;
    let (ns, name) = rest.split_once(':')?;
    (!ns.is_empty() && !name.is_empty() && !name.contains(':')).then_some(ns)
}

/// The namespace of a SPIFFE id in the service-mesh form
/// `spiffe://<trust-domain>/ns/<namespace>/sa/<account>`.
pub fn namespace_of_spiffe(uri: &str) -> Option<&str> {
    let rest = uri.strip_prefix("spiffe://")?;
    let (domain, path) = rest.split_once('/')?;
    let mut parts = path.split('/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some("ns"), Some(ns), Some("sa"), Some(sa))
            if !domain.is_empty() && !ns.is_empty() && !sa.is_empty() && parts.next().is_none() =>
        {
            Some(ns)
        }
        _ => None,
    }
}

/// The principal of a verified client certificate (DER): the first SPIFFE
/// URI SAN of the `/ns/<ns>/sa/<sa>` form, else the subject CN.
pub fn principal_of_certificate(der: &[u8]) -> Result<Principal, AuthError> {
    let bad = |why: String| AuthError::Unauthenticated(format!("client certificate: {why}"));
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|e| bad(e.to_string()))?;
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(uri) = name {
                if let Some(ns) = namespace_of_spiffe(uri) {
                    return Ok(Principal {
                        identity: ns.to_owned(),
                        subject: (*uri).to_owned(),
                    });
                }
            }
        }
    }
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .filter(|cn| !cn.is_empty())
        .ok_or_else(|| bad("no SPIFFE URI SAN (spiffe://<td>/ns/<ns>/sa/<sa>) and no CN".into()))?;
    Ok(Principal {
        identity: cn.to_owned(),
        subject: format!("CN={cn}"),
    })
}

type Reviewed = Result<Principal, AuthError>;

/// Reviews bearer tokens for one audience, with a bounded TTL cache.
pub struct TokenReviewer {
    client: kube::Client,
    audience: String,
    ttl: Duration,
    cache: RwLock<HashMap<[u8; 32], (Instant, Reviewed)>>,
}

impl std::fmt::Debug for TokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenReviewer")
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl TokenReviewer {
    /// A reviewer for tokens bound to `audience`, trusting a review for
    /// `ttl` ([`REVIEW_TTL`] in production).
    pub fn new(client: kube::Client, audience: &str, ttl: Duration) -> Self {
        Self {
            client,
            audience: audience.to_owned(),
            ttl,
            cache: RwLock::new(HashMap::new()),
        }
    }

    /// The audience tokens must carry.
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// The principal of `authorization` (an `authorization` header value).
    pub async fn review(&self, authorization: Option<&str>) -> Reviewed {
        let Some(token) = crate::auth::bearer_token(authorization) else {
            return Err(AuthError::Unauthenticated(
                "no `authorization: Bearer <token>` metadata".into(),
            ));
        };
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some(hit) = self.cached(&key) {
            return hit;
        }
        let reviewed = self.ask(token).await;
        let ttl = match &reviewed {
            Ok(_) => self.ttl,
            Err(AuthError::Unauthenticated(_)) => REFUSAL_TTL.min(self.ttl),
            // Not cached: the next call asks again.
            Err(AuthError::Unavailable(_)) => return reviewed,
        };
        self.remember(key, ttl, reviewed.clone());
        reviewed
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Reviewed> {
        let cache = match self.cache.read() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        let (expires, r) = cache.get(key)?;
        (Instant::now() < *expires).then(|| r.clone())
    }

    fn remember(&self, key: [u8; 32], ttl: Duration, reviewed: Reviewed) {
        let mut cache = match self.cache.write() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        let now = Instant::now();
        if cache.len() >= REVIEW_CACHE_MAX && !cache.contains_key(&key) {
            cache.retain(|_, (exp, _)| *exp > now);
            if cache.len() >= REVIEW_CACHE_MAX {
                if let Some(soonest) = cache.iter().min_by_key(|(_, (e, _))| *e).map(|(k, _)| *k) {
                    cache.remove(&soonest);
                }
            }
        }
        cache.insert(key, (now + ttl, reviewed));
    }

    async fn ask(&self, token: &str) -> Reviewed {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let reviewed = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "producer_token_review_failed");
                AuthError::Unavailable(format!("token review unavailable: {e}"))
            })?;
        let status = reviewed
            .status
            .ok_or_else(|| AuthError::Unavailable("token review returned no status".into()))?;
        if status.authenticated != Some(true) {
            let why = status.error.unwrap_or_default();
            return Err(AuthError::Unauthenticated(format!(
                "token not valid for audience {:?}: {why}",
                self.audience
            )));
        }
        let username = status.user.and_then(|u| u.username).unwrap_or_default();
        let ns = namespace_of_username(&username).ok_or_else(|| {
            AuthError::Unauthenticated(format!(
                "{username:?} is not a service account (system:serviceaccount:<ns>:<name>)"
            ))
        })?;
        Ok(Principal {
            identity: ns.to_owned(),
            subject: username.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usernames() {
        assert_eq!(
            namespace_of_username("system:serviceaccount:team-a:sidecar"),
            Some("team-a")
        );
        for bad in [
            "system:serviceaccount:team-a",
            "system:serviceaccount::x",
            "system:serviceaccount:a:",
            "system:serviceaccount:a:b:c",
            "alice",
            "",
        ] {
            assert_eq!(namespace_of_username(bad), None, "{bad}");
        }
    }

    #[test]
    fn spiffe_ids() {
        assert_eq!(
            namespace_of_spiffe("spiffe://cluster.local/ns/team-a/sa/sidecar"),
            Some("team-a")
        );
        for bad in [
            "spiffe://cluster.local/ns/team-a",
            "spiffe://cluster.local/ns//sa/x",
            "spiffe:///ns/a/sa/x",
            "spiffe://td/ns/a/sa/x/extra",
            "spiffe://td/sa/x/ns/a",
            "https://td/ns/a/sa/x",
        ] {
            assert_eq!(namespace_of_spiffe(bad), None, "{bad}");
        }
    }
}

//! Producer authorization and ingest limits (issue 19, docs/security.md).
//!
//! Writes to the index (`ReportCacheState`, `PublishEvent`) decide where
//! other tenants' requests go, so with `--producer-auth token|mtls` only a
//! tenant's own sidecars may write it:
//!
//! 1. **Identity** ([`identity`]): `token` reviews the `authorization:
//!    Bearer` metadata (a projected service-account token with audience
//!    `inferencecache.io/producer`) with a cached TokenReview and takes the
//!    pod's namespace; `mtls` takes the namespace from the verified client
//!    certificate's SPIFFE URI SAN, else its CN. A stream is authenticated
//!    once, when it opens.
//! 2. **Scope** ([`scope`]): each update's `tenant_id` must be the
//!    identity's namespace or granted to it (`--producer-tenants-file`).
//!    A refused update is not applied at all; on a stream the following
//!    updates for entitled tenants still are, and the stream then ends with
//!    `PERMISSION_DENIED` naming the tenant and identity instead of its Ack.
//!    A refused `PublishEvent` answers `PERMISSION_DENIED` at once.
//! 3. **Limits** ([`ratelimit`]): per identity, a token bucket of blocks/s
//!    and a cap on open streams; over either, `RESOURCE_EXHAUSTED` with a
//!    `grpc-retry-pushback-ms` hint, and the refused update is not applied.
//!    The sidecar backs off for at least the hint and resyncs its whole
//!    state, so nothing is lost.
//!
//! Everything is counted per identity ([`status`]). With `none` (the
//! default, the reference's behaviour) nothing is checked and the service
//! never calls in here.
//!
//! `--consumer-auth` makes the read RPCs (lookups, state, event stream)
//! require a token too (audience `inferencecache.io/consumer`); the check
//! is a cache hit after the first call, so the lookup path stays fast.

pub mod identity;
pub mod ratelimit;
pub mod scope;
pub mod status;

use crate::grpc_error::GrpcError;
use identity::{AuthError, Principal, TokenReviewer};
use ratelimit::Limits;
use scope::TenantGrants;
pub use status::ProducerMetrics;
use status::{AuthResultLabel, IdentityState, Rejection};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;
use tonic::Request;

/// Default audience of producer tokens.
pub const DEFAULT_PRODUCER_AUDIENCE: &str = "inferencecache.io/producer";
/// Default audience of consumer tokens (`--consumer-auth`).
pub const DEFAULT_CONSUMER_AUDIENCE: &str = "inferencecache.io/consumer";
pub use inferencecache_proto::{RETRY_PUSHBACK_KEY, retry_pushback};

/// How producers authenticate.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProducerAuth {
    /// No check: anyone who reaches the gRPC port may write any tenant.
    #[default]
    None,
    /// Projected service-account token, reviewed with TokenReview.
    Token,
    /// Verified client certificate (needs `--tls-client-ca-file`).
    Mtls,
}

impl ProducerAuth {
    /// Parses `none`, `token` or `mtls`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "none" => Ok(Self::None),
            "token" => Ok(Self::Token),
            "mtls" => Ok(Self::Mtls),
            other => Err(format!(
                "--producer-auth {other:?}: use none, token or mtls"
            )),
        }
    }
}

/// Producer and consumer authorization settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerConfig {
    /// `--producer-auth`.
    pub auth: ProducerAuth,
    /// `--producer-audience`.
    pub audience: String,
    /// `--producer-tenants-file`: identity → extra tenants.
    pub tenants_file: Option<PathBuf>,
    /// `--producer-max-blocks-per-second`, `--producer-burst-blocks`,
    /// `--producer-max-streams`.
    pub limits: Limits,
    /// `--consumer-auth`.
    pub consumer_auth: bool,
    /// `--consumer-audience`.
    pub consumer_audience: String,
    /// How long a TokenReview is trusted ([`identity::REVIEW_TTL`]; tests
    /// shorten it).
    pub review_ttl: std::time::Duration,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            auth: ProducerAuth::None,
            audience: DEFAULT_PRODUCER_AUDIENCE.to_owned(),
            tenants_file: None,
            limits: Limits::default(),
            consumer_auth: false,
            consumer_audience: DEFAULT_CONSUMER_AUDIENCE.to_owned(),
            review_ttl: identity::REVIEW_TTL,
        }
    }
}

impl ProducerConfig {
    /// True when nothing is checked (the service then skips the gate).
    pub fn is_open(&self) -> bool {
        self.auth == ProducerAuth::None && !self.consumer_auth
    }

    /// True when a Kubernetes client is needed (TokenReview).
    pub fn needs_kube(&self) -> bool {
        self.auth == ProducerAuth::Token || self.consumer_auth
    }

    /// Refuses `mtls` without a client CA to verify certificates against.
    pub fn validate(
        &self,
        tls: Option<&crate::listen::TlsFiles>,
    ) -> Result<(), crate::ConfigError> {
        if self.auth == ProducerAuth::Mtls && tls.and_then(|t| t.client_ca.as_ref()).is_none() {
            return Err(crate::ConfigError::ProducerMtlsWithoutClientCa);
        }
        Ok(())
    }

    /// The startup warning for an unauthenticated producer path on a
    /// listener other hosts can reach, if any.
    pub fn exposure_warning(&self, grpc: &crate::listen::ListenAddr) -> Option<String> {
        (self.auth == ProducerAuth::None && !grpc.is_loopback()).then(|| {
            format!(
                "--producer-auth none with gRPC on {grpc}: any client that reaches it can write \
                 any tenant's routing state; use --producer-auth token or mtls (docs/security.md)"
            )
        })
    }
}

/// An authenticated producer.
#[derive(Debug, Clone)]
pub struct Caller {
    /// Who it is.
    pub principal: Principal,
    state: Arc<IdentityState>,
}

/// Holds one of an identity's open-stream slots.
#[derive(Debug)]
pub struct StreamSlot {
    state: Arc<IdentityState>,
    metrics: Arc<ProducerMetrics>,
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.state.streams.fetch_sub(1, Ordering::Relaxed);
        self.metrics.streams_changed(&self.state);
    }
}

/// The checks the service calls (only when [`ProducerConfig::is_open`] is
/// false).
#[derive(Debug)]
pub struct Gate {
    mode: ProducerAuth,
    reviewer: Option<TokenReviewer>,
    consumer: Option<TokenReviewer>,
    grants: TenantGrants,
    limits: Limits,
    metrics: Arc<ProducerMetrics>,
}

fn count(
    family: &prometheus_client::metrics::family::Family<
        AuthResultLabel,
        prometheus_client::metrics::counter::Counter,
    >,
    result: &str,
) {
    family
        .get_or_create(&AuthResultLabel {
            result: result.to_owned(),
        })
        .inc();
}

fn auth_status(e: AuthError) -> GrpcError {
    match e {
        AuthError::Unauthenticated(m) => GrpcError::Unauthenticated(m),
        AuthError::Unavailable(m) => GrpcError::AuthUnavailable(m),
    }
}

fn auth_label(r: &Result<Principal, AuthError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(AuthError::Unauthenticated(_)) => "unauthenticated",
        Err(AuthError::Unavailable(_)) => "unavailable",
    }
}

impl Gate {
    /// Builds the gate; `client` is required when the config
    /// [`needs_kube`](ProducerConfig::needs_kube).
    pub fn new(
        config: &ProducerConfig,
        client: Option<kube::Client>,
        metrics: Arc<ProducerMetrics>,
    ) -> Result<Self, String> {
        let grants = match &config.tenants_file {
            Some(p) => TenantGrants::load(p)?,
            None => TenantGrants::default(),
        };
        let review = |audience: &str| {
            client
                .clone()
                .map(|c| TokenReviewer::new(c, audience, config.review_ttl))
                .ok_or_else(|| "TokenReview needs a Kubernetes client".to_owned())
        };
        let reviewer = match config.auth {
            ProducerAuth::Token => Some(review(&config.audience)?),
            _ => None,
        };
        let consumer = if config.consumer_auth {
            Some(review(&config.consumer_audience)?)
        } else {
            None
        };
        Ok(Self {
            mode: config.auth,
            reviewer,
            consumer,
            grants,
            limits: config.limits,
            metrics,
        })
    }

    /// The producer behind `request`; `None` when producer auth is off.
    pub async fn producer<T>(&self, request: &Request<T>) -> Result<Option<Caller>, GrpcError> {
        let reviewed = match self.mode {
            ProducerAuth::None => return Ok(None),
            ProducerAuth::Token => {
                let header = request
                    .metadata()
                    .get("authorization")
                    .and_then(|v| v.to_str().ok());
                match &self.reviewer {
                    Some(r) => r.review(header).await,
                    None => Err(AuthError::Unavailable("no token reviewer".into())),
                }
            }
            ProducerAuth::Mtls => match request.peer_certs() {
                Some(certs) if !certs.is_empty() => {
                    identity::principal_of_certificate(certs[0].as_ref())
                }
                _ => Err(AuthError::Unauthenticated(
                    "no verified client certificate (mTLS)".into(),
                )),
            },
        };
        count(&self.metrics.auth, auth_label(&reviewed));
        let principal = reviewed.map_err(auth_status)?;
        let state = self
            .metrics
            .identity(&principal.identity, &principal.subject, &self.limits);
        Ok(Some(Caller { principal, state }))
    }

    /// Takes one of the caller's open-stream slots.
    pub fn open_stream(&self, caller: &Caller) -> Result<StreamSlot, GrpcError> {
        let s = &caller.state;
        let open = s.streams.fetch_add(1, Ordering::Relaxed) + 1;
        let slot = StreamSlot {
            state: Arc::clone(s),
            metrics: Arc::clone(&self.metrics),
        };
        self.metrics.streams_changed(s);
        let max = self.limits.max_streams;
        if max > 0 && open > max {
            drop(slot);
            self.metrics.rejected(s, Rejection::TooManyStreams);
            return Err(GrpcError::TooManyStreams {
                identity: caller.principal.identity.clone(),
                max,
            });
        }
        Ok(slot)
    }

    /// Admits one update of `blocks` blocks for `tenant`: scope first, then
    /// the rate. On `Err` nothing of it may be applied.
    pub fn admit(&self, caller: &Caller, tenant: &str, blocks: u64) -> Result<(), GrpcError> {
        let s = &caller.state;
        let p = &caller.principal;
        if !self.grants.entitled(p, tenant) {
            self.metrics.rejected(s, Rejection::PermissionDenied);
            return Err(GrpcError::TenantDenied {
                identity: p.identity.clone(),
                subject: p.subject.clone(),
                tenant: tenant.to_owned(),
            });
        }
        let taken = match s.bucket.lock() {
            Ok(mut b) => b.take(blocks, &self.limits, Instant::now()),
            Err(p) => p.into_inner().take(blocks, &self.limits, Instant::now()),
        };
        if let Err(wait) = taken {
            self.metrics.rejected(s, Rejection::RateLimited);
            return Err(GrpcError::RateLimited {
                identity: p.identity.clone(),
                blocks_per_second: self.limits.blocks_per_second,
                burst_blocks: self.limits.burst_blocks,
                blocks,
                retry: wait,
            });
        }
        self.metrics.admitted(s, &p.subject, blocks);
        Ok(())
    }

    /// With `--consumer-auth`, checks a read RPC's token (cached).
    pub async fn consumer<T>(&self, request: &Request<T>) -> Result<(), GrpcError> {
        let Some(reviewer) = &self.consumer else {
            return Ok(());
        };
        let header = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let reviewed = reviewer.review(header).await;
        count(&self.metrics.consumer_auth, auth_label(&reviewed));
        reviewed.map(|_| ()).map_err(auth_status)
    }
}

/// What a report stream does with one update's check: `Ok(true)` goes on,
/// `Ok(false)` skips the update and keeps the first PERMISSION_DENIED for the
/// stream's end (the stream stays usable for the entitled tenants), `Err`
/// ends the stream now (bad input, rate limit).
pub(crate) fn admit_update(
    check: Result<(), GrpcError>,
    denied: &mut Option<GrpcError>,
) -> Result<bool, GrpcError> {
    match check {
        Ok(()) => Ok(true),
        Err(s @ GrpcError::TenantDenied { .. }) => {
            denied.get_or_insert(s);
            Ok(false)
        }
        Err(s) => Err(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse() {
        assert_eq!(ProducerAuth::parse("none"), Ok(ProducerAuth::None));
        assert_eq!(ProducerAuth::parse(" TOKEN "), Ok(ProducerAuth::Token));
        assert_eq!(ProducerAuth::parse("mtls"), Ok(ProducerAuth::Mtls));
        assert!(ProducerAuth::parse("jwt").is_err());
    }

    #[test]
    fn warning_only_for_open_non_loopback() {
        let c = ProducerConfig::default();
        let lo = crate::listen::ListenAddr::parse("--g", "127.0.0.1:9090")
            .unwrap_or_else(|_| unreachable!());
        let all =
            crate::listen::ListenAddr::parse("--g", ":9090").unwrap_or_else(|_| unreachable!());
        assert!(c.exposure_warning(&lo).is_none());
        assert!(
            c.exposure_warning(&all)
                .is_some_and(|w| w.contains("--producer-auth"))
        );
        let t = ProducerConfig {
            auth: ProducerAuth::Token,
            ..ProducerConfig::default()
        };
        assert!(t.exposure_warning(&all).is_none());
    }

    #[test]
    fn pushback_round_trips() {
        let s = tonic::Status::from(GrpcError::RateLimited {
            identity: "x".into(),
            blocks_per_second: 1,
            burst_blocks: 1,
            blocks: 2,
            retry: std::time::Duration::from_millis(250),
        });
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            retry_pushback(&s),
            Some(std::time::Duration::from_millis(250))
        );
        assert_eq!(retry_pushback(&tonic::Status::unavailable("x")), None);
    }
}

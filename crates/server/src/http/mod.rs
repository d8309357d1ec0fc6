//! HTTP listeners: the public one (`/healthz`, `/readyz`, `/metrics`) and the
//! control one (`/snapshot`, `/policy`, `/probe`, `/templates`,
//! `/pd-topologies`). Routes are exact paths; each listener answers 404 for
//! the other's endpoints.
//!
//! Inside: `error` (`HttpError`, the one table of HTTP refusals), `serve`
//! (HTTP/1 with header and body read timeouts), `exposition` (`/metrics`
//! content negotiation) and `ui` (the status page on the control listener).

pub(crate) mod error;
pub(crate) mod exposition;
pub(crate) mod serve;
pub(crate) mod ui;

use crate::auth::{AuthOutcome, Authenticator};
use crate::config::ControlAuth;
use crate::core::Core;
use crate::http::error::HttpError;
use crate::http::exposition::{OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, wants_openmetrics};
use crate::http::serve::{BodyError, read_body};
use crate::policy::{MAX_POLICY_BODY_BYTES, decode_policy_json, decode_policy_json_lenient};
use crate::probe::{MAX_PROBE_BODY_BYTES, Prober, parse_probe_request};
use crate::snapshot::{snapshot_json, with_stores};
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// State shared by the HTTP handlers.
#[derive(Debug, Clone)]
pub(crate) struct HttpState {
    /// Index, policies and metrics.
    pub core: Core,
    /// True once the index is started; false again on shutdown.
    pub ready: Arc<AtomicBool>,
    /// How the control endpoints authenticate.
    pub control_auth: ControlAuth,
    /// Runs `/probe` self-tests.
    pub prober: Prober,
    /// TokenReview authenticators (present in TokenReview mode).
    pub auth: Option<Arc<ControlAuthenticators>>,
    /// Time a handler waits for a complete request body (`--http-body-timeout`).
    pub body_timeout: std::time::Duration,
    /// The status page's feed metrics.
    pub ui: Arc<crate::http::ui::UiMetrics>,
    /// The bus relay, in bus mode (the status page shows the bus).
    pub relay: Option<crate::replicate::BusRelay>,
    /// Producer identities and their counters (`/snapshot` lists them).
    pub producers: Arc<crate::producer::ProducerMetrics>,
}

/// One authenticator per control endpoint (own cache, own counter).
#[derive(Debug)]
pub(crate) struct ControlAuthenticators {
    /// `/snapshot` (controller audience).
    pub snapshot: Authenticator,
    /// `/policy` (policy audience).
    pub policy: Authenticator,
    /// `/probe` (controller audience).
    pub probe: Authenticator,
    /// `/templates` (policy audience, like every operator push).
    pub templates: Authenticator,
    /// `/pd-topologies` (policy audience).
    pub pd_topologies: Authenticator,
}

/// Which control endpoint a request is for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Endpoint {
    Snapshot,
    Policy,
    Probe,
    Templates,
    PdTopologies,
}

/// Router of the public listener.
pub(crate) fn public_router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", any(healthz))
        .route("/readyz", any(readyz))
        .route("/metrics", any(metrics))
        .with_state(state)
}

/// Router of the control listener.
pub(crate) fn control_router(state: HttpState) -> Router {
    Router::new()
        .route("/policy", any(policy))
        .route("/snapshot", any(snapshot))
        .route("/probe", any(probe))
        .route("/templates", any(templates))
        .route("/pd-topologies", any(pd_topologies))
        .merge(crate::http::ui::router())
        .with_state(state)
}

/// The error a body that could not be read answers with (a timeout is
/// also counted: it is how a stalled or slow-loris client shows up).
fn body_error(state: &HttpState, e: &BodyError, what: &'static str) -> HttpError {
    match e {
        BodyError::TooLarge => HttpError::BodyTooLarge { what },
        BodyError::Timeout => {
            state.core.metrics.limits.reject("http_body_timeout");
            HttpError::BodyTimeout {
                what,
                timeout: state.body_timeout,
            }
        }
    }
}

/// Refuses any method but those in `allowed` (`allow` is their header form).
pub(crate) fn allow_methods(
    method: &Method,
    allowed: &[Method],
    allow: &'static str,
) -> Result<(), HttpError> {
    if allowed.contains(method) {
        Ok(())
    } else {
        Err(HttpError::MethodNotAllowed { allow })
    }
}

/// The gate of the read-only endpoints under `/snapshot`'s audience
/// (`/snapshot`, `/ui/state`, `/ui/events`): GET only, then TokenReview.
pub(crate) async fn snapshot_read_gate(
    state: &HttpState,
    method: &Method,
    headers: &HeaderMap,
) -> Result<(), HttpError> {
    allow_methods(method, &[Method::GET], "GET")?;
    auth_gate(state, Endpoint::Snapshot, headers).await
}

/// In TokenReview mode, the request's bearer token must belong to the
/// controller's service account.
pub(crate) async fn auth_gate(
    state: &HttpState,
    endpoint: Endpoint,
    headers: &HeaderMap,
) -> Result<(), HttpError> {
    if !matches!(state.control_auth, ControlAuth::TokenReview { .. }) {
        return Ok(());
    }
    let Some(auth) = &state.auth else {
        // TokenReview configured but no client: fail closed.
        return Err(HttpError::AuthUnavailable);
    };
    let authenticator = match endpoint {
        Endpoint::Snapshot => &auth.snapshot,
        Endpoint::Policy => &auth.policy,
        Endpoint::Probe => &auth.probe,
        Endpoint::Templates => &auth.templates,
        Endpoint::PdTopologies => &auth.pd_topologies,
    };
    let header = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match authenticator.check(header).await {
        AuthOutcome::Ok => Ok(()),
        AuthOutcome::Unauthorized => Err(HttpError::Unauthorized),
        AuthOutcome::Forbidden => Err(HttpError::Forbidden),
        AuthOutcome::Unavailable => Err(HttpError::AuthUnavailable),
    }
}

async fn policy(
    State(state): State<HttpState>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    allow_methods(&method, &[Method::POST, Method::PUT], "POST, PUT")?;
    auth_gate(&state, Endpoint::Policy, &headers).await?;
    let bytes = match read_body(body, MAX_POLICY_BODY_BYTES, state.body_timeout).await {
        Ok(b) => b,
        Err(e) => {
            state.core.metrics.policy_rejected("http");
            return Err(body_error(&state, &e, "decode policy snapshot"));
        }
    };
    let decoded = if state.core.limits.lenient_policy_validation {
        decode_policy_json_lenient(&bytes)
    } else {
        decode_policy_json(&bytes)
    };
    match decoded {
        Ok(set) => {
            state.core.metrics.policy_applied("http", set.version);
            state.core.policies.replace(set);
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Err(e) => {
            state.core.metrics.policy_rejected("http");
            Err(HttpError::BadRequest(e.to_string()))
        }
    }
}

/// One replace-on-write push of a named store (`/templates`,
/// `/pd-topologies`): the same methods, auth, body limit and body timeout
/// as `/policy`. `decode` refuses the whole body or returns the new set;
/// `apply` puts it in force.
async fn push<T>(
    state: &HttpState,
    endpoint: Endpoint,
    what: &'static str,
    request: (Method, HeaderMap, Body),
    decode: fn(&[u8]) -> Result<crate::named::NamedSet<T>, String>,
    apply: impl FnOnce(crate::named::NamedSet<T>),
    rejected: impl FnOnce(),
) -> Result<Response, HttpError> {
    let (method, headers, body) = request;
    allow_methods(&method, &[Method::POST, Method::PUT], "POST, PUT")?;
    auth_gate(state, endpoint, &headers).await?;
    let bytes = match read_body(body, MAX_POLICY_BODY_BYTES, state.body_timeout).await {
        Ok(b) => b,
        Err(e) => {
            rejected();
            return Err(body_error(state, &e, what));
        }
    };
    match decode(&bytes) {
        Ok(set) => {
            apply(set);
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Err(e) => {
            rejected();
            Err(HttpError::BadRequest(e))
        }
    }
}

async fn templates(
    State(state): State<HttpState>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    let core = &state.core;
    push(
        &state,
        Endpoint::Templates,
        "decode templates",
        (method, headers, body),
        crate::templates::decode_templates_json,
        |set| {
            tracing::info!(objects = set.len(), "templates_pushed");
            core.metrics.stores.templates_applied("http", set.len());
            core.templates.replace(set);
        },
        || core.metrics.stores.templates_rejected("http"),
    )
    .await
}

async fn pd_topologies(
    State(state): State<HttpState>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    let core = &state.core;
    push(
        &state,
        Endpoint::PdTopologies,
        "decode pd topologies",
        (method, headers, body),
        crate::pd::decode_pd_topologies_json,
        |set| {
            tracing::info!(objects = set.len(), "pd_topologies_pushed");
            core.metrics.stores.pd_topologies_applied("http", set.len());
            core.pd_topologies.replace(set);
        },
        || core.metrics.stores.pd_topologies_rejected("http"),
    )
    .await
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<HttpState>) -> Response {
    if let Some(reason) = state.core.readiness.reason() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}\n"),
        )
            .into_response();
    }
    if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ok\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

async fn metrics(State(state): State<HttpState>, headers: HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if wants_openmetrics(accept) {
        (
            [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
            state.core.metrics.encode_openmetrics(),
        )
    } else {
        (
            [(header::CONTENT_TYPE, TEXT_CONTENT_TYPE)],
            state.core.metrics.encode_text(),
        )
    }
}

async fn snapshot(
    State(state): State<HttpState>,
    method: Method,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    snapshot_read_gate(&state, &method, &headers).await?;
    let core = state.core.clone();
    let producers = Arc::clone(&state.producers);
    let built = tokio::task::spawn_blocking(move || {
        let snap = core.index.snapshot();
        let mut body = with_stores(
            snapshot_json(&snap),
            &core.templates.current(),
            &core.pd_topologies.current(),
        );
        body.producers = producers.snapshot();
        serde_json::to_vec(&body)
    })
    .await;
    match built {
        Ok(Ok(mut body)) => {
            body.push(b'\n');
            Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
        }
        Ok(Err(e)) => Err(HttpError::Internal(format!("encode snapshot: {e}"))),
        Err(e) => Err(HttpError::Internal(format!("snapshot task: {e}"))),
    }
}

async fn probe(
    State(state): State<HttpState>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    allow_methods(&method, &[Method::POST], "POST")?;
    auth_gate(&state, Endpoint::Probe, &headers).await?;
    let bytes = read_body(body, MAX_PROBE_BODY_BYTES, state.body_timeout)
        .await
        .map_err(|e| body_error(&state, &e, "decode probe request"))?;
    let req = parse_probe_request(&bytes).map_err(|e| HttpError::BadRequest(e.to_string()))?;
    let index = std::sync::Arc::clone(&state.core.index);
    let prober = state.prober.clone();
    match tokio::task::spawn_blocking(move || prober.run(&index, &req)).await {
        Ok(resp) => Ok(axum::Json(resp).into_response()),
        Err(e) => Err(HttpError::Internal(format!("probe task: {e}"))),
    }
}

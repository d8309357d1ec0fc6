//! HTTP listeners: the public one (`/healthz`, `/readyz`, `/metrics`) and the
//! control one (`/snapshot`, `/policy`, `/probe`). Routes are exact paths; each
//! listener answers 404 for the other's endpoints.

use crate::exposition::{OPENMETRICS_CONTENT_TYPE, TEXT_CONTENT_TYPE, wants_openmetrics};
use crate::metrics::Metrics;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::any;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// State shared by the HTTP handlers.
#[derive(Debug, Clone)]
pub struct HttpState {
    /// Metrics to expose.
    pub metrics: Arc<Metrics>,
    /// True once the index is started; false again on shutdown.
    pub ready: Arc<AtomicBool>,
}

/// Router of the public listener.
pub fn public_router(state: HttpState) -> Router {
    Router::new()
        .route("/healthz", any(healthz))
        .route("/readyz", any(readyz))
        .route("/metrics", any(metrics))
        .with_state(state)
}

/// Router of the control listener. Its endpoints arrive with the policy
/// server; until then every path is 404.
pub fn control_router(_state: HttpState) -> Router {
    Router::new()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(state): State<HttpState>, headers: HeaderMap) -> impl IntoResponse {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    if wants_openmetrics(accept) {
        (
            [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
            state.metrics.encode_openmetrics(),
        )
    } else {
        (
            [(header::CONTENT_TYPE, TEXT_CONTENT_TYPE)],
            state.metrics.encode_text(),
        )
    }
}

//! The live status page on the control listener: `/ui` (one self-contained
//! HTML page embedded in the binary: no build step, no CDN, works offline),
//! `/ui/state` (the JSON it polls) and `/ui/events` (its live feed of index
//! changes over Server-Sent Events).
//!
//! `/ui/state` and `/ui/events` carry the same data as `/snapshot` and pass
//! the same gate (the controller audience in TokenReview mode). The page
//! shell itself holds no data and is served ungated so a browser can open it
//! at all (a browser cannot attach a bearer header to a navigation); the
//! page reads a token from the URL fragment (`/ui#token=...`, never sent to
//! the server) and sends it as `Authorization: Bearer` on its requests.

mod bus;
mod feed;
mod metrics;
mod state;

pub(crate) use metrics::UiMetrics;

use crate::http::error::HttpError;
use crate::http::{HttpState, allow_methods, snapshot_read_gate};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, header};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The page, embedded at build time.
pub(crate) const PAGE: &str = include_str!("page.html");

/// Nothing but the page's own inline code and same-origin requests: the
/// page must work inside a cluster without internet access, and must not
/// be able to load anything else.
const PAGE_CSP: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; connect-src 'self'; img-src data:; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The status page's routes, merged into the control router.
pub(crate) fn router() -> Router<HttpState> {
    Router::new()
        .route("/ui", any(page))
        .route("/ui/", any(page))
        .route("/ui/state", any(ui_state))
        .route("/ui/events", any(events))
}

async fn page(method: Method) -> Result<Response, HttpError> {
    allow_methods(&method, &[Method::GET, Method::HEAD], "GET")?;
    let mut r = PAGE.into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(PAGE_CSP),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    Ok(r)
}

async fn ui_state(
    State(state): State<HttpState>,
    method: Method,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    snapshot_read_gate(&state, &method, &headers).await?;
    let ready = state.ready.load(Ordering::Acquire);
    let built = tokio::task::spawn_blocking(move || {
        let doc = state::build(&state.core, &state.ui, state.relay.as_ref(), ready);
        serde_json::to_vec(&doc)
    })
    .await;
    match built {
        Ok(Ok(body)) => Ok((
            [
                (header::CONTENT_TYPE, "application/json"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            body,
        )
            .into_response()),
        Ok(Err(e)) => Err(HttpError::Internal(format!("encode ui state: {e}"))),
        Err(e) => Err(HttpError::Internal(format!("ui state task: {e}"))),
    }
}

async fn events(
    State(state): State<HttpState>,
    method: Method,
    headers: HeaderMap,
) -> Result<Response, HttpError> {
    snapshot_read_gate(&state, &method, &headers).await?;
    if !state.ready.load(Ordering::Acquire) {
        return Err(HttpError::NotReady);
    }
    let stream = feed::open(
        &state.core.events,
        Arc::clone(&state.ui),
        Arc::clone(&state.ready),
    );
    let mut r = Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

//! The sidecar's own HTTP endpoints: `/metrics`, `/healthz`, `/readyz`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::metrics::SidecarMetrics;
use crate::transport::TransportStatus;

/// What the handlers read.
#[derive(Clone)]
pub struct HttpState {
    /// Metrics and the server-reachable flag.
    pub metrics: Arc<SidecarMetrics>,
    /// Each rank's transport status.
    pub transports: Arc<Vec<(u32, Arc<TransportStatus>)>>,
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The router.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    s.metrics.sync_transports(&s.transports);
    ([(header::CONTENT_TYPE, OPENMETRICS)], s.metrics.encode())
}

/// Ready when every rank's engine stream is connected and the server is
/// reachable (stream up and resynced); the body says which is missing.
async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    let down: Vec<u32> = s
        .transports
        .iter()
        .filter(|(_, t)| !t.connected.load(Ordering::Relaxed))
        .map(|(r, _)| *r)
        .collect();
    let server = s.metrics.server_up();
    let metrics_down = s.metrics.engine_metrics_down();
    if down.is_empty() && server && !metrics_down {
        (StatusCode::OK, "ready\n".to_owned())
    } else {
        let mut why = String::from("not ready:");
        if !down.is_empty() {
            why.push_str(&format!(" engine stream down for rank(s) {down:?};"));
        }
        if !server {
            why.push_str(" server unreachable;");
        }
        if metrics_down {
            why.push_str(" engine metrics unreachable (hung or dead engine; blocks withdrawn);");
        }
        why.push('\n');
        (StatusCode::SERVICE_UNAVAILABLE, why)
    }
}

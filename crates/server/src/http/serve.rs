//! Serving the HTTP routers with read timeouts (axum's `serve` sets none).
//!
//! - **Header timeout** (`--http-header-timeout`, default 5 s, the
//!   reference's `ReadHeaderTimeout`): hyper closes a connection whose next
//!   request head is not complete in time, which also reaps idle keep-alive
//!   connections and slow-header (slowloris) clients.
//! - **Body timeout** (`--http-body-timeout`, default 10 s): handlers that
//!   read a body do it through [`read_body`], which answers
//!   `408 Request Timeout` when the body is not complete in time (a client
//!   that declares a 1 GB body and stalls is cut, not waited on forever).

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Why a body could not be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BodyError {
    /// Longer than the endpoint's limit.
    TooLarge,
    /// Not complete within the body timeout.
    Timeout,
}

/// Reads a whole body of at most `limit` bytes within `timeout`.
pub(crate) async fn read_body(
    body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, BodyError> {
    match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => Err(BodyError::TooLarge),
        Err(_) => Err(BodyError::Timeout),
    }
}

/// Serves `router` on `listener` (HTTP/1.1) until `stop`, then lets open
/// connections finish their current request.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    header_timeout: Duration,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            a = listener.accept() => a,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                // Out of file descriptors and the like: back off, keep serving.
                tracing::debug!(error = %e, "http_accept_failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let service = TowerToHyperService::new(router.clone());
        let conn = graceful.watch(builder.serve_connection(TokioIo::new(tcp), service));
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "http_connection_error");
            }
        });
    }
    graceful.shutdown().await;
    Ok(())
}

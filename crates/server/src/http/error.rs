//! The one error type of the HTTP endpoints, and the one table that maps
//! each failure to its status and body.
//!
//! Bodies are shaped like Go's `http.Error` (`text/plain`, the message and a
//! newline, `nosniff`), which the reference's controller and existing
//! tooling parse. Handlers return `Result<Response, HttpError>`; nothing
//! else in the server writes an error status.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::time::Duration;

/// Why an HTTP request was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    /// The endpoint does not answer this method; `allow` lists those it does.
    #[error("method not allowed")]
    MethodNotAllowed {
        /// The `Allow` header.
        allow: &'static str,
    },
    /// TokenReview mode and no valid bearer token.
    #[error("unauthorized")]
    Unauthorized,
    /// A valid token of the wrong service account.
    #[error("forbidden")]
    Forbidden,
    /// TokenReview mode and the apiserver cannot be asked (fails closed).
    #[error("token review unavailable")]
    AuthUnavailable,
    /// The body is larger than the endpoint's limit (the reference's 400).
    #[error("{what}: http: request body too large")]
    BodyTooLarge {
        /// What the handler was decoding.
        what: &'static str,
    },
    /// The body did not arrive within `--http-body-timeout`.
    #[error("{what}: request body not received within {timeout:?} (--http-body-timeout)")]
    BodyTimeout {
        /// What the handler was decoding.
        what: &'static str,
        /// The timeout in force.
        timeout: Duration,
    },
    /// The body does not decode or validate; the message says where.
    #[error("{0}")]
    BadRequest(String),
    /// The server is not (or no longer) serving.
    #[error("not ready")]
    NotReady,
    /// A worker task failed or an encoder refused (a bug, not the client's).
    #[error("{0}")]
    Internal(String),
}

impl HttpError {
    /// The status each failure answers with.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden => StatusCode::FORBIDDEN,
            Self::AuthUnavailable | Self::NotReady => StatusCode::SERVICE_UNAVAILABLE,
            Self::BodyTooLarge { .. } | Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut r = (self.status(), format!("{self}\n")).into_response();
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        h.insert(
            "x-content-type-options",
            HeaderValue::from_static("nosniff"),
        );
        if let Self::MethodNotAllowed { allow } = self {
            h.insert(header::ALLOW, HeaderValue::from_static(allow));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(e: HttpError) -> (StatusCode, String, Option<String>) {
        let r = e.into_response();
        let status = r.status();
        let allow = r
            .headers()
            .get(header::ALLOW)
            .map(|v| v.to_str().unwrap().to_owned());
        let bytes = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        (status, String::from_utf8(bytes.to_vec()).unwrap(), allow)
    }

    #[tokio::test]
    async fn every_failure_has_its_status_and_a_go_shaped_body() {
        let cases = [
            (
                HttpError::MethodNotAllowed { allow: "GET" },
                405,
                "method not allowed\n",
            ),
            (HttpError::Unauthorized, 401, "unauthorized\n"),
            (HttpError::Forbidden, 403, "forbidden\n"),
            (
                HttpError::AuthUnavailable,
                503,
                "token review unavailable\n",
            ),
            (
                HttpError::BodyTooLarge {
                    what: "decode policy snapshot",
                },
                400,
                "decode policy snapshot: http: request body too large\n",
            ),
            (
                HttpError::BodyTimeout {
                    what: "decode probe request",
                    timeout: Duration::from_secs(10),
                },
                408,
                "decode probe request: request body not received within 10s (--http-body-timeout)\n",
            ),
            (HttpError::BadRequest("bad json".into()), 400, "bad json\n"),
            (HttpError::NotReady, 503, "not ready\n"),
            (
                HttpError::Internal("task panicked".into()),
                500,
                "task panicked\n",
            ),
        ];
        for (e, status, text) in cases {
            let (s, b, _) = body(e).await;
            assert_eq!(s.as_u16(), status, "{text}");
            assert_eq!(b, text);
        }
        let (_, _, allow) = body(HttpError::MethodNotAllowed { allow: "POST, PUT" }).await;
        assert_eq!(allow.as_deref(), Some("POST, PUT"));
    }
}

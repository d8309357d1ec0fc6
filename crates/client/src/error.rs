//! The one error type of the SDK. `lookup_route` never returns it (it folds
//! every failure into `NoHint`); the tool-facing calls do.

use std::time::Duration;

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The endpoint string is not a usable URI.
    #[error("invalid endpoint {endpoint:?}: {reason}; use e.g. http://127.0.0.1:9090 or host:9090")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What was wrong with it.
        reason: String,
    },

    /// A TLS file could not be read or the TLS settings are unusable.
    #[error("TLS setup failed: {0}")]
    Tls(String),

    /// No tokio runtime is running: the gRPC channel needs one to drive its
    /// connection task.
    #[error("no tokio runtime: create the client from inside a tokio runtime")]
    NoRuntime,

    /// The eager connect did not reach the server.
    #[error("could not connect to {endpoint}: {cause}")]
    Connect {
        /// The endpoint dialled.
        endpoint: String,
        /// The transport error, with its causes joined.
        cause: String,
    },

    /// The call did not complete within its deadline.
    #[error("no answer within {0:?}")]
    DeadlineExceeded(Duration),

    /// The server (or the transport) answered with a gRPC status.
    #[error("{}", describe_status(.0))]
    Status(#[from] tonic::Status),
}

impl ClientError {
    /// True when the failure means the server could not be reached at all
    /// (refused, unresolvable, TLS handshake failed), as opposed to a server
    /// that answered with an error.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Connect { .. } => true,
            Self::Status(s) => s.code() == tonic::Code::Unavailable,
            _ => false,
        }
    }
}

/// A status message with its transport cause, which tonic keeps in
/// `source()` rather than the message ("transport error" alone tells an
/// operator nothing).
pub(crate) fn describe_status(status: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    let mut cause = std::error::Error::source(status);
    while let Some(c) = cause {
        let piece = c.to_string();
        if !text.contains(&piece) {
            text.push_str(": ");
            text.push_str(&piece);
        }
        cause = c.source();
    }
    text
}

/// An error with its whole `source()` chain, for transport errors whose
/// top-level message is generic.
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(c) = cause {
        let piece = c.to_string();
        if !text.contains(&piece) {
            text.push_str(": ");
            text.push_str(&piece);
        }
        cause = c.source();
    }
    text
}

//! Errors that stop the sidecar (everything else is counted, logged and
//! recovered from).

use std::path::PathBuf;

/// Why [`crate::sidecar::run`] could not start or keep running.
#[derive(Debug, thiserror::Error)]
pub enum SidecarError {
    /// A file named by a flag cannot be read.
    #[error("cannot read {what} file {path:?}: {source}")]
    File {
        /// The flag.
        what: &'static str,
        /// The path given.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `--server` is not a usable address.
    #[error("--server {server:?} is not usable: {reason}")]
    Server {
        /// The value given.
        server: String,
        /// Why.
        reason: String,
    },
    /// The engine endpoints cannot be used.
    #[error(transparent)]
    Transport(#[from] crate::transport::TransportError),
    /// `--http-bind-address` cannot be bound.
    #[error("cannot listen on --http-bind-address {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A sidecar task failed unexpectedly.
    #[error("task failed: {0}")]
    Task(String),
}

//! The simulator's error type.

use std::path::PathBuf;

/// Everything that can stop a simulation run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The trace file could not be opened or read.
    #[error("cannot read trace {path}: {source}")]
    TraceIo {
        /// The trace path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// One trace line is not a valid Mooncake request.
    #[error("{source_name}:{line}: {message}")]
    TraceLine {
        /// File name (or `<input>`).
        source_name: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// The trace holds no request (after `--limit`).
    #[error("the trace holds no request")]
    EmptyTrace,
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Config(String),
    /// The in-process server could not start.
    #[error("in-process server: {0}")]
    Server(String),
    /// The server could not be reached or refused a report.
    #[error("server {endpoint}: {message}")]
    Rpc {
        /// The gRPC endpoint.
        endpoint: String,
        /// What failed.
        message: String,
    },
    /// Writing an output file failed.
    #[error("cannot write {path}: {message}")]
    Output {
        /// The output path.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

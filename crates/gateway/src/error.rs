//! The gateway's errors: what stops it from starting. Nothing a request does
//! is an error here; requests get HTTP answers (see `http.rs`).

/// Why the gateway could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// A setting is wrong (exit 2 in the CLI).
    #[error("{0}")]
    Config(String),
    /// An engine could not be asked what it serves.
    #[error("engine {url}: {message}")]
    Discovery {
        /// The engine's URL.
        url: String,
        /// What went wrong and what to do.
        message: String,
    },
    /// A listener could not be bound.
    #[error("bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The embedded index failed.
    #[error("embedded index: {0}")]
    Index(String),
    /// A KV-event subscriber failed.
    #[error("subscriber for {engine}: {message}")]
    Subscriber {
        /// The engine's replica id.
        engine: String,
        /// What went wrong.
        message: String,
    },
    /// The HTTP server failed.
    #[error("serve: {0}")]
    Serve(String),
}

impl GatewayError {
    /// True for errors in the settings (the CLI exits 2 for these).
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::Config(_))
    }
}

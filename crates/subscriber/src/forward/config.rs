//! The forwarder's settings (the CLI's flags, validated).

use std::time::Duration;

use super::{Identity, ServerTls};

/// Forwarding settings.
#[derive(Debug, Clone)]
pub struct ForwardConfig {
    /// `--server`: `host:port` or a URI.
    pub server: String,
    /// TLS to the server, if any.
    pub tls: Option<ServerTls>,
    /// Fields every message carries.
    pub identity: Identity,
    /// `--window`: reports are batched this long.
    pub window: Duration,
    /// Distinct buffered keys that force an early flush; also the most
    /// prefixes per `CacheStateUpdate`.
    pub max_batch: usize,
    /// `PublishEvent`s in flight at most.
    pub max_in_flight: usize,
    /// Evictions queued or in flight at most before a flush waits.
    pub max_evict_backlog: usize,
    /// Timeout of every RPC (and of a stream send waiting for buffer space).
    pub rpc_timeout: Duration,
    /// First reconnect delay.
    pub backoff_initial: Duration,
    /// Longest reconnect delay.
    pub backoff_max: Duration,
    /// Messages buffered towards the report stream.
    pub stream_buffer: usize,
    /// `--nats-url`: publish to the bus instead of a server.
    pub bus: Option<super::bus::BusForward>,
    /// `--server-token-file`: bearer token for `--producer-auth token`,
    /// re-read on every reconnect.
    pub token_file: Option<std::path::PathBuf>,
    /// Set once every rank's event history is applied and acknowledged by
    /// the server (not in bus mode); a router ignores this replica's claims
    /// until then.
    pub caught_up: Option<crate::sequence::CaughtUpSignal>,
    /// A server in this process (the gateway's embedded index): reports and
    /// events go to its ingest directly, not over gRPC to `server` (which,
    /// like `tls` and `token_file`, is then unused).
    pub local: Option<std::sync::Arc<dyn super::LocalServer>>,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        Self {
            server: "127.0.0.1:9090".to_owned(),
            tls: None,
            identity: Identity::default(),
            window: Duration::from_millis(100),
            max_batch: 4096,
            // A full cache's churn at 50 K blocks/s is 50 K calls/s; with 64
            // in flight the eviction p99 of `bench visibility --mode churn`
            // was 2-4x that with 128 (more gained nothing).
            max_in_flight: 128,
            // ~1-2 s of a full cache's churn at the rates a sidecar sustains
            // (BENCHMARKS.md), a few MiB.
            max_evict_backlog: 65_536,
            rpc_timeout: Duration::from_secs(5),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            stream_buffer: 64,
            bus: None,
            token_file: None,
            caught_up: None,
            local: None,
        }
    }
}

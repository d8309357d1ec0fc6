//! Bus settings, the connection, and the stream definition.

use crate::BusError;
use crate::subject::{all_subjects, valid_prefix};
use async_nats::jetstream::{self, stream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Default stream name.
pub const DEFAULT_STREAM: &str = "INFERENCECACHE";
/// Default subject prefix.
pub const DEFAULT_SUBJECT_PREFIX: &str = "inferencecache.v1";
/// Default retention by age: twice the index's default TTL (30 min), so a
/// replica's replay never needs an update older than any live entry.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_secs(2 * 30 * 60);
/// Default retention by size.
pub const DEFAULT_MAX_BYTES: i64 = 1 << 30;

/// Where the bus is and how its stream is laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusConfig {
    /// NATS URL(s), comma-separated.
    pub url: String,
    /// JetStream stream name.
    pub stream: String,
    /// Subject prefix; subjects are `{prefix}.{tenant}.{model}`.
    pub subject_prefix: String,
    /// Retention by age.
    pub max_age: Duration,
    /// Retention by size (bytes; <= 0 = unbounded).
    pub max_bytes: i64,
    /// Client name shown by the NATS server.
    pub client_name: String,
}

impl BusConfig {
    /// Defaults for `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            stream: DEFAULT_STREAM.into(),
            subject_prefix: DEFAULT_SUBJECT_PREFIX.into(),
            max_age: DEFAULT_MAX_AGE,
            max_bytes: DEFAULT_MAX_BYTES,
            client_name: "inferencecache".into(),
        }
    }

    /// Checks names before anything connects.
    pub fn validate(&self) -> Result<(), BusError> {
        if self.url.trim().is_empty() {
            return Err(BusError::Config("--nats-url is empty".into()));
        }
        if self.stream.is_empty()
            || !self
                .stream
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
        {
            return Err(BusError::Config(format!(
                "stream name {:?} must be non-empty [A-Za-z0-9_-]",
                self.stream
            )));
        }
        if !valid_prefix(&self.subject_prefix) {
            return Err(BusError::Config(format!(
                "subject prefix {:?} must be dot-separated non-empty tokens without wildcards or spaces",
                self.subject_prefix
            )));
        }
        Ok(())
    }

    /// The control subject sidecars listen on for resync requests. Outside
    /// the stream's subjects: a request is a live signal, never replayed.
    pub fn resync_subject(&self) -> String {
        format!("{}-control.resync", self.subject_prefix.replace('.', "-"))
    }

    /// The core-NATS subject server replicas share their delivered hints on
    /// (`crate::load`). Outside the stream's subjects like the resync
    /// subject: load is a live signal, never stored or replayed.
    pub fn load_subject(&self) -> String {
        format!("{}-load.deliveries", self.subject_prefix.replace('.', "-"))
    }

    /// Object store bucket of published snapshots.
    pub fn snapshot_bucket(&self) -> String {
        format!("{}-snapshots", self.stream)
    }

    /// The stream's definition.
    pub fn stream_config(&self) -> stream::Config {
        stream::Config {
            name: self.stream.clone(),
            subjects: vec![all_subjects(&self.subject_prefix)],
            max_age: self.max_age,
            max_bytes: if self.max_bytes > 0 {
                self.max_bytes
            } else {
                -1
            },
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::Old,
            // Producers retry with the same message id after a lost ack.
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        }
    }
}

/// A connection to NATS that keeps reconnecting in the background, with its
/// up/down state.
#[derive(Debug, Clone)]
pub struct Bus {
    /// Settings.
    pub config: BusConfig,
    /// Core NATS client.
    pub client: async_nats::Client,
    /// JetStream context.
    pub js: jetstream::Context,
    connected: Arc<AtomicBool>,
}

impl Bus {
    /// Connects without waiting: an unreachable server is retried forever in
    /// the background (the caller serves meanwhile; fail-open).
    pub async fn connect(config: BusConfig) -> Result<Bus, BusError> {
        config.validate()?;
        let connected = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&connected);
        let url = config.url.clone();
        let client = async_nats::ConnectOptions::new()
            .name(config.client_name.clone())
            .retry_on_initial_connect()
            .connection_timeout(Duration::from_secs(2))
            .max_reconnects(None)
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis((100u64 << attempts.min(4)).min(2_000))
            })
            .event_callback(move |ev| {
                let flag = Arc::clone(&flag);
                let url = url.clone();
                async move {
                    match ev {
                        async_nats::Event::Connected => {
                            flag.store(true, Ordering::SeqCst);
                            tracing::info!(url = %url, "bus_connected");
                        }
                        async_nats::Event::Disconnected => {
                            flag.store(false, Ordering::SeqCst);
                            tracing::warn!(url = %url, "bus_disconnected");
                        }
                        other => tracing::debug!(event = %other, "bus_event"),
                    }
                }
            })
            .connect(config.url.as_str())
            .await
            .map_err(|e| BusError::Connect(e.to_string()))?;
        let js = jetstream::ContextBuilder::new()
            .timeout(Duration::from_secs(5))
            .ack_timeout(Duration::from_secs(5))
            .build(client.clone());
        Ok(Bus {
            config,
            client,
            js,
            connected,
        })
    }

    /// Whether the connection is up now.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
            || self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Waits until connected (polls; the event callback is the fast path).
    pub async fn wait_connected(&self) {
        while !self.is_connected() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Creates the stream if missing (every producer and consumer calls it;
    /// the first one wins, later ones find it) and returns it.
    pub async fn stream(&self) -> Result<stream::Stream, BusError> {
        self.js
            .get_or_create_stream(self.config.stream_config())
            .await
            .map_err(|e| BusError::Stream(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_subjects_are_outside_the_stream() {
        let c = BusConfig::new("nats://x");
        let stream = all_subjects(&c.subject_prefix);
        let inside = stream.trim_end_matches('>');
        for s in [c.resync_subject(), c.load_subject()] {
            assert!(!s.starts_with(inside), "{s} would be stored in {stream}");
        }
        assert_ne!(c.resync_subject(), c.load_subject());
    }
}

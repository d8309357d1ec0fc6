//! Flags of the bus (`--nats-*`, for `serve` and `subscribe`) and of warm
//! restarts (`--state-dir`, `--snapshot-interval`, for `serve`).

use crate::args::parse_duration;
use clap::Args;
use inferencecache_bus::{BusConfig, ProducerLimits, config as bus_config};
use std::path::PathBuf;
use std::time::Duration;

/// `--nats-*` flags.
#[derive(Debug, Clone, Args)]
pub(crate) struct BusArgs {
    /// NATS URL of the replication bus (JetStream). Empty: no bus. With it,
    /// `serve` applies the stream (and relays gRPC reports to it) and
    /// `subscribe` publishes to it directly.
    #[arg(long, env = "INFERENCECACHE_NATS_URL", default_value = "")]
    pub nats_url: String,

    /// JetStream stream name.
    #[arg(long, env = "INFERENCECACHE_NATS_STREAM", default_value = bus_config::DEFAULT_STREAM)]
    pub nats_stream: String,

    /// Subject prefix: subjects are PREFIX.TENANT.MODEL (names escaped).
    #[arg(long, env = "INFERENCECACHE_NATS_SUBJECT_PREFIX", default_value = bus_config::DEFAULT_SUBJECT_PREFIX)]
    pub nats_subject_prefix: String,

    /// Stream retention by age (default: twice --index-ttl for serve, 1h for subscribe).
    #[arg(long, env = "INFERENCECACHE_NATS_MAX_AGE", value_parser = parse_duration)]
    pub nats_max_age: Option<Duration>,

    /// Stream retention by size in bytes (<= 0: unbounded).
    #[arg(long, env = "INFERENCECACHE_NATS_MAX_BYTES", default_value_t = bus_config::DEFAULT_MAX_BYTES, allow_negative_numbers = true)]
    pub nats_max_bytes: i64,

    /// Messages buffered while the bus is unreachable (more are dropped,
    /// counted, and followed by a full resync).
    #[arg(long, env = "INFERENCECACHE_NATS_BUFFER", default_value_t = 65_536)]
    pub nats_buffer: usize,

    /// Publishes awaiting their JetStream ack at most.
    #[arg(long, env = "INFERENCECACHE_NATS_MAX_IN_FLIGHT", default_value_t = 256)]
    pub nats_max_in_flight: usize,

    /// Name this process uses on the bus (NATS client name; `serve` also
    /// publishes its snapshots under it). Default: the hostname.
    #[arg(long, env = "INFERENCECACHE_NATS_NAME", default_value = "")]
    pub nats_name: String,
}

impl BusArgs {
    /// `None` without `--nats-url`; an error names a bad stream or prefix.
    pub(crate) fn config(
        &self,
        default_max_age: Duration,
    ) -> Result<Option<(BusConfig, ProducerLimits)>, String> {
        if self.nats_url.trim().is_empty() {
            return Ok(None);
        }
        let mut c = BusConfig::new(self.nats_url.trim());
        c.stream = self.nats_stream.clone();
        c.subject_prefix = self.nats_subject_prefix.clone();
        c.max_age = self.nats_max_age.unwrap_or(default_max_age);
        c.max_bytes = self.nats_max_bytes;
        c.client_name = self.name();
        c.validate().map_err(|e| e.to_string())?;
        let limits = ProducerLimits {
            buffer: self.nats_buffer.max(1),
            max_in_flight: self.nats_max_in_flight.max(1),
            ..ProducerLimits::default()
        };
        Ok(Some((c, limits)))
    }

    /// `--nats-name`, or the hostname, or the process id.
    pub(crate) fn name(&self) -> String {
        if !self.nats_name.is_empty() {
            return self.nats_name.clone();
        }
        std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .map_or_else(
                || format!("pid-{}", std::process::id()),
                |h| format!("{h}-{}", std::process::id()),
            )
    }
}

/// `--state-dir` flags.
#[derive(Debug, Clone, Args)]
pub(crate) struct StateArgs {
    /// Directory for the index snapshot (warm restarts). Empty: none.
    #[arg(long, env = "INFERENCECACHE_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// How often the snapshot is written (it is also written at shutdown).
    #[arg(long, env = "INFERENCECACHE_SNAPSHOT_INTERVAL", default_value = "1m",
          value_parser = parse_duration)]
    pub snapshot_interval: Duration,
}

impl StateArgs {
    /// The server's state settings.
    pub(crate) fn settings(&self) -> Option<inferencecache_server::state::StateSettings> {
        self.state_dir
            .clone()
            .filter(|d| !d.as_os_str().is_empty())
            .map(|dir| inferencecache_server::state::StateSettings {
                dir,
                interval: self.snapshot_interval,
            })
    }
}

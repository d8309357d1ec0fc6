//! Structured logs on stderr: JSON (default) or text.

use crate::args::LogFormat;
use tracing_subscriber::EnvFilter;

/// Per-target log levels (`tracing_subscriber`'s directive syntax, e.g.
/// `info,inferencecache::decisions=debug`): when set, they replace
/// `--log-level`, so one subsystem can be read at debug without the whole
/// process (HTTP/2 and gRPC libraries are chatty at debug).
pub(crate) const LOG_ENV: &str = "INFERENCECACHE_LOG";

/// Installs the global subscriber.
pub(crate) fn init(format: LogFormat, level: tracing::Level) -> anyhow::Result<()> {
    let filter = match std::env::var(LOG_ENV) {
        Ok(d) if !d.trim().is_empty() => EnvFilter::try_new(&d)
            .map_err(|e| anyhow::anyhow!("{LOG_ENV}={d:?} is not a list of log directives: {e}"))?,
        _ => EnvFilter::new(level.as_str()),
    };
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .with_target(false);
    let result = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}

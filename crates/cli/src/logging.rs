//! Structured logs on stderr: JSON (default) or text.

use crate::args::LogFormat;

/// Installs the global subscriber.
pub(crate) fn init(format: LogFormat, level: tracing::Level) -> anyhow::Result<()> {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
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

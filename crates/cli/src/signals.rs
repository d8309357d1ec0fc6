//! SIGINT / SIGTERM for the long-running subcommands.
//!
//! Handlers are registered when [`Stop::install`] returns, before a
//! subcommand logs "listening". tokio's `ctrl_c()` registers only on its
//! first poll, so a spawned task built on it leaves a window in which a
//! signal sent right after "listening" still gets the default action (the
//! process dies without its graceful shutdown). Installing first closes it.

use tokio_util::sync::CancellationToken;

/// SIGINT and SIGTERM, listened for from the moment this exists.
pub(crate) struct Stop {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl Stop {
    /// Registers both handlers now. Needs a running tokio runtime.
    pub(crate) fn install() -> std::io::Result<Self> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Self {
                interrupt: signal(SignalKind::interrupt())?,
                terminate: signal(SignalKind::terminate())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Self {})
    }

    /// Resolves on the first SIGINT or SIGTERM.
    pub(crate) async fn requested(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
    }

    /// Cancels `shutdown` on the first signal; returns early, without
    /// cancelling, if `shutdown` is cancelled by someone else.
    pub(crate) async fn forward(mut self, shutdown: CancellationToken) -> bool {
        tokio::select! {
            () = self.requested() => {
                shutdown.cancel();
                true
            }
            () = shutdown.cancelled() => false,
        }
    }
}

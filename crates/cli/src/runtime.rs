//! What every long-running command (`serve`, `subscribe`, `gateway`,
//! `operator`) shares before its own work starts: the exit codes and the
//! tokio runtime.

use std::process::ExitCode;

/// Exit code for flag errors (same as clap's usage errors).
pub(crate) const EXIT_USAGE: u8 = 2;
/// Exit code for runtime failures (bind, TLS files, listener errors).
pub(crate) const EXIT_FAILURE: u8 = 1;

/// The multi-threaded runtime `command` runs on (`workers`: threads, else
/// one per core). Failing to build it (no threads, no epoll) is reported on
/// stderr and in the log, and is the command's exit code.
pub(crate) fn multi_thread(
    command: &str,
    workers: Option<usize>,
) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        builder.worker_threads(n);
    }
    builder.enable_all().build().map_err(|e| {
        tracing::error!(error = %e, command, "cannot start the runtime");
        eprintln!("inferencecache {command}: cannot start the runtime: {e}");
        ExitCode::from(EXIT_FAILURE)
    })
}

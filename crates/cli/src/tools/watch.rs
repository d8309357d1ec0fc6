//! `inferencecache watch`: StreamCacheEvents, live and filterable.

use clap::Args;
use std::process::ExitCode;

/// Flags of `watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {}

/// Runs `watch`; returns the process exit code.
pub fn run(_args: WatchArgs) -> ExitCode {
    eprintln!("inferencecache watch: not built yet");
    ExitCode::from(2)
}

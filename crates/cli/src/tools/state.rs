//! `inferencecache state`: GetCacheState for a tenant/model.

use clap::Args;
use std::process::ExitCode;

/// Flags of `state`.
#[derive(Debug, Args)]
pub struct StateArgs {}

/// Runs `state`; returns the process exit code.
pub fn run(_args: StateArgs) -> ExitCode {
    eprintln!("inferencecache state: not built yet");
    ExitCode::from(2)
}

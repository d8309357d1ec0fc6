//! `inferencecache lookup`: one LookupRoute, printed readably or as JSON.

use clap::Args;
use std::process::ExitCode;

/// Flags of `lookup`.
#[derive(Debug, Args)]
pub struct LookupArgs {}

/// Runs `lookup`; returns the process exit code.
pub fn run(_args: LookupArgs) -> ExitCode {
    eprintln!("inferencecache lookup: not built yet");
    ExitCode::from(2)
}

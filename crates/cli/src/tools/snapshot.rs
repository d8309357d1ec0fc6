//! `inferencecache snapshot`: the control /snapshot, pretty-printed.

use clap::Args;
use std::process::ExitCode;

/// Flags of `snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {}

/// Runs `snapshot`; returns the process exit code.
pub fn run(_args: SnapshotArgs) -> ExitCode {
    eprintln!("inferencecache snapshot: not built yet");
    ExitCode::from(2)
}

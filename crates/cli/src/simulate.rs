//! `inferencecache simulate`: trace-driven routing simulator.

use clap::Args;
use std::process::ExitCode;

/// Flags of `simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {}

/// Runs `simulate`; returns the process exit code.
pub fn run(_args: SimulateArgs) -> ExitCode {
    eprintln!("inferencecache simulate: not built yet");
    ExitCode::from(2)
}

//! `inferencecache subscribe`: the kvevent-subscriber sidecar (engine ZMQ KV events -> server).

use clap::Args;
use std::process::ExitCode;

/// Flags of `subscribe`.
#[derive(Debug, Args)]
pub struct SubscribeArgs {}

/// Runs `subscribe`; returns the process exit code.
pub fn run(_args: SubscribeArgs) -> ExitCode {
    eprintln!("inferencecache subscribe: not built yet");
    ExitCode::from(2)
}

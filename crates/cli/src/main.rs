//! `inferencecache`: the cache-aware routing control plane for LLM inference.
//!
//! `inferencecache serve` runs the policy server. Flag parsing, logging and
//! signal handling live here; everything else is in the library crates.

mod args;
mod bus_args;
mod doctor;
mod gateway;
mod logging;
mod operator;
mod runtime;
mod serve;
mod signals;
mod simulate;
mod subscribe;
mod tools;

/// The allocator (docs/decisions.md, issue 36 item 5): chosen at build time
/// by feature so the memory rig (`inferencecache-bench memory-flood`) can
/// compare them.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
#[cfg(all(feature = "jemalloc", not(feature = "mimalloc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches};
use std::process::ExitCode;

fn main() -> ExitCode {
    // Parsed in two steps (what `Parser::parse_from` does) so that doctor
    // can tell a --server typed on the command line, which beats what
    // --kubeconfig discovers, from the default or INFERENCECACHE_SERVER,
    // which do not.
    let matches = args::Cli::command().get_matches_from(args::go_style_args(std::env::args_os()));
    let cli = match args::Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.format(&mut args::Cli::command()).exit(),
    };
    let server_flag_given = matches
        .subcommand_matches("doctor")
        .and_then(|m| m.value_source("server"))
        == Some(ValueSource::CommandLine);
    if let Err(e) = logging::init(cli.log_format, cli.log_level) {
        eprintln!("inferencecache: {e}");
        return ExitCode::from(2);
    }
    match cli.command {
        args::Command::Serve(serve_args) => serve::run(serve_args),
        args::Command::Subscribe(a) => subscribe::run(a),
        args::Command::Lookup(a) => tools::lookup::run(a),
        args::Command::State(a) => tools::state::run(a),
        args::Command::Snapshot(a) => tools::snapshot::run(a),
        args::Command::Watch(a) => tools::watch::run(a),
        args::Command::Simulate(a) => simulate::run(a),
        args::Command::Operator(a) => operator::run(a),
        args::Command::Crds(a) => operator::crds(a),
        args::Command::Doctor(a) => doctor::run(a, server_flag_given),
        args::Command::Gateway(a) => gateway::run(a),
    }
}

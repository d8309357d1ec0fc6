//! `inferencecache-bench visibility`: engine event → visible in LookupRoute.
//!
//! Everything runs in this process on loopback, sharing the machine's cores
//! as a sidecar deployment shares a node: a ZMQ publisher shaped like vLLM's,
//! the real sidecar (`inferencecache_subscriber::sidecar`) and the real
//! server. The publisher stores new root chains at a target rate; a sample
//! of them is polled with LookupRoute (same token_ids, every 1 ms) until it
//! answers PREFIX_MATCH for the replica. Latency = publish → first match.
//! `--mode churn` also removes old chains at the same block rate and times
//! eviction → gone ([`churn`]). It also prints the sidecar's memory per
//! tracked block (RSS delta while tracking a million blocks).

mod churn;
mod memory;
mod probe;
mod rig;
mod store;

use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use inferencecache_subscriber::forward::ForwardConfig;
use inferencecache_subscriber::loopback::Stored;

/// Flags of `inferencecache-bench visibility`.
#[derive(Debug, Args)]
pub(super) struct VisibilityBenchArgs {
    /// Target ingest rates in blocks per second.
    #[arg(long, value_delimiter = ',', default_value = "1000,50000")]
    rates: Vec<u64>,
    /// The sidecar's --window.
    #[arg(long, default_value = "100ms", value_parser = crate::args::parse_duration)]
    window: Duration,
    /// How long to publish (and measure) at each rate.
    #[arg(long, default_value = "10s", value_parser = crate::args::parse_duration)]
    duration: Duration,
    /// Blocks per BlockStored event (16 tokens each; 4 = the 64-token floor).
    #[arg(long, default_value_t = 4)]
    blocks_per_event: u32,
    /// Events sampled per second for latency.
    #[arg(long, default_value_t = 25)]
    samples_per_second: u64,
    /// `store`: only new chains. `churn`: also remove each chain from the
    /// GPU --evict-after it was stored, so evictions run at the store rate,
    /// and time eviction → gone as well.
    #[arg(long, value_enum, default_value_t = Mode::Store)]
    mode: Mode,
    /// churn: how long a chain stays cached; also the fill time before
    /// measuring starts.
    #[arg(long, default_value = "1s", value_parser = crate::args::parse_duration)]
    evict_after: Duration,
    /// The sidecar's PublishEvent calls in flight at most.
    #[arg(long, default_value_t = ForwardConfig::default().max_in_flight)]
    max_in_flight: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Store,
    Churn,
}

const BLOCK: u32 = 16;
/// The publisher sends one batch per tick.
const TICK: Duration = Duration::from_millis(5);

/// Chain number `n` of `bpe` blocks: a root with its own tokens.
fn chain(n: u64, bpe: u64) -> Stored {
    let base = n * bpe;
    let first_token = (base as u32).wrapping_mul(BLOCK);
    Stored {
        hashes: (base..base + bpe).map(|h| u64::MAX - h).collect(),
        parent: None,
        tokens: first_token..first_token + bpe as u32 * BLOCK,
    }
}

/// Runs the benchmark and prints one line per rate.
pub(super) fn run(args: VisibilityBenchArgs) -> anyhow::Result<()> {
    memory::memory_per_block()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    let churn = args.mode == Mode::Churn;
    print!(
        "window {:?}; {} blocks/event; {} s per rate",
        args.window,
        args.blocks_per_event,
        args.duration.as_secs_f64()
    );
    if churn {
        print!(
            "; churn: chains removed {:?} after being stored",
            args.evict_after
        );
    }
    println!();
    if churn {
        churn::header();
    } else {
        store::header();
    }
    for &rate in &args.rates {
        if churn {
            runtime.block_on(churn::one_rate(&args, rate))?;
        } else {
            runtime.block_on(store::one_rate(&args, rate))?;
        }
    }
    Ok(())
}

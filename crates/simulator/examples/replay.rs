//! Replays a trace with the default settings and every policy, like
//! `inferencecache simulate`, from code:
//!
//! ```text
//! cargo run --release -p inferencecache-simulator --example replay -- TRACE [REPLICAS] [OUT_PREFIX] [CACHE_BLOCKS]
//! ```
//!
//! Prints the Markdown table; with OUT_PREFIX also writes OUT_PREFIX.json,
//! .csv and .svg.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use inferencecache_simulator::{SimConfig, Workload, read_trace, simulate, write_plot};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let trace = args
        .next()
        .ok_or("usage: replay TRACE [REPLICAS] [OUT_PREFIX|-] [CACHE_BLOCKS]")?;
    let mut config = SimConfig {
        progress: true,
        ..SimConfig::default()
    };
    if let Some(n) = args.next() {
        config.settings.replicas = n.parse()?;
    }
    let out = args.next().filter(|o| o != "-");
    if let Some(blocks) = args.next() {
        config.settings.cache_blocks = blocks.parse()?;
    }
    let started = std::time::Instant::now();
    let workload = Workload::new(&trace, read_trace(trace.as_ref(), None)?, &config.settings);
    let report = simulate(&config, &workload).await?;
    print!("{}", report.markdown());
    if let Some(out) = out {
        std::fs::write(format!("{out}.json"), report.json())?;
        std::fs::write(format!("{out}.csv"), report.csv())?;
        write_plot(&report, format!("{out}.svg").as_ref())?;
    }
    println!("wall time {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

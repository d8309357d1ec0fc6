//! Trace-driven routing simulator: replays Mooncake traces through the real
//! inference-cache stack and compares routing policies.
//!
//! ```text
//! trace (JSONL) ─► Workload: arrivals, hash ids → tokens → fingerprints
//!                     │ per policy, fresh server state
//!                     ▼
//! gateway ── LookupRoute (inferencecache-client) ──► server (in-process or --server)
//!    │ pick (hint, round-robin fallback, or rr / least-loaded / oracle)   ▲
//!    ▼                                                                    │ ReportCacheState
//! replica: LRU KV cache + FIFO prefill + batched decode                   │ PublishEvent
//!    └─ vLLM KV-event batch (msgpack) ─► subscriber mapping ──────────────┘  (+ pressure stats)
//! ```
//!
//! Modules: [`trace`] (reader), [`tokens`] (hash ids → tokens and
//! fingerprints), [`engine`] (cache and queue), [`engine_events`] (vLLM wire
//! batches), [`service_model`] (TTFT), [`policy`], [`backend`] (server and
//! client), [`sim`] (the event loop), [`report`] (figures), [`plot`] (SVG).
//!
//! ```no_run
//! # async fn run() -> Result<(), inferencecache_simulator::SimError> {
//! use inferencecache_simulator::{SimConfig, Workload, read_trace, simulate};
//! let config = SimConfig::default();
//! let trace = read_trace("conversation_trace.jsonl".as_ref(), Some(1000))?;
//! let workload = Workload::new("conversation", trace, &config.settings);
//! let report = simulate(&config, &workload).await?;
//! print!("{}", report.table());
//! # Ok(()) }
//! ```

pub mod backend;
pub mod config;
pub mod engine;
pub mod engine_events;
mod error;
pub mod plot;
mod plot_png;
pub mod policy;
pub mod report;
pub mod service_model;
pub mod sim;
pub mod tokens;
pub mod trace;

pub use config::{LookupInput, Settings, SimConfig};
pub use error::SimError;
pub use plot::write_plot;
pub use policy::PolicyKind;
pub use report::{PolicyResult, SimReport};
pub use service_model::ServiceModel;
pub use sim::{Workload, simulate};
pub use trace::{TraceRequest, parse_trace, read_trace};

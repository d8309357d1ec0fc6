//! The inference-cache policy server.
//!
//! It serves the `inferencecache.v1alpha1.InferenceCache` contract over gRPC
//! (with health and reflection), exposes `/healthz`, `/readyz` and `/metrics`
//! on a public HTTP listener, and the controller's endpoints on a separate
//! control listener. Handlers are thin adapters over the domain crates; the
//! binary (`inferencecache serve`) only parses flags and sets up logging.
//!
//! # Layout
//!
//! Three layers, each depending only on the ones below it (no two top-level
//! modules import each other; `.ci/import-cycles --max 3 crates/server/src`
//! holds the line):
//!
//! - **Edge**: `serve` wires everything; `service` (gRPC handlers) and
//!   `convert` (every proto ⇄ domain conversion), `http` (with the status
//!   page, `http/ui`),
//!   `replicate` (the bus relay and the state directory), `producer` (who
//!   may write), `config`, `tls`. Edge subsystems register their own metrics
//!   in the server's registry at construction and keep the handles.
//! - **Domain**: `core` (the index with its policies, templates, PD
//!   topologies and the LookupRoute pipeline), `route`, `pd`, `templates`,
//!   `policy`, `state`, `probe`, `snapshot`.
//! - **Leaves**: `metrics` and the subsystem metric families it holds,
//!   `limits`, `grpc_error` (the one gRPC error table),
//!   `reserved_tenant`, `events`, `tokenize`, ...
//!
//! Modules public here are the ones other crates use (the binary, the
//! gateway, the simulator, the benches and the test suites).
//!
//! ```no_run
//! # async fn run() -> Result<(), inferencecache_server::ServeError> {
//! use inferencecache_server::{Server, ServerConfig};
//! let server = Server::bind(&ServerConfig::ephemeral()).await?;
//! println!("gRPC on {}", server.grpc_addr());
//! server.serve(tokio_util::sync::CancellationToken::new()).await
//! # }
//! ```

// The edge.
pub mod config;
pub mod convert;
mod grpc;
pub mod grpc_limits;
mod grpc_lookup;
mod http;
pub mod producer;
pub mod replicate;
mod serve;
pub mod service;
mod tls;
mod write_coalesce;

// The domain.
pub mod core;
pub mod ingest_lane;
mod named;
mod pd;
pub mod policy;
mod probe;
pub mod route;
pub mod snapshot;
pub mod state;
mod templates;
mod watch;

// Leaves: metrics, limits, errors and small shared types.
mod answer_buffers;
mod auth;
mod block_size;
pub mod caller_loads;
pub mod decision_log;
pub mod delivery_log;
mod error;
mod events;
pub mod foresight;
mod grpc_error;
mod index_gauges;
pub mod limits;
mod listen;
mod liveness;
pub mod local_ingest;
pub mod lookup_wire;
pub mod metrics;
mod readiness;
mod reserved_tenant;
mod routing_metrics;
mod sampler;
mod scratch_bytes;
mod store_metrics;
pub mod tokenize;
mod tokenize_budget;

pub use config::{ControlAuth, ServerConfig};
pub use error::{ConfigError, ServeError};
pub use serve::{DRAIN_TIMEOUT, Server};
/// The prompt_text prefix cache (its budget default and metrics), at the
/// path the gateway and the benches name.
pub use tokenize::prefix as tokenize_prefix;

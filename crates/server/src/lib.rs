//! The inference-cache policy server.
//!
//! It serves the `inferencecache.v1alpha1.InferenceCache` contract over gRPC
//! (with health and reflection), exposes `/healthz`, `/readyz` and `/metrics`
//! on a public HTTP listener, and the controller's endpoints on a separate
//! control listener. Handlers are thin adapters over the domain crates; the
//! binary (`inferencecache serve`) only parses flags and sets up logging.
//!
//! ```no_run
//! # async fn run() -> Result<(), inferencecache_server::ServeError> {
//! use inferencecache_server::{Server, ServerConfig};
//! let server = Server::bind(&ServerConfig::ephemeral()).await?;
//! println!("gRPC on {}", server.grpc_addr());
//! server.serve(tokio_util::sync::CancellationToken::new()).await
//! # }
//! ```

pub mod auth;
pub mod block_size;
pub mod config;
pub mod convert;
pub mod core;
mod error;
pub mod events;
pub mod exposition;
mod grpc;
pub mod grpc_error;
pub mod grpc_limits;
pub mod http;
pub mod http_error;
pub mod http_serve;
pub mod index_gauges;
pub mod ingest_lane;
pub mod limits;
pub mod listen;
pub mod liveness;
pub mod metrics;
pub mod named;
pub mod pd;
pub mod policy;
pub mod probe;
pub mod producer;
pub mod readiness;
pub mod replicate;
pub mod reserved_tenant;
pub mod route;
pub mod routing_metrics;
mod sampler;
mod serve;
pub mod service;
pub mod snapshot;
pub mod state;
pub mod store_metrics;
pub mod templates;
pub mod tiktoken;
pub mod tls;
pub mod tokenize;
pub mod tokenize_budget;
pub mod tokenize_prefix;
pub mod tokenize_split;
pub mod ui;
pub mod watch;
pub mod write_coalesce;

pub use config::{ControlAuth, ServerConfig};
pub use error::{ConfigError, ServeError};
pub use serve::{DRAIN_TIMEOUT, Server};

//! The inference-cache replication bus on NATS JetStream.
//!
//! Several server replicas share one view of the caches by applying one
//! ordered stream of the contract's own messages:
//!
//! ```text
//!  sidecar ──(subscribe --nats-url)──────────────► stream ──► replica 1 ─┐
//!  sidecar ──gRPC──► any replica (serve --nats-url) ─┘   ├──► replica 2  ├ identical answers
//!                                                        └──► replica 3 ─┘
//! ```
//!
//! - **Stream layout** ([`config`], [`subject`]): one stream, a subject per
//!   (tenant, model) `{prefix}.{tenant}.{model}` with names escaped into
//!   single tokens; retention by age and bytes so a replay is bounded.
//! - **Messages** ([`message`]): the protobuf `CacheStateUpdate` or
//!   `CacheEvent`, named by a header. Time 0 means "when the stream stored
//!   it", so every replica resolves it identically.
//! - **Producer** ([`producer`]): ordered publishes with acks and a bound in
//!   flight, a bounded buffer while the bus is down (drops counted), and a
//!   resync signal to its owner after any possible loss or on request.
//! - **Consumer** ([`consumer`]): ordered apply from the sequence after the
//!   last applied one, caught-up and lag tracking, gap detection, bad input
//!   counted and skipped.
//! - **Resync control subject**: [`BusConfig::resync_subject`], outside the
//!   stream (a live signal, never replayed).
//! - **Shared load** ([`load`]): the hints each server replica delivered,
//!   coalesced per interval, on a core-NATS subject outside the stream
//!   ([`BusConfig::load_subject`]): a load signal, fire-and-forget, never
//!   replayed.
//! - **Snapshot bucket** ([`objects`]): a JetStream object store where
//!   replicas publish snapshots and from which an empty replica warms up.
//!
//! Targets nats-server 2.9 (`-js`): the client is built without the 2.10+
//! API features.

pub mod config;
pub mod consumer;
pub mod load;
pub mod message;
pub mod objects;
pub mod producer;
pub mod subject;

pub use async_nats;
pub use config::{Bus, BusConfig};
pub use consumer::{Applied, ConsumerStatus, Delivery, run_consumer};
pub use load::{DeliveryBatch, ReplicaDeliveries};
pub use message::{BusMessage, SkipReason};
pub use objects::{PublishedSnapshot, SnapshotBucket};
pub use producer::{Producer, ProducerLimits, ProducerStats, request_resync};

/// Bus errors.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// Bad settings.
    #[error("bus configuration: {0}")]
    Config(String),
    /// The client could not be set up.
    #[error("bus connect: {0}")]
    Connect(String),
    /// Stream or consumer operation failed.
    #[error("bus stream: {0}")]
    Stream(String),
    /// A publish failed.
    #[error("bus publish: {0}")]
    Publish(String),
    /// Object store operation failed.
    #[error("bus snapshot bucket: {0}")]
    Objects(String),
}

//! The inference-cache Kubernetes operator.
//!
//! It turns the cluster's custom resources into server state and the
//! server's state back into resource status:
//!
//! - [`crd`]: the kinds (CachePolicy, CacheTenant, CacheIndex,
//!   PromptTemplate, PDTopology, a slim CacheBackend) and their CRD YAML.
//! - [`push`] + [`resolve`]: CachePolicy/CacheTenant → the server's
//!   `/policy` (replace-on-write, on every change and every 30 s), and
//!   PromptTemplate/PDTopology → `/templates` and `/pd-topologies`.
//! - [`poller`] + [`project`]: `/snapshot` → CacheIndex `cluster-default`,
//!   CacheTenant and CacheBackend status, written only on change.
//! - [`leader`]: a `coordination.k8s.io/v1` Lease so only one replica
//!   pushes and writes status.
//! - [`webhook`]: admission over TLS (CachePolicy/CacheTenant validation,
//!   sidecar injection into engine pods), with a certificate it provisions,
//!   rotates and injects itself ([`webhook::provision`]) unless cert-manager
//!   provides one.
//! - [`reach`]: `/readyz` is true only while the server's control address
//!   accepts connections, in every replica.
//!
//! The operator talks to the server only over HTTP, through the wire types
//! of `inferencecache-control-api`; it does not link the server.
//! `inferencecache operator` runs [`run::Operator`]; `inferencecache crds`
//! prints [`crd::all_yaml`].

pub mod client;
pub mod crd;
pub mod duration;
pub mod leader;
pub mod metrics;
pub mod poller;
pub mod project;
pub mod push;
pub mod reach;
pub mod resolve;
pub mod run;
pub mod templates;
pub mod webhook;

pub use run::{Operator, OperatorConfig, RunError};

#[cfg(feature = "testing")]
pub mod testing;

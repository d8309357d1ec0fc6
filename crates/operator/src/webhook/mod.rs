//! Admission webhooks served over TLS by every operator replica: the
//! CachePolicy and CacheTenant validating rules (B.5) and the pod mutating
//! webhook that appends the subscriber sidecar (A.10).
//!
//! Paths are the reference's, so its webhook configurations work unchanged.
//! The validators fail closed (their configurations say `failurePolicy:
//! Fail`: an unreadable review is answered as an error); the pod webhook is
//! registered with `failurePolicy: Ignore` and admits on every internal
//! error, so an operator outage never blocks engine pods.

pub mod inject;
pub mod provision;
pub mod selfsigned;
mod server;
pub mod tls;
pub mod validate;

pub use server::{WebhookError, WebhookServer, WebhookState};

/// CachePolicy validation path.
pub const VALIDATE_CACHEPOLICY: &str = "/validate-inferencecache-io-v1alpha1-cachepolicy";
/// CacheTenant validation path.
pub const VALIDATE_CACHETENANT: &str = "/validate-inferencecache-io-v1alpha1-cachetenant";
/// Pod mutation path.
pub const MUTATE_POD: &str = "/mutate--v1-pod";

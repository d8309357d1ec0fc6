//! The control-plane wire types of inference-cache.
//!
//! The server's control listener and the Kubernetes operator speak JSON to
//! each other: the operator pushes tenant policy (`POST /policy`), prompt
//! templates (`POST /templates`) and prefill/decode topologies
//! (`POST /pd-topologies`), and polls the index (`GET /snapshot`). These
//! types are that contract, defined once so that a change to the push format
//! is one change in one place. The crate holds data shapes only: no I/O, no
//! validation beyond what serde expresses, and no dependency on the server,
//! the index or Kubernetes types (the server must not pull in CRDs, the
//! operator must not pull in the server).
//!
//! - [`policy`]: the `/policy` document (versions 3–7 of the reference's
//!   format, field for field), decoded and normalized by the server.
//! - [`snapshot`]: the `/snapshot` body, with Go's JSON encoding rules
//!   reproduced (float32 shortest form, RFC 3339 nanosecond times, the zero
//!   time sentinel).
//! - [`templates`] and [`pd`]: the `/templates` and `/pd-topologies` push
//!   bodies (ours; the reference has no such endpoints).
//! - [`listen`]: the listen-address forms (`:PORT`, `HOST:PORT`) every
//!   listener of the binary accepts, parsed once for the server, the
//!   operator and the sidecar (std only, like the rest of this crate).

/// The tenant the server reserves for its functional self-test (`/probe`):
/// the index keeps its entries out of every count, snapshot and quota, no
/// policy or CacheTenant may name it, and the live event stream never shows
/// it. Shared here because the server and the operator's webhook both
/// enforce it.
pub const PROBE_TENANT: &str = "inferencecache.io/probe";

pub mod duration;
pub mod listen;
pub mod pd;
pub mod policy;
pub mod snapshot;
pub mod templates;

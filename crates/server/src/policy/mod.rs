//! Tenant policies: the `/policy` push format (versions 3–8), normalization of
//! older bodies, and the store the handlers and the index read from.
//!
//! The controller pushes the complete policy set about every 30 s
//! (replace-on-write); a standalone server can load the same schema from
//! `--policy-file` instead. Anything a push leaves out reverts to defaults.

mod file;
mod resolved;
mod routing;
mod store;
mod validate;
mod wire;

pub use file::{PolicyFileWatcher, PolicyTarget, load_policy_file, watch_policy_file};
pub use resolved::{EvictionAlgorithm, PolicySet, TenantPolicy};
pub use routing::{BadRanking, RoutingWire, resolve_routing};
pub use store::PolicyStore;
pub use wire::{
    DEFAULT_MINIMUM_MATCHED_TOKENS, DEFAULT_ROUTING_FLOOR_SCORE, MAX_POLICY_BODY_BYTES,
    POLICY_MINIMUM_ACCEPTED_VERSION, POLICY_PROPAGATION_VERSION, PolicyError, PolicySnapshot,
    ResolvedPolicy, ResolvedTenant, StrategyWire, decode_policy_json, decode_policy_json_lenient,
    into_policy_set,
};

//! Domain types: what the server hands the index and what it gets back.
//! No protobuf type ever reaches the index. One file per concern: tiers,
//! producer reports, lookups, read-side state, write outcomes.

mod lookup;
mod outcome;
mod report;
mod state;
mod tier;

pub(crate) use lookup::{HitKeys, HitRun};
pub use lookup::{
    LfuHits, LookupPolicy, LookupRequest, LookupRouteResult, RankedScore, ReplicaId, ReplicaNames,
    ReplicaScore, ScoreById, Strategy,
};
pub use outcome::{EventOutcome, EvictionCounts, IngestOutcome, SweepOutcome};
pub use report::{CacheEvent, CacheUpdate, EngineLoad, EventKind, PrefixEntry, ReplicaStatsReport};
pub use state::{
    Aggregate, CacheState, ReplicaStatsView, Snapshot, SnapshotReplica, SnapshotTenant,
};
pub use tier::Tier;

//! Hook for the replication bus (issue 13): what the status page shows about
//! it. No bus exists on this branch, so [`bus_status`] reports none and the
//! page says so; when the bus lands, fill this in from its state (per-replica
//! lag, connection) and the page's "bus" column lights up unchanged.

use crate::core::Core;
use serde::Serialize;

/// The bus as the page shows it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BusStatus {
    /// Bus kind and address, e.g. `nats://nats:4222`.
    pub endpoint: String,
    /// Connected right now.
    pub connected: bool,
    /// Seconds between the newest message published and the newest applied
    /// here, when known.
    pub lag_seconds: Option<f64>,
}

/// The bus's state, or `None` when the server runs without a bus.
pub fn bus_status(_core: &Core) -> Option<BusStatus> {
    None
}

/// Per-replica bus lag in seconds, or `None` without a bus.
pub fn replica_bus_lag_seconds(_core: &Core, _replica_id: &str) -> Option<f64> {
    None
}

//! `/ui/state`: one JSON document with everything the status page draws
//! except the live feed. Built from the same index snapshot as `/snapshot`
//! plus the policy store (quotas) and the server's own counters; the page
//! polls it and turns counters into rates itself.

use super::bus::{BusStatus, bus_status, replica_bus_lag_seconds};
use super::feed::CLIENT_BUFFER;
use super::metrics::UiMetrics;
use crate::core::Core;
use crate::replicate::BusRelay;
use crate::snapshot::rfc3339_nano;
use serde::Serialize;
use std::collections::BTreeMap;

/// The page's document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UiState {
    /// Server wall clock (Unix ms), to compute report ages.
    pub now_ms: i64,
    /// Serving and ready.
    pub ready: bool,
    /// Version of the policy set in force.
    pub policy_version: i64,
    /// Tenants (namespaces) with a CachePolicy in force, sorted.
    pub policy_tenants: Vec<String>,
    /// One row per (tenant, replica).
    pub replicas: Vec<UiReplica>,
    /// One row per tenant.
    pub tenants: Vec<UiTenant>,
    /// Distinct prefixes indexed.
    pub total_prefixes: i64,
    /// Replica x prefix entries held, and the cap (0 = unbounded).
    pub replica_entries: i64,
    /// The global cap on replica x prefix entries (0 = unbounded).
    pub max_entries: i64,
    /// CacheStateUpdate messages ingested so far.
    pub ingest_updates: u64,
    /// LookupRoute calls so far by reason code (all models).
    pub lookups_by_reason: BTreeMap<&'static str, u64>,
    /// Sum and count of LookupRoute latency (seconds), all models.
    pub lookup_latency_sum: f64,
    /// Observations behind `lookup_latency_sum`.
    pub lookup_latency_count: u64,
    /// The replication bus, or null without one.
    pub bus: Option<BusStatus>,
    /// The live feed's clients and drops.
    pub feed: FeedState,
}

/// One replica row.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UiReplica {
    /// Replica id.
    pub replica_id: String,
    /// Tenant.
    pub tenant: String,
    /// Last stats report (RFC 3339; the zero time without one).
    pub last_update: String,
    /// Last stats report, Unix ms.
    pub last_update_ms: Option<i64>,
    /// Newest entry's last-seen time, Unix ms.
    pub last_event_ms: Option<i64>,
    /// Reported KV-cache pressure (0..1).
    pub pressure: f32,
    /// Reported hit rate (0..1).
    pub hit_rate: f32,
    /// Entries held for the tenant.
    pub prefix_count: i64,
    /// Tentative holdings (approximate mode).
    pub tentative_count: i64,
    /// Reported cache memory.
    pub cache_memory_bytes: i64,
    /// Tokens served from the second tier (CPU/offload) vs queried there.
    pub t2_hit_tokens: i64,
    /// Tokens looked up in the second tier.
    pub t2_query_tokens: i64,
    /// Sidecar/client version.
    pub client_version: String,
    /// Bus lag for this replica, null without a bus.
    pub bus_lag_seconds: Option<f64>,
}

/// One tenant row.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UiTenant {
    /// Tenant id.
    pub tenant_id: String,
    /// Distinct prefixes held.
    pub index_entries: i64,
    /// The policy's distinct-prefix quota, null when unbounded.
    pub quota: Option<i64>,
    /// Mean of the replicas' hit rates.
    pub hit_rate: f32,
    /// At least one replica reported a hit rate.
    pub hit_rate_reported: bool,
}

/// Live-feed counters.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct FeedState {
    /// Open `/ui/events` streams.
    pub clients: i64,
    /// Events dropped for slow clients, all clients.
    pub dropped: u64,
    /// Per-client queue size.
    pub buffer: usize,
}

fn ms(ns: Option<i64>) -> Option<i64> {
    ns.map(|n| n / 1_000_000)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Builds the document (blocking: takes an index snapshot).
pub(super) fn build(
    core: &Core,
    feed: &UiMetrics,
    relay: Option<&BusRelay>,
    ready: bool,
) -> UiState {
    let snap = core.index.snapshot();
    let policies = core.policies.current();
    let replicas = snap
        .replicas
        .iter()
        .map(|r| UiReplica {
            replica_id: r.replica_id.to_string(),
            tenant: r.tenant.to_string(),
            last_update: rfc3339_nano(r.last_update_ns),
            last_update_ms: ms(r.last_update_ns),
            last_event_ms: ms(r.last_event_at_ns),
            pressure: r.pressure,
            hit_rate: r.hit_rate,
            prefix_count: r.prefix_count,
            tentative_count: r.tentative_count,
            cache_memory_bytes: r.cache_memory_bytes,
            t2_hit_tokens: r.t2_hit_tokens,
            t2_query_tokens: r.t2_query_tokens,
            client_version: r.client_version.to_string(),
            bus_lag_seconds: replica_bus_lag_seconds(relay, &r.replica_id),
        })
        .collect();
    let tenants = snap
        .tenants
        .iter()
        .map(|t| UiTenant {
            tenant_id: t.tenant_id.to_string(),
            index_entries: t.index_entries,
            quota: core.policies.quota(&t.tenant_id),
            hit_rate: t.hit_rate,
            hit_rate_reported: t.hit_rate_reported,
        })
        .collect();
    let mut policy_tenants: Vec<String> = policies.policies.keys().cloned().collect();
    policy_tenants.sort();
    let lookups = core.metrics.lookup_totals();
    UiState {
        now_ms: now_ms(),
        ready,
        policy_version: policies.version,
        policy_tenants,
        replicas,
        tenants,
        total_prefixes: snap.total_prefixes,
        replica_entries: core.metrics.index_gauges.replica_entries(),
        max_entries: core.metrics.index_max_entries.get(),
        ingest_updates: core.metrics.ingest_updates.get(),
        lookups_by_reason: lookups.by_reason,
        lookup_latency_sum: lookups.latency_sum,
        lookup_latency_count: lookups.latency_count,
        bus: bus_status(relay),
        feed: FeedState {
            clients: feed.clients.get(),
            dropped: feed.dropped.get(),
            buffer: CLIENT_BUFFER,
        },
    }
}

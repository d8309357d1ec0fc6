//! The live feed behind StreamCacheEvents: the index tells the hub about every
//! change after releasing its locks; the hub fans them out to subscribers
//! through a bounded broadcast ring. Ingest never waits: a subscriber that
//! falls more than [`EVENT_BUFFER`] events behind is disconnected with
//! RESOURCE_EXHAUSTED.
//!
//! The reserved probe tenant's changes (the `/probe` self-test writes and
//! removes its own entries) are never published: no watcher, filtered or
//! not, sees them.

use inferencecache_index::{IndexObserver, PROBE_TENANT, PrefixChange, RemovalReason};
use inferencecache_proto::v1alpha1::{CacheEvent, cache_event::Type};
use tokio::sync::broadcast;

/// Events a subscriber may fall behind before it is disconnected.
pub const EVENT_BUFFER: usize = 4096;

/// Fans index changes out to StreamCacheEvents subscribers.
#[derive(Debug, Clone)]
pub struct EventHub {
    tx: broadcast::Sender<CacheEvent>,
}

impl Default for EventHub {
    fn default() -> Self {
        Self::new()
    }
}

fn micros(ns: i64) -> i64 {
    ns / 1_000
}

impl EventHub {
    /// A hub with the default buffer.
    pub fn new() -> Self {
        Self::with_capacity(EVENT_BUFFER)
    }

    /// A hub whose subscribers may lag `capacity` events.
    pub fn with_capacity(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(1));
        Self { tx }
    }

    /// A new subscription to every later event.
    pub fn subscribe(&self) -> broadcast::Receiver<CacheEvent> {
        self.tx.subscribe()
    }

    fn publish(&self, tenant: &str, make: impl FnOnce() -> CacheEvent) {
        // No subscriber: build nothing. The probe tenant is never shown.
        if self.tx.receiver_count() > 0 && tenant != PROBE_TENANT {
            let _ = self.tx.send(make());
        }
    }

    fn prefix_event(kind: Type, c: &PrefixChange) -> CacheEvent {
        CacheEvent {
            r#type: kind as i32,
            replica_id: c.replica_id.to_string(),
            model_id: c.model.to_string(),
            tenant_id: c.tenant.to_string(),
            prefix_hash: c.prefix_hash.to_vec(),
            timestamp_us: micros(c.last_seen_ns),
            adapter_id: c.adapter.to_string(),
        }
    }

    fn replica_event(kind: Type, tenant: &str, model: &str, replica: &str, ns: i64) -> CacheEvent {
        CacheEvent {
            r#type: kind as i32,
            replica_id: replica.to_owned(),
            model_id: model.to_owned(),
            tenant_id: tenant.to_owned(),
            prefix_hash: Vec::new(),
            timestamp_us: micros(ns),
            adapter_id: String::new(),
        }
    }
}

impl IndexObserver for EventHub {
    fn prefix_added(&self, change: &PrefixChange) {
        self.publish(&change.tenant, || {
            Self::prefix_event(Type::PrefixAdded, change)
        });
    }

    fn prefix_removed(&self, change: &PrefixChange, _reason: RemovalReason) {
        // CacheEvent has no reason field: TTL, cap, quota and engine
        // evictions all surface as PREFIX_EVICTED.
        self.publish(&change.tenant, || {
            Self::prefix_event(Type::PrefixEvicted, change)
        });
    }

    fn replica_cleared(&self, tenant: &str, model: &str, replica_id: &str, timestamp_ns: i64) {
        self.publish(tenant, || {
            Self::replica_event(Type::AllCleared, tenant, model, replica_id, timestamp_ns)
        });
    }

    fn replica_updated(&self, tenant: &str, model: &str, replica_id: &str, timestamp_ns: i64) {
        self.publish(tenant, || {
            Self::replica_event(
                Type::ReplicaUpdated,
                tenant,
                model,
                replica_id,
                timestamp_ns,
            )
        });
    }
}

/// A subscriber's filter (empty fields match everything).
#[derive(Debug, Clone, Default)]
pub struct EventFilter {
    /// Model id, or empty.
    pub model_id: String,
    /// Tenant id, or empty.
    pub tenant_id: String,
    /// Event types, or empty.
    pub types: Vec<i32>,
}

impl EventFilter {
    /// True when the event passes.
    pub fn matches(&self, e: &CacheEvent) -> bool {
        (self.model_id.is_empty() || self.model_id == e.model_id)
            && (self.tenant_id.is_empty() || self.tenant_id == e.tenant_id)
            && (self.types.is_empty() || self.types.contains(&e.r#type))
    }
}

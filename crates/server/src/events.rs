//! The live feed behind StreamCacheEvents: the index tells the hub about every
//! change after releasing its locks; the hub fans them out to subscribers
//! through a bounded broadcast ring. Ingest never waits: a subscriber that
//! falls more than [`EVENT_BUFFER`] events behind is disconnected with
//! RESOURCE_EXHAUSTED.
//!
//! The reserved probe tenant's changes (the `/probe` self-test writes and
//! removes its own entries) are never published: no watcher, filtered or
//! not, sees them.

use crate::reserved_tenant::is_reserved;
use inferencecache_index::{EventKind, IndexObserver, PrefixChange, RemovalReason};
use std::sync::Arc;
use tokio::sync::broadcast;

/// Events a subscriber may fall behind before it is disconnected.
pub(crate) const EVENT_BUFFER: usize = 4096;

/// One index change as the feed carries it. The strings are the index's own
/// shared ones, so fanning an event out to many subscribers copies pointers,
/// not bytes; `convert.rs` turns it into a wire `CacheEvent` per subscriber.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedEvent {
    /// What changed. Every removal (TTL, cap, quota, engine eviction) is a
    /// `PrefixEvicted`: the wire event has no reason field.
    pub kind: EventKind,
    /// Replica.
    pub replica_id: Arc<str>,
    /// Model.
    pub model: Arc<str>,
    /// Tenant.
    pub tenant: Arc<str>,
    /// Adapter partition (`""` = base model; empty for replica events).
    pub adapter: Arc<str>,
    /// Prefix hash (empty for replica events).
    pub prefix_hash: Arc<[u8]>,
    /// Unix µs.
    pub timestamp_us: i64,
}

/// Fans index changes out to StreamCacheEvents subscribers.
#[derive(Debug, Clone)]
pub(crate) struct EventHub {
    tx: broadcast::Sender<FeedEvent>,
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
    pub(crate) fn new() -> Self {
        Self::with_capacity(EVENT_BUFFER)
    }

    /// A hub whose subscribers may lag `capacity` events.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(capacity.max(1));
        Self { tx }
    }

    /// A new subscription to every later event.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<FeedEvent> {
        self.tx.subscribe()
    }

    fn publish(&self, tenant: &str, make: impl FnOnce() -> FeedEvent) {
        // No subscriber: build nothing. The probe tenant is never shown.
        if self.tx.receiver_count() > 0 && !is_reserved(tenant) {
            let _ = self.tx.send(make());
        }
    }

    fn prefix_event(kind: EventKind, c: &PrefixChange) -> FeedEvent {
        FeedEvent {
            kind,
            replica_id: Arc::clone(&c.replica_id),
            model: Arc::clone(&c.model),
            tenant: Arc::clone(&c.tenant),
            adapter: Arc::clone(&c.adapter),
            prefix_hash: Arc::clone(&c.prefix_hash),
            timestamp_us: micros(c.last_seen_ns),
        }
    }

    fn replica_event(
        kind: EventKind,
        tenant: &str,
        model: &str,
        replica: &str,
        ns: i64,
    ) -> FeedEvent {
        FeedEvent {
            kind,
            replica_id: replica.into(),
            model: model.into(),
            tenant: tenant.into(),
            adapter: "".into(),
            prefix_hash: Arc::from(&[][..]),
            timestamp_us: micros(ns),
        }
    }
}

impl IndexObserver for EventHub {
    fn prefix_added(&self, change: &PrefixChange) {
        self.publish(&change.tenant, || {
            Self::prefix_event(EventKind::PrefixAdded, change)
        });
    }

    fn prefix_removed(&self, change: &PrefixChange, _reason: RemovalReason) {
        self.publish(&change.tenant, || {
            Self::prefix_event(EventKind::PrefixEvicted, change)
        });
    }

    fn replica_cleared(&self, tenant: &str, model: &str, replica_id: &str, timestamp_ns: i64) {
        self.publish(tenant, || {
            Self::replica_event(
                EventKind::AllCleared,
                tenant,
                model,
                replica_id,
                timestamp_ns,
            )
        });
    }

    fn replica_updated(&self, tenant: &str, model: &str, replica_id: &str, timestamp_ns: i64) {
        self.publish(tenant, || {
            Self::replica_event(
                EventKind::ReplicaUpdated,
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
pub(crate) struct EventFilter {
    /// Model id, or empty.
    pub model_id: String,
    /// Tenant id, or empty.
    pub tenant_id: String,
    /// Wire event type numbers, or empty (a number no event has matches
    /// nothing, as in the reference).
    pub types: Vec<i32>,
}

impl EventFilter {
    /// True when the event passes.
    pub(crate) fn matches(&self, e: &FeedEvent) -> bool {
        (self.model_id.is_empty() || *self.model_id == *e.model)
            && (self.tenant_id.is_empty() || *self.tenant_id == *e.tenant)
            && (self.types.is_empty() || self.types.contains(&e.kind.to_wire()))
    }
}

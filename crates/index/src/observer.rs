//! Optional change observer, the source of a live event stream.
//!
//! Notifications are collected while the index holds its locks and delivered
//! after every lock is released, on the calling thread. Implementations must
//! never block (push into a bounded channel with `try_send`, drop on overflow).

use crate::types::Tier;
use std::sync::Arc;

/// Why a (prefix, replica) entry left the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RemovalReason {
    /// A `PREFIX_EVICTED` event.
    Evicted,
    /// An `ALL_CLEARED` event.
    Cleared,
    /// The TTL sweep.
    Ttl,
    /// The global entry cap.
    Cap,
    /// A tenant quota.
    Quota,
}

impl RemovalReason {
    /// Short lower-case label.
    pub fn label(self) -> &'static str {
        match self {
            Self::Evicted => "evicted",
            Self::Cleared => "cleared",
            Self::Ttl => "ttl",
            Self::Cap => "cap",
            Self::Quota => "quota",
        }
    }
}

/// One (prefix key, replica) entry that was added or removed.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixChange {
    /// Tenant.
    pub tenant: Arc<str>,
    /// Model.
    pub model: Arc<str>,
    /// Engine hash scheme.
    pub hash_scheme: Arc<str>,
    /// Adapter partition (`""` = base model).
    pub adapter: Arc<str>,
    /// Prefix hash bytes.
    pub prefix_hash: Arc<[u8]>,
    /// Replica.
    pub replica_id: Arc<str>,
    /// Entry token count at the time of the change.
    pub token_count: i32,
    /// Entry tier at the time of the change.
    pub tier: Tier,
    /// Entry last-seen time (Unix ns) at the time of the change.
    pub last_seen_ns: i64,
}

/// Receives index changes. Every method defaults to a no-op.
pub trait IndexObserver: Send + Sync {
    /// A new (prefix, replica) entry was created by ingest (refreshes are not reported).
    fn prefix_added(&self, _change: &PrefixChange) {}
    /// A (prefix, replica) entry was removed.
    fn prefix_removed(&self, _change: &PrefixChange, _reason: RemovalReason) {}
    /// An `ALL_CLEARED` event was applied for (tenant, model, replica).
    fn replica_cleared(&self, _tenant: &str, _model: &str, _replica_id: &str, _timestamp_ns: i64) {}
    /// A `REPLICA_UPDATED` event refreshed an existing stats entry.
    fn replica_updated(&self, _tenant: &str, _model: &str, _replica_id: &str, _timestamp_ns: i64) {}
}

/// Buffered notifications, delivered after locks are released.
pub(crate) enum Note {
    Added(PrefixChange),
    Removed(PrefixChange, RemovalReason),
    Cleared(Arc<str>, Arc<str>, Arc<str>, i64),
    Updated(Arc<str>, Arc<str>, Arc<str>, i64),
}

/// A notification buffer that does nothing when no observer is installed.
pub(crate) struct Notes {
    pub(crate) enabled: bool,
    pub(crate) items: Vec<Note>,
}

impl Notes {
    pub(crate) fn new(enabled: bool) -> Self {
        Self {
            enabled,
            items: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, note: impl FnOnce() -> Note) {
        if self.enabled {
            self.items.push(note());
        }
    }

    pub(crate) fn deliver(self, observer: Option<&Arc<dyn IndexObserver>>) {
        let Some(obs) = observer else { return };
        for n in self.items {
            match n {
                Note::Added(c) => obs.prefix_added(&c),
                Note::Removed(c, r) => obs.prefix_removed(&c, r),
                Note::Cleared(t, m, r, ts) => obs.replica_cleared(&t, &m, &r, ts),
                Note::Updated(t, m, r, ts) => obs.replica_updated(&t, &m, &r, ts),
            }
        }
    }
}

//! Batched writes: one call applies a run of stores and events (a
//! `ReportCacheState` window, a sidecar's eviction burst, a bus poll).
//!
//! Writes are applied in order, exactly as [`Index::ingest`] and
//! [`Index::apply_event`] would apply them, except that the budgets are
//! enforced once, at the end of the batch: the quotas of the tenants the
//! batch stored for (in order of first appearance), then the global cap.
//! Between two writes of one batch the index may therefore hold more than
//! its cap (never more than the batch added), and a victim is chosen among
//! the entries as they stand at the end, so a batch never evicts an entry
//! that a later write of the same batch refreshes or removes anyway. The
//! victim reserve is consumed in ordered chunks, one reserve lock per
//! chunk (`reserve.rs`).
//!
//! Per batch, not per write: the writer gate, the clock read, the observer
//! delivery, and for a burst of `PrefixEvicted` events of one (tenant,
//! model, replica) the resolution of their names.

use crate::events::EvictTarget;
use crate::index::Index;
use crate::observer::Notes;
use crate::sync::read;
use crate::types::{CacheEvent, CacheUpdate, EventKind, EventOutcome, IngestOutcome};

/// (tenant, model, replica) of an event.
type Names<'a> = (&'a str, &'a str, &'a str);

/// One write of a batch.
#[derive(Debug, Clone, Copy)]
pub enum BatchWrite<'a> {
    /// A `CacheStateUpdate`, as [`Index::ingest`].
    Store(&'a CacheUpdate),
    /// A `CacheEvent`, as [`Index::apply_event`].
    Event(&'a CacheEvent),
}

/// What one batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchOutcome {
    /// Stores applied.
    pub stores: u64,
    /// Events applied.
    pub events: u64,
    /// The stores' outcomes, summed; `evictions` are the end-of-batch
    /// quota and cap evictions.
    pub ingest: IngestOutcome,
    /// The events' outcomes, summed.
    pub event: EventOutcome,
    /// Position of a store refused at the replica limit: neither it nor any
    /// later write was applied (a `ReportCacheState` stream ends there).
    pub refused_at: Option<usize>,
}

/// The `PrefixEvicted` events at the start of `writes` for `names`.
fn burst_of<'w, 'a>(
    writes: &'w [BatchWrite<'a>],
    names: Names<'a>,
) -> impl Iterator<Item = &'a CacheEvent> + 'w {
    writes.iter().map_while(move |w| match w {
        BatchWrite::Event(ev)
            if ev.kind == EventKind::PrefixEvicted
                && (
                    ev.tenant_id.as_str(),
                    ev.model_id.as_str(),
                    ev.replica_id.as_str(),
                ) == names =>
        {
            Some(*ev)
        }
        _ => None,
    })
}

impl Index {
    /// Apply a batch of stores and events (module docs: in order, budgets
    /// enforced once at the end).
    pub fn apply_batch<'a>(
        &self,
        writes: impl IntoIterator<Item = BatchWrite<'a>>,
    ) -> BatchOutcome {
        let _gate = read(&self.store.gate);
        let now = self.now();
        let mut out = BatchOutcome::default();
        let mut notes = Notes::new(self.env.observer.is_some());
        let mut tenants: Vec<&'a str> = Vec::new();
        // The last PrefixEvicted's (tenant, model, replica) and its resolution.
        let mut target: Option<(Names<'a>, Option<EvictTarget>)> = None;
        // Collected so that an eviction burst can look ahead (prefetch).
        let writes: Vec<BatchWrite<'a>> = writes.into_iter().collect();
        // Writes before this position had their keys prefetched.
        let mut prefetched = 0;
        for (i, &w) in writes.iter().enumerate() {
            match w {
                BatchWrite::Store(u) => {
                    // A store may add partitions (and names) a cached target lacks.
                    target = None;
                    if !self.store_update(u, now, &mut out.ingest, &mut notes) {
                        out.refused_at = Some(i);
                        break;
                    }
                    out.stores += 1;
                    if !tenants.contains(&u.tenant_id.as_str()) {
                        tenants.push(&u.tenant_id);
                    }
                }
                BatchWrite::Event(ev) => {
                    out.events += 1;
                    if ev.kind != EventKind::PrefixEvicted {
                        self.event_write(ev, now, None, &mut out.event, &mut notes);
                        continue;
                    }
                    let names = (
                        ev.tenant_id.as_str(),
                        ev.model_id.as_str(),
                        ev.replica_id.as_str(),
                    );
                    let t = match &target {
                        Some((n, t)) if *n == names => t,
                        _ => &target.insert((names, self.evict_target(ev))).1,
                    };
                    if let Some(t) = t {
                        if i >= prefetched {
                            prefetched =
                                i + self.prefetch_evictions(t, burst_of(&writes[i..], names));
                        }
                        self.event_write(ev, now, Some(t), &mut out.event, &mut notes);
                    }
                }
            }
        }
        if out.stores > 0 {
            self.enforce_budgets(tenants, &mut out.ingest.evictions, &mut notes);
        }
        notes.deliver(self.env.observer.as_ref());
        out
    }
}

//! The replica names and order labels a lookup attaches to its scores,
//! read without the catalog's lock.
//!
//! Every ranked lookup reads one name and one label per matched replica.
//! Through the catalog that costs its read lock: an atomic add on a cache
//! line every lookup thread and every writer's replica check also writes,
//! so concurrent readers pass that line between cores on each lookup.
//! Instead the catalog publishes an immutable [`ReplicaTable`] (names and
//! labels by id) whenever either changes, and bumps an epoch that sits
//! outside its lock. A lookup thread keeps the last table it read; while
//! the epoch is unchanged it reads that one, touching no shared line but
//! the epoch itself (read only) and the name's reference count.
//!
//! Names change rarely (a replica's first report, a relabel, the sweep's
//! recycling of released ids), and a rebuild copies every name, so the
//! table is kept only up to [`MAX_TABLE`] ids; past that lookups read the
//! catalog under its lock as before.
//!
//! Why the table is never behind what a lookup matched: a writer interns a
//! replica (table published, epoch bumped) before it stores any entry with
//! the new id; a lookup that finds such an entry acquired the store's lock
//! after that store, and reads the epoch after its walk, so it sees the new
//! epoch and reloads.

use crate::catalog::Catalog;
use crate::sync::read;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The most replica ids a published table holds (a rebuild per new
/// replica copies them all: 4,096 names cost a few microseconds).
pub(crate) const MAX_TABLE: usize = 4096;

/// Replica names and order labels by id, immutable once published.
#[derive(Debug, Default)]
pub(crate) struct ReplicaTable {
    /// Shared with the answers that read them ([`crate::types::ReplicaNames`]).
    names: Arc<[Arc<str>]>,
    labels: Box<[u64]>,
}

impl ReplicaTable {
    pub(crate) fn new(names: Arc<[Arc<str>]>, labels: Box<[u64]>) -> Self {
        Self { names, labels }
    }

    /// The names by id.
    pub(crate) fn names(&self) -> &Arc<[Arc<str>]> {
        &self.names
    }
}

/// The published table's version: bumped by the catalog (under its write
/// lock) each time it publishes, read by lookups without any lock.
pub(crate) type Epoch = Arc<AtomicU64>;

/// Where a lookup reads names and labels: the published table, or the
/// catalog itself (read-locked by the caller) when there is none.
#[derive(Clone, Copy)]
pub(crate) enum Names<'a> {
    Table(&'a ReplicaTable),
    Catalog(&'a Catalog),
}

impl Names<'_> {
    /// The order label of `id` ([`crate::name_order::NameOrder::label`]).
    #[inline]
    pub(crate) fn label(self, id: u32) -> u64 {
        match self {
            Names::Table(t) => t.labels.get(id as usize).copied().unwrap_or(u64::MAX),
            Names::Catalog(c) => c.replica_label(id),
        }
    }

    /// The names of an answer ranking `ids`: the table itself (one
    /// reference count), else the ids' names from the catalog.
    pub(crate) fn for_answer(
        self,
        ids: impl IntoIterator<Item = u32>,
    ) -> crate::types::ReplicaNames {
        match self {
            Names::Table(t) => crate::types::ReplicaNames::table(t.names.clone()),
            Names::Catalog(c) => crate::types::ReplicaNames::of_ids(ids, |id| c.replica_name(id)),
        }
    }
}

thread_local! {
    /// The table this thread read last: (index uid, epoch, table).
    static LAST_TABLE: RefCell<Option<(u64, u64, Arc<ReplicaTable>)>> = const { RefCell::new(None) };
}

/// Runs `f` on the names of the index `uid`: its thread's last table when
/// `epoch` still reads the same, else the catalog's current table (which
/// the thread then keeps), else the read-locked catalog.
pub(crate) fn with_names<T, F: FnOnce(Names<'_>) -> T>(
    uid: u64,
    epoch: &AtomicU64,
    catalog: &RwLock<Catalog>,
    f: F,
) -> T {
    let now = epoch.load(Ordering::Acquire);
    // `Err(f)` hands `f` back when the thread's table is not current.
    let cached = LAST_TABLE.with(|c| match c.try_borrow() {
        Ok(c) => match c.as_ref() {
            Some((u, e, t)) if *u == uid && *e == now => Ok(f(Names::Table(t))),
            _ => Err(f),
        },
        Err(_) => Err(f),
    });
    let f = match cached {
        Ok(out) => return out,
        Err(f) => f,
    };
    let c = read(catalog);
    let Some((e, table)) = c.replica_table() else {
        return f(Names::Catalog(&c));
    };
    drop(c);
    LAST_TABLE.with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            *c = Some((uid, e, table.clone()));
        }
    });
    f(Names::Table(&table))
}

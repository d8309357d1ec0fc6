//! A set of objects keyed by `namespace/name` (prompt templates, PD
//! topologies), replaced whole by every push or file reload and read on the
//! request path without contention: readers take a shared snapshot.
//!
//! Like `/policy`, a push is replace-on-write: what it leaves out is gone.
//! The file source and the push source write the same store, so the last
//! writer wins; a deployment uses one or the other.

use crate::metrics::Metrics;
use crate::store_metrics::StoreMetrics;
use crate::watch::{FileWatcher, Reloadable};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// Where the set in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Source {
    /// Nothing loaded yet.
    #[default]
    None,
    /// A push on the control listener.
    Http,
    /// A file or directory flag.
    File,
}

impl Source {
    /// `none`, `http` or `file` (metric label and `/snapshot` value).
    pub fn label(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Http => "http",
            Self::File => "file",
        }
    }
}

/// One immutable generation of the set.
#[derive(Debug)]
pub struct NamedSet<T> {
    items: BTreeMap<String, Arc<T>>,
    source: Source,
}

impl<T> Default for NamedSet<T> {
    fn default() -> Self {
        Self {
            items: BTreeMap::new(),
            source: Source::None,
        }
    }
}

impl<T> NamedSet<T> {
    /// Builds a generation; a later duplicate `namespace/name` is refused
    /// (the error names it) so a push never silently drops an object.
    pub fn build(
        items: impl IntoIterator<Item = (String, T)>,
        source: Source,
    ) -> Result<Self, String> {
        let mut map = BTreeMap::new();
        for (key, item) in items {
            if map.insert(key.clone(), Arc::new(item)).is_some() {
                return Err(format!("{key} appears more than once"));
            }
        }
        Ok(Self { items: map, source })
    }

    /// The object at `namespace/name`.
    pub fn get(&self, key: &str) -> Option<&Arc<T>> {
        self.items.get(key)
    }

    /// Objects in key order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<T>> {
        self.items.values()
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Where it came from.
    pub fn source(&self) -> Source {
        self.source
    }
}

/// The current generation, shared. Cheap to clone.
#[derive(Debug)]
pub struct NamedStore<T> {
    current: Arc<RwLock<Arc<NamedSet<T>>>>,
}

impl<T> Clone for NamedStore<T> {
    fn clone(&self) -> Self {
        Self {
            current: Arc::clone(&self.current),
        }
    }
}

impl<T> Default for NamedStore<T> {
    fn default() -> Self {
        Self {
            current: Arc::new(RwLock::new(Arc::new(NamedSet::default()))),
        }
    }
}

impl<T> NamedStore<T> {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Puts a new generation in force.
    pub fn replace(&self, set: NamedSet<T>) {
        let set = Arc::new(set);
        match self.current.write() {
            Ok(mut g) => *g = set,
            Err(poisoned) => *poisoned.into_inner() = set,
        }
    }

    /// The generation in force.
    pub fn current(&self) -> Arc<NamedSet<T>> {
        match self.current.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// The object at `namespace/name`.
    pub fn get(&self, key: &str) -> Option<Arc<T>> {
        self.current().get(key).cloned()
    }
}

/// How one kind of named object is loaded from its file flag and recorded.
#[derive(Debug)]
pub(crate) struct FileKind<T: 'static> {
    /// Reads the file or directory.
    pub load: fn(&Path) -> Result<NamedSet<T>, String>,
    /// Log message of a load put in force.
    pub loaded: &'static str,
    /// Log message of a refused reload.
    pub reload_failed: &'static str,
    /// Records a set of `n` put in force from `source`.
    pub applied: fn(&StoreMetrics, &str, usize),
    /// Records a refused push or reload from `source`.
    pub rejected: fn(&StoreMetrics, &str),
}

/// Where a watched file's objects go.
#[derive(Debug)]
pub(crate) struct FileTarget<T: 'static> {
    kind: &'static FileKind<T>,
    store: NamedStore<T>,
    metrics: Arc<Metrics>,
}

impl<T: Send + Sync + 'static> Reloadable for FileTarget<T> {
    type Value = NamedSet<T>;

    fn load(&self, path: &Path) -> Result<Self::Value, String> {
        (self.kind.load)(path)
    }

    fn apply(&mut self, set: Self::Value) {
        tracing::info!(objects = set.len(), "{}", self.kind.loaded);
        (self.kind.applied)(&self.metrics.stores, "file", set.len());
        self.store.replace(set);
    }

    fn rejected(&mut self, path: &Path, error: &str) {
        tracing::warn!(
            path = %path.display(),
            %error,
            effect = "keeping the last good set",
            "{}",
            self.kind.reload_failed
        );
        (self.kind.rejected)(&self.metrics.stores, "file");
    }
}

/// Loads the path once (an error is returned: a server should not start on
/// a broken file) and watches it.
pub(crate) fn watch<T: Send + Sync + 'static>(
    kind: &'static FileKind<T>,
    path: PathBuf,
    store: NamedStore<T>,
    metrics: Arc<Metrics>,
) -> Result<FileWatcher<FileTarget<T>>, String> {
    FileWatcher::start(
        path,
        FileTarget {
            kind,
            store,
            metrics,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_on_write_drops_what_the_push_left_out() {
        let store = NamedStore::new();
        store.replace(
            NamedSet::build([("a/x".to_owned(), 1), ("a/y".to_owned(), 2)], Source::Http).unwrap(),
        );
        assert_eq!(store.get("a/y").as_deref(), Some(&2));
        store.replace(NamedSet::build([("a/x".to_owned(), 3)], Source::File).unwrap());
        assert_eq!(store.get("a/x").as_deref(), Some(&3));
        assert!(store.get("a/y").is_none());
        assert_eq!(store.current().source(), Source::File);
    }

    #[test]
    fn duplicates_are_refused() {
        let e = NamedSet::build([("a/x".to_owned(), 1), ("a/x".to_owned(), 2)], Source::Http)
            .unwrap_err();
        assert!(e.contains("a/x"), "{e}");
    }
}

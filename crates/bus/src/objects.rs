//! Published snapshots: a JetStream object store bucket where every replica
//! puts its newest snapshot under its own name, and from which a replica
//! with an empty state directory warms up.
//!
//! Each object's description carries the stream sequence the snapshot
//! covers (`seq=N`); the newest is the one with the highest sequence (ties:
//! the most recently modified), so a lagging replica never wins.

use crate::BusError;
use crate::config::Bus;
use async_nats::jetstream::object_store::{self, ObjectMetadata, ObjectStore};
use futures::StreamExt;
use tokio::io::AsyncReadExt;

/// The snapshot bucket of a bus.
#[derive(Clone)]
pub struct SnapshotBucket {
    store: ObjectStore,
}

impl std::fmt::Debug for SnapshotBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotBucket").finish_non_exhaustive()
    }
}

/// One published snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedSnapshot {
    /// Object name (the publishing replica).
    pub name: String,
    /// Stream sequence it covers.
    pub sequence: u64,
    /// Size in bytes.
    pub size: usize,
}

fn sequence_of(description: Option<&str>) -> u64 {
    description
        .and_then(|d| d.strip_prefix("seq="))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

impl SnapshotBucket {
    /// Opens (creating if missing) the bucket.
    pub async fn open(bus: &Bus) -> Result<SnapshotBucket, BusError> {
        let name = bus.config.snapshot_bucket();
        let store = match bus.js.get_object_store(&name).await {
            Ok(s) => s,
            Err(_) => bus
                .js
                .create_object_store(object_store::Config {
                    bucket: name,
                    description: Some("inference-cache index snapshots".into()),
                    ..Default::default()
                })
                .await
                .map_err(|e| BusError::Objects(e.to_string()))?,
        };
        Ok(SnapshotBucket { store })
    }

    /// Publishes `bytes` as `name`'s snapshot covering `sequence`.
    pub async fn put(&self, name: &str, sequence: u64, bytes: &[u8]) -> Result<(), BusError> {
        let meta = ObjectMetadata {
            name: name.to_owned(),
            description: Some(format!("seq={sequence}")),
            ..Default::default()
        };
        let mut reader = bytes;
        self.store
            .put(meta, &mut reader)
            .await
            .map_err(|e| BusError::Objects(e.to_string()))?;
        Ok(())
    }

    /// The newest published snapshot, if any.
    pub async fn newest(&self) -> Result<Option<PublishedSnapshot>, BusError> {
        let mut list = self
            .store
            .list()
            .await
            .map_err(|e| BusError::Objects(e.to_string()))?;
        let mut best: Option<(u64, i128, PublishedSnapshot)> = None;
        while let Some(info) = list.next().await {
            let info = info.map_err(|e| BusError::Objects(e.to_string()))?;
            if info.deleted {
                continue;
            }
            let seq = sequence_of(info.description.as_deref());
            let modified = info.modified.map_or(0, |t| t.unix_timestamp_nanos());
            if best
                .as_ref()
                .is_none_or(|(s, m, _)| (seq, modified) > (*s, *m))
            {
                best = Some((
                    seq,
                    modified,
                    PublishedSnapshot {
                        name: info.name.clone(),
                        sequence: seq,
                        size: info.size,
                    },
                ));
            }
        }
        Ok(best.map(|(_, _, p)| p))
    }

    /// Reads one snapshot (at most `limit` bytes).
    pub async fn get(&self, name: &str, limit: usize) -> Result<Vec<u8>, BusError> {
        let obj = self
            .store
            .get(name)
            .await
            .map_err(|e| BusError::Objects(e.to_string()))?;
        let mut out = Vec::new();
        obj.take(limit as u64)
            .read_to_end(&mut out)
            .await
            .map_err(|e| BusError::Objects(e.to_string()))?;
        Ok(out)
    }
}

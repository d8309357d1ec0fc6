//! Warm restarts: the index snapshot on disk (`--state-dir`).
//!
//! The snapshot (format in `inferencecache_index::persist`) is written
//! atomically (temporary file, fsync, rename, fsync of the directory) every
//! `--snapshot-interval` and at shutdown, and loaded at start. Entries keep
//! their ages, tiers and LFU counts; replica stats and the policy set come
//! back too (the policy only when no `--policy-file` already set one). In bus
//! mode the snapshot also records the last stream sequence applied, and the
//! consumer resumes after it.
//!
//! A snapshot that cannot be read (corrupt, truncated, a newer format) is
//! moved aside as `index.snapshot.bad` and the server starts cold: a lost
//! warm start is better than a server that does not start.

pub mod policy_json;

use crate::core::Core;
use inferencecache_index::persist::{self, SnapshotMeta};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// File name of the snapshot inside the state directory.
pub const SNAPSHOT_FILE: &str = "index.snapshot";
/// Default `--snapshot-interval`.
pub const DEFAULT_SNAPSHOT_INTERVAL: Duration = Duration::from_secs(60);
/// Largest snapshot read from a bucket (and accepted from disk).
pub const MAX_SNAPSHOT_BYTES: usize = 4 << 30;

/// `--state-dir` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSettings {
    /// Directory holding the snapshot.
    pub dir: PathBuf,
    /// Period of snapshot writes (0 = only at shutdown).
    pub interval: Duration,
}

/// What loading found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    /// The snapshot's meta (stream position, policy).
    pub meta: SnapshotMeta,
    /// Entries restored.
    pub entries: u64,
    /// Bytes read.
    pub bytes: usize,
}

/// State errors (I/O; decoding errors are handled by starting cold).
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading or writing the state directory failed.
    #[error("state dir {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Path of the snapshot file.
pub fn snapshot_path(dir: &Path) -> PathBuf {
    dir.join(SNAPSHOT_FILE)
}

/// Restores `bytes` into the (empty) index of `core`, with its policy set
/// unless one is already in force. `None` (logged) when they do not decode.
pub fn restore(core: &Core, bytes: &[u8], source: &str) -> Option<Restored> {
    let started = Instant::now();
    match persist::decode_into(bytes, &core.index) {
        Ok((meta, out)) => {
            if !meta.policy_json.is_empty() && core.policies.version() == 0 {
                match crate::policy::decode_policy_json(&meta.policy_json) {
                    Ok(set) => core.policies.replace(set),
                    Err(e) => tracing::warn!(error = %e, "state_policy_not_restored"),
                }
            }
            let age_s = (inferencecache_index::SystemClock.now_ns() - meta.created_ns) as f64 / 1e9;
            tracing::info!(
                source,
                entries = out.entries,
                keys = out.keys,
                stats = out.stats,
                bytes = bytes.len(),
                last_sequence = meta.last_sequence,
                snapshot_age_s = age_s,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "state_restored"
            );
            Some(Restored {
                meta,
                entries: out.entries,
                bytes: bytes.len(),
            })
        }
        Err(e) => {
            tracing::error!(source, error = %e, "state_snapshot_unreadable; starting cold");
            None
        }
    }
}

use inferencecache_index::Clock as _;

/// Loads `dir`'s snapshot into `core`. A missing file is a cold start; an
/// unreadable one is moved aside.
pub fn load(core: &Core, dir: &Path) -> Result<Option<Restored>, StateError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let path = snapshot_path(dir);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(dir = %dir.display(), "state_dir_empty; cold start");
            return Ok(None);
        }
        Err(e) => return Err(io(&path)(e)),
    };
    let restored = restore(core, &bytes, "file");
    if restored.is_none() {
        let bad = path.with_extension("snapshot.bad");
        if let Err(e) = std::fs::rename(&path, &bad) {
            tracing::warn!(error = %e, "state_snapshot_move_aside_failed");
        }
    }
    Ok(restored)
}

/// Encodes the index now (state as of at least `last_sequence`).
pub fn encode(core: &Core, last_sequence: u64, stream: &str) -> Vec<u8> {
    let meta = SnapshotMeta {
        created_ns: inferencecache_index::SystemClock.now_ns(),
        last_sequence,
        stream: stream.to_owned(),
        policy_json: policy_json::encode(&core.policies.current()),
    };
    persist::encode_index(&core.index, &meta)
}

/// Writes `bytes` as `dir`'s snapshot, atomically.
pub fn write_atomic(dir: &Path, bytes: &[u8]) -> Result<(), StateError> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let path = snapshot_path(dir);
    let tmp = path.with_extension("snapshot.tmp");
    {
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    std::fs::rename(&tmp, &path).map_err(io(&path))?;
    // The rename is durable once the directory entry is.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Encodes and writes one snapshot; returns what it wrote.
pub fn save(
    core: &Core,
    dir: &Path,
    last_sequence: u64,
    stream: &str,
) -> Result<Vec<u8>, StateError> {
    let started = Instant::now();
    let bytes = encode(core, last_sequence, stream);
    write_atomic(dir, &bytes)?;
    tracing::info!(
        bytes = bytes.len(),
        entries = core.index.total_entries(),
        last_sequence,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "state_snapshot_written"
    );
    Ok(bytes)
}

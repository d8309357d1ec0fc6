//! Reload-on-change for configuration files and directories (`--policy-file`,
//! `--templates-dir`, `--pd-topology-file`).
//!
//! The path is polled: a change of any file's modification time or size (or,
//! for a directory, of its listing) triggers a reload. Polling works on every
//! filesystem, including Kubernetes ConfigMap volumes whose files are swapped
//! through symlinks, where inotify-style watches miss the update. A reload
//! that fails keeps the last good value in force; the target logs and counts
//! the refusal.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// What a watcher loads and where it applies it.
pub trait Reloadable: Send + 'static {
    /// The decoded content.
    type Value;
    /// Reads and decodes the path; the error names the path and the reason.
    fn load(&self, path: &Path) -> Result<Self::Value, String>;
    /// Puts a freshly loaded value in force.
    fn apply(&mut self, value: Self::Value);
    /// Records a reload that failed (the last good value stays in force).
    fn rejected(&mut self, path: &Path, error: &str);
}

/// Modification time and size of one file.
type FileStamp = (SystemTime, u64);

/// What a poll compares: the file's stamp, or a directory's sorted listing.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Stamp {
    File(FileStamp),
    Dir(Vec<(std::ffi::OsString, FileStamp)>),
}

fn file_stamp(path: &Path) -> Option<FileStamp> {
    // `metadata` follows symlinks: a ConfigMap's `..data` swap changes it.
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

fn stamp(path: &Path) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    if !m.is_dir() {
        return file_stamp(path).map(Stamp::File);
    }
    let mut entries: Vec<_> = std::fs::read_dir(path)
        .ok()?
        .flatten()
        .filter_map(|e| Some((e.file_name(), file_stamp(&e.path())?)))
        .collect();
    entries.sort();
    Some(Stamp::Dir(entries))
}

/// Polls a path and applies its content to a target when it changes.
#[derive(Debug)]
pub struct FileWatcher<R> {
    path: PathBuf,
    target: R,
    seen: Option<Stamp>,
}

impl<R: Reloadable> FileWatcher<R> {
    /// Loads the path once and applies it. An error here is returned: a
    /// server should not start on a broken file.
    pub fn start(path: PathBuf, mut target: R) -> Result<Self, String> {
        let seen = stamp(&path);
        let value = target.load(&path)?;
        target.apply(value);
        Ok(Self { path, target, seen })
    }

    /// The watched path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Forgets the last stamp so the next poll reloads (tests; coarse mtime
    /// granularity can hide a quick rewrite).
    pub fn forget(&mut self) {
        self.seen = None;
    }

    /// One poll: reloads if the path changed.
    pub fn poll(&mut self) {
        let now = stamp(&self.path);
        if now == self.seen {
            return;
        }
        self.seen = now;
        match self.target.load(&self.path) {
            Ok(value) => self.target.apply(value),
            Err(error) => self.target.rejected(&self.path, &error),
        }
    }

    /// Polls every `interval` until `cancel` fires.
    pub async fn run(mut self, interval: Duration, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = cancel.cancelled() => return,
                _ = tick.tick() => self.poll(),
            }
        }
    }
}

/// Reads a file of at most `limit` bytes; the error names the path.
pub(crate) fn read_limited(path: &Path, limit: usize) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    if bytes.len() > limit {
        return Err(format!(
            "{} is {} bytes; the limit is {limit}",
            path.display(),
            bytes.len()
        ));
    }
    Ok(bytes)
}

/// True for a `.json` file name (parsed as JSON; anything else as YAML).
pub(crate) fn is_json(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// Decodes a YAML-or-JSON document by the file's extension.
pub(crate) fn decode_yaml_or_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    bytes: &[u8],
) -> Result<T, String> {
    if is_json(path) {
        return serde_json::from_slice(bytes).map_err(|e| format!("{}: {e}", path.display()));
    }
    let text =
        std::str::from_utf8(bytes).map_err(|e| format!("{}: not UTF-8: {e}", path.display()))?;
    serde_saphyr::from_str(text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lines {
        applied: Vec<String>,
        rejected: usize,
    }

    impl Reloadable for Lines {
        type Value = String;
        fn load(&self, path: &Path) -> Result<String, String> {
            let s = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
            if s.starts_with("bad") {
                return Err("bad".into());
            }
            Ok(s)
        }
        fn apply(&mut self, v: String) {
            self.applied.push(v);
        }
        fn rejected(&mut self, _: &Path, _: &str) {
            self.rejected += 1;
        }
    }

    #[test]
    fn reloads_on_change_only_and_keeps_the_last_good_value() {
        let dir = std::env::temp_dir().join(format!("ic-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        std::fs::write(&p, "one").unwrap();
        let mut w = FileWatcher::start(
            p.clone(),
            Lines {
                applied: vec![],
                rejected: 0,
            },
        )
        .unwrap();
        w.poll();
        assert_eq!(w.target.applied, ["one"], "unchanged: no reload");
        std::fs::write(&p, "bad edit").unwrap();
        w.forget();
        w.poll();
        assert_eq!(w.target.rejected, 1);
        std::fs::write(&p, "two").unwrap();
        w.forget();
        w.poll();
        assert_eq!(w.target.applied, ["one", "two"]);
    }

    #[test]
    fn a_directory_changes_when_a_file_is_added() {
        let dir = std::env::temp_dir().join(format!("ic-watch-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let before = stamp(&dir);
        std::fs::write(dir.join(format!("n{}", std::process::id())), "x").unwrap();
        assert_ne!(stamp(&dir), before);
    }
}

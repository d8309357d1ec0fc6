//! `--policy-file`: the `/policy` schema from a YAML or JSON file, for a
//! server that runs without the Kubernetes controller. The file is polled and
//! reloaded when it changes; a bad edit keeps the last good policy, logs why
//! and counts it.

use super::resolved::PolicySet;
use super::store::PolicyStore;
use super::wire::{MAX_POLICY_BODY_BYTES, PolicySnapshot, decode_policy_json, into_policy_set};
use crate::metrics::Metrics;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// Reads and decodes a policy file. `.json` is parsed as JSON, anything else
/// as YAML (a superset of JSON); both reject unknown fields.
pub fn load_policy_file(path: &Path) -> Result<PolicySet, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    if bytes.len() > MAX_POLICY_BODY_BYTES {
        return Err(format!(
            "{} is {} bytes; the limit is {MAX_POLICY_BODY_BYTES}",
            path.display(),
            bytes.len()
        ));
    }
    let is_json = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    if is_json {
        return decode_policy_json(&bytes).map_err(|e| format!("{}: {e}", path.display()));
    }
    let text =
        std::str::from_utf8(&bytes).map_err(|e| format!("{}: not UTF-8: {e}", path.display()))?;
    let snapshot: PolicySnapshot = serde_saphyr::from_str(text)
        .map_err(|e| format!("{}: decode policy snapshot: {e}", path.display()))?;
    into_policy_set(snapshot).map_err(|e| format!("{}: {e}", path.display()))
}

/// Polls a policy file and applies it to the store when it changes.
#[derive(Debug)]
pub struct PolicyFileWatcher {
    path: PathBuf,
    store: PolicyStore,
    metrics: Arc<Metrics>,
    seen: Option<(SystemTime, u64)>,
}

impl PolicyFileWatcher {
    /// Loads the file once (an error here is returned: a server should not
    /// start on a broken policy file) and applies it.
    pub fn start(path: PathBuf, store: PolicyStore, metrics: Arc<Metrics>) -> Result<Self, String> {
        let mut w = Self {
            seen: stamp(&path),
            path,
            store,
            metrics,
        };
        let set = load_policy_file(&w.path)?;
        w.apply(set);
        Ok(w)
    }

    fn apply(&mut self, set: PolicySet) {
        tracing::info!(
            policy_file = %self.path.display(),
            version = set.version,
            policies = set.policies.len(),
            tenants = set.quotas.len(),
            "policy_file_loaded"
        );
        self.metrics.policy_applied("file", set.version);
        self.store.replace(set);
    }

    /// One poll: reloads if the file's modification time or size changed.
    pub fn poll(&mut self) {
        let now = stamp(&self.path);
        if now == self.seen {
            return;
        }
        self.seen = now;
        match load_policy_file(&self.path) {
            Ok(set) => self.apply(set),
            Err(error) => {
                tracing::warn!(
                    policy_file = %self.path.display(),
                    %error,
                    effect = "keeping the last good policy",
                    "policy_file_reload_failed"
                );
                self.metrics.policy_rejected("file");
            }
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

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ic-policy-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn yaml_and_json_files_decode_alike() {
        let y = temp(
            "p.yaml",
            "version: 7\npolicies:\n  - namespace: a\n    minimumPrefixTokens: 32\n    eviction: lfu\ntenants:\n  - tenantID: a\n    maxIndexEntries: 9\n",
        );
        let j = temp(
            "p.json",
            r#"{"version":7,"policies":[{"namespace":"a","minimumPrefixTokens":32,"eviction":"lfu"}],"tenants":[{"tenantID":"a","maxIndexEntries":9}]}"#,
        );
        assert_eq!(load_policy_file(&y).unwrap(), load_policy_file(&j).unwrap());
    }

    #[test]
    fn unknown_yaml_field_is_refused_with_the_path() {
        let y = temp(
            "bad.yaml",
            "version: 7\npolicies:\n  - namespace: a\n    bogus: 1\n",
        );
        let e = load_policy_file(&y).unwrap_err();
        assert!(e.contains("bad.yaml") && e.contains("bogus"), "{e}");
    }

    #[test]
    fn bad_edit_keeps_the_last_good_policy() {
        let p = temp(
            "live.yaml",
            "version: 7\npolicies:\n  - namespace: a\n    minimumPrefixTokens: 5\n",
        );
        let store = PolicyStore::new();
        let metrics = Arc::new(Metrics::new());
        let mut w =
            PolicyFileWatcher::start(p.clone(), store.clone(), Arc::clone(&metrics)).unwrap();
        assert_eq!(store.policy("a").minimum_prefix_tokens, 5);

        std::fs::write(&p, "version: 99\n").unwrap();
        w.seen = None; // mtime granularity can hide a quick rewrite
        w.poll();
        assert_eq!(store.policy("a").minimum_prefix_tokens, 5, "last good kept");
        assert!(metrics.encode_text().contains(
            "inferencecache_policy_updates_total{source=\"file\",result=\"rejected\"} 1"
        ));

        std::fs::write(
            &p,
            "version: 7\npolicies:\n  - namespace: a\n    minimumPrefixTokens: 6\n",
        )
        .unwrap();
        w.seen = None;
        w.poll();
        assert_eq!(store.policy("a").minimum_prefix_tokens, 6);
    }
}

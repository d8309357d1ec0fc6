//! `--policy-file`: the `/policy` schema from a YAML or JSON file, for a
//! server that runs without the Kubernetes controller. The file is polled and
//! reloaded when it changes; a bad edit keeps the last good policy, logs why
//! and counts it.

use super::resolved::PolicySet;
use super::store::PolicyStore;
use super::wire::{MAX_POLICY_BODY_BYTES, PolicySnapshot, decode_policy_json, into_policy_set};
use crate::metrics::Metrics;
use crate::watch::{FileWatcher, Reloadable, is_json, read_limited};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Reads and decodes a policy file. `.json` is parsed as JSON, anything else
/// as YAML (a superset of JSON); both reject unknown fields.
pub fn load_policy_file(path: &Path) -> Result<PolicySet, String> {
    let bytes = read_limited(path, MAX_POLICY_BODY_BYTES)?;
    if is_json(path) {
        return decode_policy_json(&bytes).map_err(|e| format!("{}: {e}", path.display()));
    }
    let text =
        std::str::from_utf8(&bytes).map_err(|e| format!("{}: not UTF-8: {e}", path.display()))?;
    let snapshot: PolicySnapshot = serde_saphyr::from_str(text)
        .map_err(|e| format!("{}: decode policy snapshot: {e}", path.display()))?;
    into_policy_set(snapshot).map_err(|e| format!("{}: {e}", path.display()))
}

/// Where a policy file's content goes.
#[derive(Debug)]
pub struct PolicyTarget {
    path: PathBuf,
    store: PolicyStore,
    metrics: Arc<Metrics>,
}

impl Reloadable for PolicyTarget {
    type Value = PolicySet;

    fn load(&self, path: &Path) -> Result<PolicySet, String> {
        load_policy_file(path)
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

    fn rejected(&mut self, path: &Path, error: &str) {
        tracing::warn!(
            policy_file = %path.display(),
            %error,
            effect = "keeping the last good policy",
            "policy_file_reload_failed"
        );
        self.metrics.policy_rejected("file");
    }
}

/// Polls a policy file and applies it to the store when it changes.
pub type PolicyFileWatcher = FileWatcher<PolicyTarget>;

/// Loads the policy file once (an error here is returned: a server should
/// not start on a broken policy file) and watches it.
pub fn watch_policy_file(
    path: PathBuf,
    store: PolicyStore,
    metrics: Arc<Metrics>,
) -> Result<PolicyFileWatcher, String> {
    let target = PolicyTarget {
        path: path.clone(),
        store,
        metrics,
    };
    FileWatcher::start(path, target)
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
        let mut w = watch_policy_file(p.clone(), store.clone(), Arc::clone(&metrics)).unwrap();
        assert_eq!(store.policy("a").minimum_prefix_tokens, 5);

        std::fs::write(&p, "version: 99\n").unwrap();
        w.forget(); // mtime granularity can hide a quick rewrite
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
        w.forget();
        w.poll();
        assert_eq!(store.policy("a").minimum_prefix_tokens, 6);
    }
}

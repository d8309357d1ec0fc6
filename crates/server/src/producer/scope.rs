//! Which tenants a producer may write: its own namespace, plus what a grant
//! adds. Grants come from `--producer-tenants-file` (plain hosts; on
//! Kubernetes the operator is meant to push them from CacheTenant objects,
//! see docs/security.md).
//!
//! The file maps an identity (a namespace, a CN, or a full subject such as
//! `system:serviceaccount:ops:aggregator`) to the extra tenants it may write,
//! in YAML or JSON:
//!
//! ```yaml
//! team-a: [shared-chat]
//! "system:serviceaccount:ops:aggregator": [team-a, team-b]
//! ```

use super::identity::Principal;
use std::collections::{HashMap, HashSet};
use std::path::Path;

/// Largest accepted grants file.
pub const MAX_GRANTS_FILE_BYTES: usize = 1 << 20;

/// Identity → extra tenants.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantGrants {
    extra: HashMap<String, HashSet<String>>,
}

impl TenantGrants {
    /// Grants from `(identity, tenants)` pairs.
    pub fn new<I, T>(grants: I) -> Self
    where
        I: IntoIterator<Item = (String, T)>,
        T: IntoIterator<Item = String>,
    {
        Self {
            extra: grants
                .into_iter()
                .map(|(who, tenants)| (who, tenants.into_iter().collect()))
                .collect(),
        }
    }

    /// Reads a grants file (YAML or JSON; `.json` is parsed as JSON).
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("read {}: {e}", path.display()))?;
        if bytes.len() > MAX_GRANTS_FILE_BYTES {
            return Err(format!(
                "{} is {} bytes; the limit is {MAX_GRANTS_FILE_BYTES}",
                path.display(),
                bytes.len()
            ));
        }
        let is_json = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        let map: HashMap<String, Vec<String>> = if is_json {
            serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))?
        } else {
            let text = std::str::from_utf8(&bytes)
                .map_err(|e| format!("{}: not UTF-8: {e}", path.display()))?;
            if text.trim().is_empty() {
                HashMap::new()
            } else {
                serde_saphyr::from_str(text).map_err(|e| {
                    format!(
                        "{}: expected a mapping of identity to a list of tenants: {e}",
                        path.display()
                    )
                })?
            }
        };
        Ok(Self::new(map))
    }

    /// Whether `who` may write `tenant`: its own namespace, or a grant to
    /// its identity or its full subject.
    pub fn entitled(&self, who: &Principal, tenant: &str) -> bool {
        if tenant == who.identity {
            return true;
        }
        [&who.identity, &who.subject].into_iter().any(|k| {
            self.extra
                .get(k.as_str())
                .is_some_and(|t| t.contains(tenant))
        })
    }

    /// Number of identities with grants.
    pub fn len(&self) -> usize {
        self.extra.len()
    }

    /// True without any grant.
    pub fn is_empty(&self) -> bool {
        self.extra.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(identity: &str, subject: &str) -> Principal {
        Principal {
            identity: identity.into(),
            subject: subject.into(),
        }
    }

    #[test]
    fn own_namespace_and_grants_only() {
        let g = TenantGrants::new([
            ("team-a".to_owned(), vec!["shared".to_owned()]),
            (
                "system:serviceaccount:ops:agg".to_owned(),
                vec!["team-b".to_owned()],
            ),
        ]);
        let a = who("team-a", "system:serviceaccount:team-a:sidecar");
        assert!(g.entitled(&a, "team-a"));
        assert!(g.entitled(&a, "shared"));
        assert!(!g.entitled(&a, "team-b"));
        assert!(!g.entitled(&a, ""));
        let agg = who("ops", "system:serviceaccount:ops:agg");
        assert!(g.entitled(&agg, "team-b"));
        assert!(!g.entitled(&agg, "shared"));
        let other_ops = who("ops", "system:serviceaccount:ops:other");
        assert!(!g.entitled(&other_ops, "team-b"), "grant is per subject");
    }

    #[test]
    fn files_in_yaml_and_json() {
        let dir = std::env::temp_dir().join(format!("ic-grants-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_default();
        let yaml = dir.join("g.yaml");
        std::fs::write(&yaml, "team-a: [shared]\nteam-b:\n  - x\n  - y\n").unwrap_or_default();
        let json = dir.join("g.json");
        std::fs::write(&json, r#"{"team-a":["shared"],"team-b":["x","y"]}"#).unwrap_or_default();
        let y = TenantGrants::load(&yaml);
        let j = TenantGrants::load(&json);
        assert_eq!(y, j);
        assert_eq!(y.as_ref().map(TenantGrants::len).ok(), Some(2));
        let bad = dir.join("bad.yaml");
        std::fs::write(&bad, "team-a: shared\n").unwrap_or_default();
        assert!(TenantGrants::load(&bad).is_err());
        assert!(TenantGrants::load(&dir.join("missing.yaml")).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

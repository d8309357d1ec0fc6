//! The policy store: one atomically replaced [`PolicySet`], read on every
//! lookup without contention.

use super::resolved::{EvictionAlgorithm, PolicySet, TenantPolicy};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// Tenant reserved for the `/probe` self-test: never quota'd.
use crate::reserved_tenant::is_reserved;

/// Holds the current policy set. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct PolicyStore {
    current: Arc<RwLock<Arc<PolicySet>>>,
}

impl PolicyStore {
    /// An empty store: every tenant gets the defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces policies and quotas together (replace-on-write).
    pub fn replace(&self, set: PolicySet) {
        let set = Arc::new(set);
        match self.current.write() {
            Ok(mut g) => *g = set,
            Err(poisoned) => *poisoned.into_inner() = set,
        }
    }

    /// The current set (a shared snapshot).
    pub fn current(&self) -> Arc<PolicySet> {
        match self.current.read() {
            Ok(g) => Arc::clone(&g),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// The effective policy of a tenant (defaults when none was pushed).
    pub fn policy(&self, tenant: &str) -> TenantPolicy {
        let read = |set: &PolicySet| set.policies.get(tenant).copied().unwrap_or_default();
        match self.current.read() {
            Ok(g) => read(&g),
            Err(poisoned) => read(&poisoned.into_inner()),
        }
    }

    /// Index TTL for a tenant, if its policy sets one.
    pub fn ttl(&self, tenant: &str) -> Option<Duration> {
        self.policy(tenant).eviction_ttl
    }

    /// Cap victim order for a tenant.
    pub fn eviction(&self, tenant: &str) -> EvictionAlgorithm {
        self.policy(tenant).eviction
    }

    /// Distinct-prefix budget for a tenant; `None` = unbounded. The probe
    /// tenant is always unbounded.
    pub fn quota(&self, tenant: &str) -> Option<i64> {
        if is_reserved(tenant) {
            return None;
        }
        self.current().quotas.get(tenant).copied()
    }

    /// Version of the last applied push (0 before the first).
    pub fn version(&self) -> i64 {
        self.current().version
    }
}

/// The index reads TTL, eviction order and quotas through this.
impl inferencecache_index::PolicyResolver for PolicyStore {
    fn ttl(&self, tenant: &str) -> Option<Duration> {
        PolicyStore::ttl(self, tenant)
    }

    fn eviction_algorithm(&self, tenant: &str) -> EvictionAlgorithm {
        self.eviction(tenant)
    }

    fn tenant_quota(&self, tenant: &str) -> Option<i64> {
        self.quota(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::decode_policy_json;
    use crate::reserved_tenant::PROBE_TENANT;

    #[test]
    fn empty_store_serves_defaults() {
        let s = PolicyStore::new();
        let p = s.policy("anyone");
        assert_eq!(p, TenantPolicy::default());
        assert_eq!(p.minimum_matched_tokens, 64);
        assert_eq!(s.quota("anyone"), None);
        assert_eq!(s.ttl("anyone"), None);
        assert_eq!(s.version(), 0);
    }

    #[test]
    fn replace_swaps_policies_and_quotas_together_and_absent_reverts() {
        let s = PolicyStore::new();
        s.replace(
            decode_policy_json(
                br#"{"version":7,"policies":[{"namespace":"a","eviction":"lfu"}],"tenants":[{"tenantID":"a","maxIndexEntries":5}]}"#,
            )
            .unwrap(),
        );
        assert_eq!(s.eviction("a"), EvictionAlgorithm::Lfu);
        assert_eq!(s.quota("a"), Some(5));
        s.replace(decode_policy_json(br#"{"version":7,"policies":[]}"#).unwrap());
        assert_eq!(s.eviction("a"), EvictionAlgorithm::Lru);
        assert_eq!(s.quota("a"), None);
        assert_eq!(s.policy("a"), TenantPolicy::default());
    }

    #[test]
    fn probe_tenant_is_exempt_from_quota() {
        let s = PolicyStore::new();
        s.replace(
            decode_policy_json(
                br#"{"version":7,"tenants":[{"tenantID":"inferencecache.io/probe","maxIndexEntries":0}]}"#,
            )
            .unwrap(),
        );
        assert_eq!(s.quota(PROBE_TENANT), None);
    }

    #[test]
    fn concurrent_readers_see_whole_sets() {
        let s = PolicyStore::new();
        let a = decode_policy_json(
            br#"{"version":7,"policies":[{"namespace":"t","minimumPrefixTokens":1,"lookupTimeoutMs":1}]}"#,
        )
        .unwrap();
        let b = decode_policy_json(
            br#"{"version":7,"policies":[{"namespace":"t","minimumPrefixTokens":2,"lookupTimeoutMs":2}]}"#,
        )
        .unwrap();
        std::thread::scope(|scope| {
            let writer = s.clone();
            scope.spawn(move || {
                for i in 0..2000 {
                    writer.replace(if i % 2 == 0 { a.clone() } else { b.clone() });
                }
            });
            for _ in 0..2 {
                let reader = s.clone();
                scope.spawn(move || {
                    for _ in 0..2000 {
                        let p = reader.policy("t");
                        let ms = p.lookup_timeout.map_or(0, |d| d.as_millis() as i32);
                        assert!(
                            p.minimum_prefix_tokens == 0 && ms == 0
                                || p.minimum_prefix_tokens == ms,
                            "torn policy {p:?}"
                        );
                    }
                });
            }
        });
    }
}

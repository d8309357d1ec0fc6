//! Miss classifier (§2.6.6) and presence helpers.

use crate::index::Index;
use crate::sync::read;
use crate::types::Strategy;

impl Index {
    /// Classify a miss: globally empty index → `None` (cold start, reserved
    /// tenants included); tenant has no prefixes → `UnknownTenant`; (tenant,
    /// model) has none → `UnknownModel`; no replica serves (tenant, model,
    /// scheme) → `UnknownHashScheme`; else `None`. Adapter-blind.
    pub fn classify_miss(&self, tenant: &str, model: &str, scheme: &str) -> Strategy {
        let (t, tm, scope) = {
            let c = read(&self.store.catalog);
            (
                c.find_tenant(tenant),
                c.find_tm(tenant, model),
                c.find_scope(tenant, model, scheme),
            )
        };
        let c = read(&self.store.counters);
        if c.total_keys == 0 {
            return Strategy::None;
        }
        if t.is_none_or(|t| c.tenant_keys(t) == 0) {
            return Strategy::UnknownTenant;
        }
        if tm.is_none_or(|tm| c.tm_keys(tm) == 0) {
            return Strategy::UnknownModel;
        }
        if scope.is_none_or(|s| c.scope_len(s) == 0) {
            return Strategy::UnknownHashScheme;
        }
        Strategy::None
    }

    /// The tenant holds at least one prefix.
    pub fn has_any_for_tenant(&self, tenant: &str) -> bool {
        let t = read(&self.store.catalog).find_tenant(tenant);
        t.is_some_and(|t| read(&self.store.counters).tenant_keys(t) > 0)
    }

    /// (tenant, model) holds at least one prefix.
    pub fn has_any_for_tenant_model(&self, tenant: &str, model: &str) -> bool {
        let tm = read(&self.store.catalog).find_tm(tenant, model);
        tm.is_some_and(|tm| read(&self.store.counters).tm_keys(tm) > 0)
    }

    /// At least one replica serves (tenant, model, scheme).
    pub fn has_any_for_tenant_model_scheme(&self, tenant: &str, model: &str, scheme: &str) -> bool {
        let s = read(&self.store.catalog).find_scope(tenant, model, scheme);
        s.is_some_and(|s| read(&self.store.counters).scope_len(s) > 0)
    }
}

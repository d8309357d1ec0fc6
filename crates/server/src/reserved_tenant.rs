//! The one reserved tenant, `inferencecache.io/probe`: the `/probe`
//! self-test writes and reads it inside the index, and nothing on the wire
//! may. Every path asks [`is_reserved`] (reports and events are acknowledged
//! and dropped, lookups answer `NO_HINT`, `GetCacheState` is empty, the
//! policy store has no quota for it, the live feed does not show it), and
//! the index is built with [`RESERVED_TENANTS`] so its own counts leave it
//! out too.

pub(crate) use inferencecache_control_api::PROBE_TENANT;

/// Tenants the index keeps out of its per-tenant counts and quotas.
pub(crate) const RESERVED_TENANTS: [&str; 1] = [PROBE_TENANT];

/// True for a tenant that wire traffic may not read or write.
pub(crate) fn is_reserved(tenant: &str) -> bool {
    tenant == PROBE_TENANT
}

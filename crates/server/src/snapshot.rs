//! `/snapshot` JSON (`server.md` §5.1, decision 5): the controller's view of
//! every replica and tenant. The reference's key set is frozen (issue 15 adds
//! `templates` and `pdTopologies`, which Go decoders ignore); Go's encoding rules are
//! reproduced (float32 shortest form, RFC 3339 times with trimmed fractions,
//! the zero-time sentinel, omitted false/zero optional fields), except that
//! empty lists are `[]`, not `null`.

use crate::named::NamedSet;
use crate::pd::Topology;
use crate::templates::CompiledTemplate;
pub use inferencecache_control_api::snapshot::{
    GoF32, LoadJson, PdTopologyRow, ReplicaJson, SnapshotJson, TemplateRow, TenantJson, ZERO_TIME,
    rfc3339_nano,
};
use inferencecache_index::{Snapshot, SnapshotReplica, SnapshotTenant};

fn replica(r: &SnapshotReplica) -> ReplicaJson {
    ReplicaJson {
        replica_id: r.replica_id.to_string(),
        tenant: r.tenant.to_string(),
        cache_memory_bytes: r.cache_memory_bytes,
        hit_rate: GoF32(r.hit_rate),
        pressure: GoF32(r.pressure),
        last_update: rfc3339_nano(r.last_update_ns),
        prefix_count: r.prefix_count,
        last_event_at: rfc3339_nano(r.last_event_at_ns),
        stats_reported: r.stats_reported,
        t2_hit_tokens: r.t2_hit_tokens,
        t2_query_tokens: r.t2_query_tokens,
        client_version: r.client_version.to_string(),
        tentative_count: r.tentative_count,
        load: r.load.map(|l| LoadJson {
            running_requests: l.running_requests,
            waiting_requests: l.waiting_requests,
            kv_cache_usage: GoF32(l.kv_cache_usage),
            kv_cache_capacity_tokens: l.kv_cache_capacity_tokens,
        }),
    }
}

fn tenant(t: &SnapshotTenant) -> TenantJson {
    TenantJson {
        tenant_id: t.tenant_id.to_string(),
        index_entries: t.index_entries,
        hit_rate: GoF32(t.hit_rate),
        hit_rate_reported: t.hit_rate_reported,
        memory_used: t.memory_used,
    }
}

/// The `/snapshot` body for an index snapshot.
pub fn snapshot_json(s: &Snapshot) -> SnapshotJson {
    SnapshotJson {
        replicas: s.replicas.iter().map(replica).collect(),
        tenants: s.tenants.iter().map(tenant).collect(),
        total_prefixes: s.total_prefixes,
        hot_prefixes: s.hot_prefixes,
        tentative_entries: s.tentative_entries,
        templates: Vec::new(),
        pd_topologies: Vec::new(),
        producers: Vec::new(),
    }
}

/// Adds the template and topology stores (names and revisions) to a
/// `/snapshot` body: the additive `templates` and `pdTopologies` keys.
pub fn with_stores(
    mut body: SnapshotJson,
    templates: &NamedSet<CompiledTemplate>,
    pd: &NamedSet<Topology>,
) -> SnapshotJson {
    body.templates = templates
        .iter()
        .map(|t| TemplateRow {
            namespace: t.namespace().to_owned(),
            name: t.name().to_owned(),
            revision: t.revision().to_owned(),
        })
        .collect();
    body.pd_topologies = pd
        .iter()
        .map(|t| PdTopologyRow {
            namespace: t.namespace.clone(),
            name: t.name.clone(),
            transport: t.transport.clone(),
            prefill_replicas: t.prefill.clone(),
            decode_replicas: t.decode.clone(),
        })
        .collect();
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_snapshot_uses_arrays() {
        let j = serde_json::to_string(&snapshot_json(&Snapshot::default())).unwrap();
        assert_eq!(
            j,
            r#"{"replicas":[],"tenants":[],"totalPrefixes":0,"hotPrefixes":0,"templates":[],"pdTopologies":[]}"#
        );
    }

    #[test]
    fn times_are_go_rfc3339_nano() {
        assert_eq!(rfc3339_nano(None), ZERO_TIME);
        assert_eq!(rfc3339_nano(Some(0)), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_nano(Some(1_500_000_000)), "1970-01-01T00:00:01.5Z");
        // 2026-12-02T10:00:00.000000123Z
        assert_eq!(
            rfc3339_nano(Some(1_796_205_600_000_000_123)),
            "2026-12-02T10:00:00.000000123Z"
        );
        assert_eq!(
            rfc3339_nano(Some(951_782_400 * 1_000_000_000)),
            "2000-02-29T00:00:00Z"
        );
    }

    #[test]
    fn float32_like_go() {
        let s = |v| serde_json::to_string(&GoF32(v)).unwrap();
        assert_eq!(s(1.0), "1");
        assert_eq!(s(0.0), "0");
        assert_eq!(s(0.1), "0.1");
        assert_eq!(s(0.25), "0.25");
        assert_eq!(s(f32::NAN), "0");
    }

    #[test]
    fn optional_keys_are_omitted_and_the_key_set_is_frozen() {
        let snap = Snapshot {
            replicas: vec![SnapshotReplica {
                replica_id: "r".into(),
                ..Default::default()
            }],
            tenants: vec![SnapshotTenant::default()],
            total_prefixes: 0,
            hot_prefixes: 0,
            ..Default::default()
        };
        let v = serde_json::to_value(snapshot_json(&snap)).unwrap();
        let keys = |o: &serde_json::Value| {
            let mut k: Vec<String> = o.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        assert_eq!(
            keys(&v["replicas"][0]),
            [
                "cacheMemoryBytes",
                "hitRate",
                "lastEventAt",
                "lastUpdate",
                "prefixCount",
                "pressure",
                "replicaId"
            ]
        );
        assert_eq!(v["replicas"][0]["lastEventAt"], ZERO_TIME);
        assert_eq!(
            keys(&v["tenants"][0]),
            ["hitRate", "indexEntries", "memoryUsed", "tenantId"]
        );
        assert_eq!(
            keys(&v),
            [
                "hotPrefixes",
                "pdTopologies",
                "replicas",
                "templates",
                "tenants",
                "totalPrefixes"
            ]
        );
    }
}

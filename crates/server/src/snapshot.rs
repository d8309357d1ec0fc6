//! `/snapshot` JSON (`server.md` §5.1, decision 5): the controller's view of
//! every replica and tenant. The key set is frozen; Go's encoding rules are
//! reproduced (float32 shortest form, RFC 3339 times with trimmed fractions,
//! the zero-time sentinel, omitted false/zero optional fields), except that
//! empty lists are `[]`, not `null`.

use inferencecache_index::{Snapshot, SnapshotReplica, SnapshotTenant};
use serde::{Serialize, Serializer};

/// Go's zero `time.Time` in RFC 3339.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// A float32 encoded like Go's `encoding/json`: integral values without a
/// fractional part, others in shortest round-trip form.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GoF32(pub f32);

impl Serialize for GoF32 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let v = self.0;
        if !v.is_finite() {
            return s.serialize_i64(0);
        }
        if v.fract() == 0.0 && v.abs() < 1e15 {
            // Exact: |v| < 2^53 and integral.
            #[allow(clippy::cast_possible_truncation)]
            return s.serialize_i64(v as i64);
        }
        s.serialize_f32(v)
    }
}

/// Formats Unix nanoseconds as Go's RFC3339Nano in UTC.
pub fn rfc3339_nano(ns: Option<i64>) -> String {
    let Some(ns) = ns else {
        return ZERO_TIME.to_owned();
    };
    let secs = ns.div_euclid(1_000_000_000);
    let nanos = ns.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let mut out = format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        tod / 3600,
        tod % 3600 / 60,
        tod % 60
    );
    if nanos != 0 {
        let frac = format!("{nanos:09}");
        out.push('.');
        out.push_str(frac.trim_end_matches('0'));
    }
    out.push('Z');
    out
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// One replica row.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaJson {
    replica_id: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    tenant: String,
    cache_memory_bytes: i64,
    hit_rate: GoF32,
    pressure: GoF32,
    last_update: String,
    prefix_count: i64,
    last_event_at: String,
    #[serde(skip_serializing_if = "is_false")]
    stats_reported: bool,
    #[serde(skip_serializing_if = "is_zero")]
    t2_hit_tokens: i64,
    #[serde(skip_serializing_if = "is_zero")]
    t2_query_tokens: i64,
    #[serde(skip_serializing_if = "String::is_empty")]
    client_version: String,
}

/// One tenant row.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantJson {
    tenant_id: String,
    index_entries: i64,
    hit_rate: GoF32,
    #[serde(skip_serializing_if = "is_false")]
    hit_rate_reported: bool,
    memory_used: i64,
}

/// The `/snapshot` body.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotJson {
    replicas: Vec<ReplicaJson>,
    tenants: Vec<TenantJson>,
    total_prefixes: i64,
    hot_prefixes: i64,
    /// Producer identities (issue 19); additive, and absent unless producer
    /// auth saw someone, so the reference's key set is unchanged by default.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    producers: Vec<crate::producer::status::ProducerJson>,
}

impl SnapshotJson {
    /// Adds the producer rows.
    #[must_use]
    pub fn with_producers(mut self, rows: Vec<crate::producer::status::ProducerJson>) -> Self {
        self.producers = rows;
        self
    }
}

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

impl From<&Snapshot> for SnapshotJson {
    fn from(s: &Snapshot) -> Self {
        Self {
            replicas: s.replicas.iter().map(replica).collect(),
            tenants: s.tenants.iter().map(tenant).collect(),
            total_prefixes: s.total_prefixes,
            hot_prefixes: s.hot_prefixes,
            producers: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_snapshot_uses_arrays() {
        let j = serde_json::to_string(&SnapshotJson::from(&Snapshot::default())).unwrap();
        assert_eq!(
            j,
            r#"{"replicas":[],"tenants":[],"totalPrefixes":0,"hotPrefixes":0}"#
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
        };
        let v = serde_json::to_value(SnapshotJson::from(&snap)).unwrap();
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
            ["hotPrefixes", "replicas", "tenants", "totalPrefixes"]
        );
    }
}

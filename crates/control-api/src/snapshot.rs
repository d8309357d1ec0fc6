//! The `/snapshot` body (`server.md` §5.1, decision 5): the controller's view
//! of every replica and tenant. The key set is frozen; Go's encoding rules are
//! reproduced (float32 shortest form, RFC 3339 times with trimmed fractions,
//! the zero-time sentinel, omitted false/zero optional fields), except that
//! empty lists are `[]`, not `null`. The types also deserialize, so the
//! operator's CacheIndex poller reads what the server writes.

use serde::{Deserialize, Serialize, Serializer};

/// Go's zero `time.Time` in RFC 3339.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// A float32 encoded like Go's `encoding/json`: integral values without a
/// fractional part, others in shortest round-trip form.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(transparent)]
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaJson {
    /// Replica id as reported by its sidecar.
    pub replica_id: String,
    /// Tenant of the replica's latest report (omitted when empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tenant: String,
    /// KV cache bytes the replica reported.
    pub cache_memory_bytes: i64,
    /// Engine prefix-cache hit rate from the stats scrape.
    pub hit_rate: GoF32,
    /// Engine pressure in [0, 1] from the stats scrape.
    pub pressure: GoF32,
    /// Time of the last report, RFC 3339 (zero time when never).
    pub last_update: String,
    /// Prefixes the index holds for this replica.
    pub prefix_count: i64,
    /// Time of the last KV event, RFC 3339 (zero time when never).
    pub last_event_at: String,
    /// Whether stats were ever reported (omitted when false).
    #[serde(default, skip_serializing_if = "is_false")]
    pub stats_reported: bool,
    /// Offload-tier hit tokens (omitted when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub t2_hit_tokens: i64,
    /// Offload-tier query tokens (omitted when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub t2_query_tokens: i64,
    /// Sidecar version string (ours; omitted when empty).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_version: String,
    /// Approximate-mode holdings (ours, additive; omitted when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tentative_count: i64,
    /// The engine's load from the last stats report (ours, additive;
    /// omitted when the producer reports none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<LoadJson>,
}

/// A replica's engine load (ours, additive).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadJson {
    /// Requests the engine is running.
    pub running_requests: u32,
    /// Requests queued for admission.
    pub waiting_requests: u32,
    /// Fraction of the KV cache in use, [0, 1].
    pub kv_cache_usage: GoF32,
    /// KV cache capacity in tokens (omitted when unknown).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub kv_cache_capacity_tokens: u64,
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

/// One tenant row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantJson {
    /// Tenant id.
    pub tenant_id: String,
    /// Distinct prefixes the index holds for the tenant.
    pub index_entries: i64,
    /// Engine prefix-cache hit rate from the stats scrape.
    pub hit_rate: GoF32,
    /// Whether any replica reported a hit rate (omitted when false).
    #[serde(default, skip_serializing_if = "is_false")]
    pub hit_rate_reported: bool,
    /// Always 0 (kept for the reference's key set).
    pub memory_used: i64,
}

/// The `/snapshot` body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotJson {
    /// One row per known replica.
    pub replicas: Vec<ReplicaJson>,
    /// One row per tenant with entries or a quota.
    pub tenants: Vec<TenantJson>,
    /// Replica × prefix entries in the index.
    pub total_prefixes: i64,
    /// Prefixes with delivered hits.
    pub hot_prefixes: i64,
    /// Approximate-mode holdings, all tenants (ours, additive; omitted when 0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tentative_entries: i64,
    /// Prompt templates in force (ours, additive: the reference's decoders
    /// ignore it; absent in older servers' bodies).
    #[serde(default)]
    pub templates: Vec<TemplateRow>,
    /// Prefill/decode topologies in force (ours, additive).
    #[serde(default)]
    pub pd_topologies: Vec<PdTopologyRow>,
    /// Producer identities (ours, additive; absent unless producer auth saw
    /// someone, so the reference's key set is unchanged by default).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub producers: Vec<ProducerJson>,
}

/// One producer identity in `/snapshot`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProducerJson {
    /// Namespace (or CN).
    pub identity: String,
    /// Last principal seen for it.
    pub subject: String,
    /// Last admitted update (RFC 3339; the zero time if none).
    pub last_seen: String,
    /// Blocks admitted.
    pub blocks: u64,
    /// Open report streams.
    pub open_streams: u32,
    /// Updates refused for tenant scope.
    pub rejected_permission: u64,
    /// Updates refused by the blocks/s limit.
    pub rejected_rate: u64,
    /// Streams refused by the open-stream cap.
    pub rejected_streams: u64,
}

/// One template in force: its ref and revision.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TemplateRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The revision RenderTemplate reports.
    pub revision: String,
}

/// One topology in force.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PdTopologyRow {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `Mooncake`, `NIXL` or `Direct`.
    pub transport: String,
    /// Prefill replica ids, byte-sorted.
    pub prefill_replicas: Vec<String>,
    /// Decode replica ids, byte-sorted.
    pub decode_replicas: Vec<String>,
}

//! Pure projections of a `/snapshot` onto CR status (B.3): the CacheIndex
//! singleton, CacheTenant `indexEntries` + conditions, and CacheBackend
//! `indexParticipation`. The poller fetches, calls these, and writes only
//! what changed.

use crate::crd::{
    CacheBackend, CacheIndexStatus, CacheTenant, CacheTenantStatus, IndexParticipation,
    IndexedReplica, IndexedTenant, PrefixSummary, Prefixes,
};
use crate::webhook::inject::INJECTED_BY;
use inferencecache_control_api::snapshot::{SnapshotJson as Snapshot, ZERO_TIME};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};

/// A float32 as Go's `FormatFloat(f, 'f', -1, 32)` (shortest, no exponent).
pub fn format_rate(f: f32) -> String {
    if f.is_finite() {
        format!("{f}")
    } else {
        "0".into()
    }
}

fn parse_time(s: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    s.parse().ok()
}

/// The CacheIndex status for `snap` read from `url` (without
/// `lastUpdated`, which the writer sets when the rest changed).
pub fn index_status(snap: &Snapshot, url: &str) -> CacheIndexStatus {
    let mut replicas: BTreeMap<String, IndexedReplica> = BTreeMap::new();
    for r in &snap.replicas {
        if r.last_update.is_empty() || r.last_update == ZERO_TIME {
            continue;
        }
        let tenant = Some(r.tenant.clone()).filter(|t| !t.is_empty());
        // On a duplicate replica id the lexicographically later tenant wins.
        if let Some(prev) = replicas.get(&r.replica_id) {
            if prev.tenant >= tenant {
                continue;
            }
        }
        replicas.insert(
            r.replica_id.clone(),
            IndexedReplica {
                id: r.replica_id.clone(),
                tenant,
                cache_memory_bytes: (r.cache_memory_bytes != 0).then_some(r.cache_memory_bytes),
                hit_rate: Some(format_rate(r.hit_rate.0)),
                pressure: format_rate(r.pressure.0),
                last_update: r.last_update.clone(),
            },
        );
    }
    let mut tenants: Vec<IndexedTenant> = snap
        .tenants
        .iter()
        .map(|t| IndexedTenant {
            id: t.tenant_id.clone(),
            index_entries: Some(t.index_entries),
            hit_rate: (t.hit_rate_reported || t.hit_rate.0 != 0.0)
                .then(|| format_rate(t.hit_rate.0)),
            memory_used: 0,
        })
        .collect();
    tenants.sort_by(|a, b| a.id.cmp(&b.id));
    tenants.dedup_by(|a, b| a.id == b.id);
    CacheIndexStatus {
        replicas: replicas.into_values().collect(),
        tenants,
        prefixes: Some(Prefixes {
            summary: PrefixSummary {
                total: snap.total_prefixes,
                hot: snap.hot_prefixes,
            },
        }),
        observed_server: Some(url.to_owned()),
        last_updated: None,
    }
}

fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

/// Keeps a condition's transition time when its status did not change.
fn keep_transition_times(new: &mut [Condition], old: &[Condition]) {
    for c in new {
        if let Some(o) = old
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status)
        {
            c.last_transition_time = o.last_transition_time.clone();
        }
    }
}

/// Whether two statuses differ beyond condition timestamps.
pub fn tenant_status_changed(a: &CacheTenantStatus, b: &CacheTenantStatus) -> bool {
    let strip = |s: &CacheTenantStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(a) != strip(b)
}

/// The status each CacheTenant should have, keyed by `namespace/name`.
pub fn tenant_statuses(
    snap: &Snapshot,
    tenants: &[CacheTenant],
) -> BTreeMap<String, CacheTenantStatus> {
    let entries: BTreeMap<&str, i64> = snap
        .tenants
        .iter()
        .map(|t| (t.tenant_id.as_str(), t.index_entries))
        .collect();
    let mut sorted: Vec<&CacheTenant> = tenants.iter().collect();
    sorted.sort_by_key(|t| (t.namespace().unwrap_or_default(), t.name_any()));
    let mut claimed: BTreeMap<&str, String> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for t in sorted {
        let key = format!("{}/{}", t.namespace().unwrap_or_default(), t.name_any());
        let id = t.spec.tenant_id.as_str();
        let observed = entries.get(id).copied().unwrap_or(0);
        let generation = t.metadata.generation;
        let mut conditions = if let Some(winner) = claimed.get(id) {
            vec![
                condition(
                    "Ready",
                    false,
                    "DuplicateTenantID",
                    format!("tenantID {id:?} is claimed by {winner}, which sorts first"),
                    generation,
                ),
                condition(
                    "QuotaExceeded",
                    false,
                    "NotEffective",
                    "this object's quota is not in force".into(),
                    generation,
                ),
            ]
        } else {
            claimed.insert(id, key.clone());
            let quota = t.spec.quota.and_then(|q| q.max_index_entries);
            let exceeded = match quota {
                None => condition(
                    "QuotaExceeded",
                    false,
                    "NoQuota",
                    "no maxIndexEntries set".into(),
                    generation,
                ),
                Some(max) if observed > max => condition(
                    "QuotaExceeded",
                    true,
                    "OverEntryBudget",
                    format!("{observed} index entries over the budget of {max}"),
                    generation,
                ),
                Some(max) => condition(
                    "QuotaExceeded",
                    false,
                    "WithinBudget",
                    format!("{observed} of {max} index entries"),
                    generation,
                ),
            };
            vec![
                condition(
                    "Ready",
                    true,
                    "Observed",
                    "observed in the server's index".into(),
                    generation,
                ),
                exceeded,
            ]
        };
        if let Some(old) = &t.status {
            keep_transition_times(&mut conditions, &old.conditions);
        }
        out.insert(
            key,
            CacheTenantStatus {
                observed_generation: generation,
                index_entries: Some(observed),
                conditions,
            },
        );
    }
    out
}

#[derive(Default)]
struct Participation {
    prefixes: i64,
    last_event: Option<k8s_openapi::jiff::Timestamp>,
    last_event_text: Option<String>,
    t2_hit: i64,
    t2_query: i64,
}

/// The owner of `pod`: its `injected-by` stamp, else the first CacheBackend
/// (by name) of its namespace whose selector matches it.
fn owner(pod: &Pod, backends: &[&CacheBackend]) -> Option<String> {
    let ns = pod.namespace().unwrap_or_default();
    if let Some(by) = pod.annotations().get(INJECTED_BY) {
        return Some(by.clone());
    }
    backends
        .iter()
        .filter(|b| b.namespace().as_deref() == Some(ns.as_str()))
        .filter(|b| {
            b.spec
                .engine_selector
                .as_ref()
                .is_some_and(|s| s.selects(pod.labels()))
        })
        .map(|b| b.name_any())
        .min()
        .map(|n| format!("{ns}/{n}"))
}

/// How many running or pending pods of `pods` (the backend's namespace) its
/// engine selector matches (`status.matchedEnginePods`).
pub fn matched_pods(backend: &CacheBackend, pods: &[Pod]) -> i32 {
    let Some(sel) = backend.spec.engine_selector.as_ref() else {
        return 0;
    };
    let n = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter(|p| sel.selects(p.labels()))
        .count();
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// `indexParticipation` for each CacheBackend, keyed by `namespace/name`.
/// `pods` maps namespace → its pods, for the namespaces that could be read;
/// backends of other namespaces are left out (their status is kept).
pub fn participation(
    snap: &Snapshot,
    backends: &[CacheBackend],
    pods: &BTreeMap<String, Vec<Pod>>,
) -> BTreeMap<String, IndexParticipation> {
    let sorted: Vec<&CacheBackend> = backends.iter().collect();
    let mut acc: BTreeMap<String, Participation> = BTreeMap::new();
    for r in &snap.replicas {
        let ns = r.tenant.as_str();
        if ns.is_empty() {
            continue;
        }
        let Some(pod) = pods
            .get(ns)
            .and_then(|list| list.iter().find(|p| p.name_any() == r.replica_id))
        else {
            continue;
        };
        let Some(owner) = owner(pod, &sorted) else {
            continue;
        };
        let p = acc.entry(owner).or_default();
        p.prefixes += r.prefix_count;
        let text = r.last_event_at.as_str();
        {
            if let Some(t) = parse_time(text).filter(|_| text != ZERO_TIME) {
                if p.last_event.is_none_or(|old| t > old) {
                    p.last_event = Some(t);
                    p.last_event_text = Some(text.to_owned());
                }
            }
        }
        p.t2_hit += r.t2_hit_tokens;
        p.t2_query += r.t2_query_tokens;
    }
    let namespaces: BTreeSet<&String> = pods.keys().collect();
    let mut out = BTreeMap::new();
    for b in backends {
        let ns = b.namespace().unwrap_or_default();
        if !namespaces.contains(&ns) {
            continue;
        }
        let key = format!("{ns}/{}", b.name_any());
        let p = acc.remove(&key).unwrap_or_default();
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        let t2 = (p.t2_query > 0)
            .then(|| format_rate((p.t2_hit as f64 / p.t2_query as f64).clamp(0.0, 1.0) as f32));
        out.insert(
            key,
            IndexParticipation {
                prefix_count: p.prefixes,
                last_event_at: p.last_event_text,
                hit_rate: None,
                t2_hit_rate: t2,
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{CacheBackendSpec, EngineSelector};

    fn pod(name: &str, domain: &str, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "team",
                         "labels": {"inferencecache.io/cache-domain": domain}},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn matched_engine_pods_counts_live_selected_pods() {
        let b = CacheBackend::new(
            "b",
            CacheBackendSpec {
                engine_selector: Some(EngineSelector {
                    match_labels: BTreeMap::from([(
                        "inferencecache.io/cache-domain".into(),
                        "qwen".into(),
                    )]),
                }),
                ..Default::default()
            },
        );
        let pods = [
            pod("a", "qwen", "Running"),
            pod("b", "qwen", "Pending"),
            pod("c", "qwen", "Succeeded"),
            pod("d", "other", "Running"),
        ];
        assert_eq!(matched_pods(&b, &pods), 2);
        let unselective = CacheBackend::new("u", CacheBackendSpec::default());
        assert_eq!(matched_pods(&unselective, &pods), 0);
    }
}

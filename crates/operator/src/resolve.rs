//! CachePolicy + CacheTenant objects → the `/policy` document (B.2's
//! resolution rules).
//!
//! Pure: the push loop lists the objects and calls [`policy_snapshot`]. Every
//! push is the complete state (replace-on-write), so a namespace whose
//! CachePolicy was deleted reverts to the server's defaults on the next push.
//!
//! One object we cannot read (an `evictionTTL` that is not a Go duration,
//! which only gets past admission when the webhook is not installed) is left
//! out and reported, instead of failing the whole document: the other
//! namespaces keep their policy. The reference would fail the list decode and
//! push nothing.
//!
//! The document is version 8 when a resolved policy carries `routing` and 7
//! otherwise, so clusters that do not use it keep working with servers that
//! refuse 8 (docs/decisions.md, "Kubernetes operator").

use crate::crd::{AffinityRouting, CachePolicy, CacheTenant, IsolationMode};
use crate::duration::parse_go_duration;
use inferencecache_control_api::policy::{
    POLICY_CONTROLLER_VERSION, POLICY_PROPAGATION_VERSION, PolicySnapshot, ResolvedPolicy,
    ResolvedTenant, RoutingWire, StrategyWire,
};
use kube::ResourceExt;

/// The routing floor used when a CachePolicy's value cannot be used.
const FALLBACK_ROUTING_FLOOR: f32 = 0.1;

/// An object left out of the document, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// `CachePolicy` or `CacheTenant`.
    pub kind: &'static str,
    /// `namespace/name`.
    pub object: String,
    /// Stable reason code (a metric label).
    pub reason: &'static str,
    /// Human detail.
    pub detail: String,
}

/// The resolved document and what was left out of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The body to push.
    pub snapshot: PolicySnapshot,
    /// Objects not in it.
    pub skipped: Vec<Skipped>,
}

fn key(o: &impl ResourceExt) -> (String, String) {
    (o.namespace().unwrap_or_default(), o.name_any())
}

fn id(o: &impl ResourceExt) -> String {
    let (ns, name) = key(o);
    format!("{ns}/{name}")
}

/// Parses `routingFloorScore` like Go's `ParseFloat(s, 32)`; anything
/// unusable (parse error, NaN, infinite, negative) becomes 0.1.
pub fn routing_floor(s: &str) -> f32 {
    match s.trim().parse::<f32>() {
        Ok(f) if f.is_finite() && f >= 0.0 => f,
        _ => FALLBACK_ROUTING_FLOOR,
    }
}

/// Applies the resolution rules to every CachePolicy and CacheTenant.
pub fn policy_snapshot(policies: &[CachePolicy], tenants: &[CacheTenant]) -> Resolved {
    let mut skipped = Vec::new();
    let mut sorted: Vec<&CachePolicy> = policies.iter().collect();
    sorted.sort_by_key(|p| key(*p));
    let mut out: Vec<ResolvedPolicy> = Vec::new();
    for p in sorted {
        let namespace = p.namespace().unwrap_or_default();
        if out
            .last()
            .is_some_and(|last| last.namespace.as_deref() == Some(namespace.as_str()))
        {
            skipped.push(Skipped {
                kind: "CachePolicy",
                object: id(p),
                reason: "duplicate",
                detail: "another CachePolicy in the namespace sorts first by name".into(),
            });
            continue;
        }
        match resolve_policy(p, namespace) {
            Ok(r) => out.push(r),
            Err(detail) => skipped.push(Skipped {
                kind: "CachePolicy",
                object: id(p),
                reason: "invalid",
                detail,
            }),
        }
    }

    let mut sorted: Vec<&CacheTenant> = tenants.iter().collect();
    sorted.sort_by_key(|t| key(*t));
    let mut quotas: Vec<ResolvedTenant> = Vec::new();
    for t in sorted {
        let Some(max) = t.spec.quota.and_then(|q| q.max_index_entries) else {
            continue;
        };
        if t.spec.tenant_id.is_empty() {
            continue;
        }
        if quotas
            .iter()
            .any(|q| q.tenant_id.as_deref() == Some(t.spec.tenant_id.as_str()))
        {
            skipped.push(Skipped {
                kind: "CacheTenant",
                object: id(t),
                reason: "duplicate",
                detail: format!(
                    "tenantID {:?} is already claimed by an object that sorts first",
                    t.spec.tenant_id
                ),
            });
            continue;
        }
        quotas.push(ResolvedTenant {
            tenant_id: Some(t.spec.tenant_id.clone()),
            max_index_entries: Some(max),
            isolation_mode: Some(
                match t.spec.isolation_mode {
                    IsolationMode::Fairness => "Fairness",
                }
                .to_owned(),
            ),
        });
    }

    // Version 8 only when a policy needs it: a cluster that sets no
    // `routing` keeps pushing 7, which reference servers also accept.
    let version = if out.iter().any(|p| p.routing.is_some()) {
        POLICY_PROPAGATION_VERSION
    } else {
        POLICY_CONTROLLER_VERSION
    };
    Resolved {
        snapshot: PolicySnapshot {
            version,
            policies: Some(out),
            tenants: (!quotas.is_empty()).then_some(quotas),
        },
        skipped,
    }
}

fn resolve_policy(p: &CachePolicy, namespace: String) -> Result<ResolvedPolicy, String> {
    let s = &p.spec;
    let eviction_ttl = match s.eviction_ttl.as_deref() {
        None => None,
        Some(ttl) => Some(parse_go_duration(ttl).map_err(|e| format!("spec.evictionTTL: {e}"))?),
    };
    Ok(ResolvedPolicy {
        namespace: Some(namespace),
        eviction_ttl,
        minimum_prefix_tokens: s.minimum_prefix_tokens,
        minimum_matched_tokens: s.minimum_matched_tokens,
        routing_floor_score: s.routing_floor_score.as_deref().map(routing_floor),
        lookup_timeout_ms: s.lookup_timeout_ms,
        affinity_routing: s.affinity_routing.map(|a| a == AffinityRouting::Enabled),
        eviction: Some(s.eviction.wire().to_owned()),
        strategy: s.strategy.map(|st| StrategyWire {
            enable_chain_matching: st.enable_chain_matching,
            require_chain: st.require_chain,
            enable_tenant_hot: st.enable_tenant_hot,
        }),
        routing: s.routing.map(|r| RoutingWire {
            ranking: r.ranking.map(|m| m.wire().to_owned()),
            prefill_micros_per_token: r.prefill_micros_per_token,
            request_overhead_micros: r.request_overhead_micros,
            pressure_micros: r.pressure_micros,
            t2_reload_cost: r.t2_reload_cost,
            t3_reload_cost: r.t3_reload_cost,
            affinity_max_pressure: r.affinity_max_pressure,
            tentative_ttl_seconds: r.tentative_ttl_seconds,
            load_bound: r.load_bound,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{CachePolicySpec, CacheTenantSpec, Eviction, TenantQuota};

    fn policy(ns: &str, name: &str, spec: CachePolicySpec) -> CachePolicy {
        let mut p = CachePolicy::new(name, spec);
        p.metadata.namespace = Some(ns.into());
        p
    }

    fn tenant(ns: &str, name: &str, id: &str, max: Option<i64>) -> CacheTenant {
        let mut t = CacheTenant::new(
            name,
            CacheTenantSpec {
                tenant_id: id.into(),
                quota: Some(TenantQuota {
                    max_index_entries: max,
                }),
                ..Default::default()
            },
        );
        t.metadata.namespace = Some(ns.into());
        t
    }

    #[test]
    fn empty_cluster_pushes_an_empty_policy_list_and_no_tenants() {
        let r = policy_snapshot(&[], &[]);
        let json = serde_json::to_string(&r.snapshot).unwrap();
        assert_eq!(json, r#"{"version":7,"policies":[]}"#);
    }

    #[test]
    fn first_policy_per_namespace_by_name_wins() {
        let lfu = CachePolicySpec {
            eviction: Eviction::Lfu,
            ..Default::default()
        };
        let r = policy_snapshot(
            &[
                policy("b", "z", CachePolicySpec::default()),
                policy("a", "y", CachePolicySpec::default()),
                policy("a", "x", lfu),
            ],
            &[],
        );
        let ps = r.snapshot.policies.unwrap();
        assert_eq!(ps.len(), 2);
        assert_eq!(ps[0].namespace.as_deref(), Some("a"));
        assert_eq!(ps[0].eviction.as_deref(), Some("lfu"));
        assert_eq!(ps[1].namespace.as_deref(), Some("b"));
        assert_eq!(ps[1].eviction.as_deref(), Some("lru"));
        assert_eq!(r.skipped.len(), 1);
        assert_eq!(r.skipped[0].object, "a/y");
        assert_eq!(r.skipped[0].reason, "duplicate");
    }

    #[test]
    fn fields_map_to_the_wire_like_the_reference() {
        let spec: CachePolicySpec = serde_json::from_value(serde_json::json!({
            "evictionTTL": "45m",
            "minimumPrefixTokens": 16,
            "routingFloorScore": "5",
            "lookupTimeoutMs": 20,
            "affinityRouting": "Disabled",
            "strategy": {"requireChain": true}
        }))
        .unwrap();
        let r = policy_snapshot(&[policy("t", "p", spec)], &[]);
        let json = serde_json::to_value(&r.snapshot).unwrap();
        assert_eq!(
            json["policies"][0],
            serde_json::json!({
                "namespace": "t",
                "evictionTTL": 2_700_000_000_000_i64,
                "minimumPrefixTokens": 16,
                "minimumMatchedTokens": 64,
                "routingFloorScore": 5.0,
                "lookupTimeoutMs": 20,
                "affinityRouting": false,
                "eviction": "lru",
                "strategy": {"enableChainMatching": true, "requireChain": true, "enableTenantHot": true}
            })
        );
    }

    #[test]
    fn routing_is_resolved_and_only_then_the_push_is_version_8() {
        let spec: CachePolicySpec = serde_json::from_value(serde_json::json!({
            "routing": {
                "ranking": "Contract",
                "prefillMicrosPerToken": 80,
                "t2ReloadCost": 0.5,
                "affinityMaxPressure": 0.9,
                "tentativeTTLSeconds": 0,
                "loadBound": 2.5
            }
        }))
        .unwrap();
        let plain = policy("a", "p", CachePolicySpec::default());
        let r = policy_snapshot(&[plain.clone(), policy("t", "p", spec)], &[]);
        let json = serde_json::to_value(&r.snapshot).unwrap();
        assert_eq!(json["version"], 8);
        assert!(json["policies"][0].get("routing").is_none(), "{json}");
        assert_eq!(
            json["policies"][1]["routing"],
            serde_json::json!({
                "ranking": "contract",
                "prefillMicrosPerToken": 80.0,
                "t2ReloadCost": 0.5,
                "affinityMaxPressure": 0.9_f32,
                "tentativeTTLSeconds": 0.0,
                "loadBound": 2.5
            })
        );
        // An empty object still asks for the server's defaults explicitly
        // (and so still needs v8); no object at all stays on v7.
        let empty: CachePolicySpec =
            serde_json::from_value(serde_json::json!({"routing": {}})).unwrap();
        let r = policy_snapshot(&[policy("t", "p", empty)], &[]);
        assert_eq!(r.snapshot.version, 8);
        let r = policy_snapshot(&[plain], &[tenant("t", "t", "acme", Some(1))]);
        assert_eq!(r.snapshot.version, 7);
    }

    #[test]
    fn a_skipped_policy_does_not_raise_the_version() {
        let bad: CachePolicySpec = serde_json::from_value(serde_json::json!({
            "evictionTTL": "forever",
            "routing": {"ranking": "Ttft"}
        }))
        .unwrap();
        let r = policy_snapshot(&[policy("a", "bad", bad)], &[]);
        assert_eq!(r.snapshot.version, 7);
        assert_eq!(r.skipped.len(), 1);
    }

    #[test]
    fn unusable_routing_floor_becomes_the_default() {
        for bad in ["abc", "NaN", "inf", "-1"] {
            assert!((routing_floor(bad) - 0.1).abs() < f32::EPSILON, "{bad}");
        }
        assert!(routing_floor("0").abs() < f32::EPSILON);
        assert!((routing_floor("2.5") - 2.5).abs() < f32::EPSILON);
    }

    #[test]
    fn an_unreadable_policy_is_skipped_and_the_others_still_push() {
        let bad = CachePolicySpec {
            eviction_ttl: Some("forever".into()),
            ..Default::default()
        };
        let r = policy_snapshot(
            &[
                policy("a", "bad", bad),
                policy("b", "good", CachePolicySpec::default()),
            ],
            &[],
        );
        let ps = r.snapshot.policies.unwrap();
        assert_eq!(ps.len(), 1);
        assert_eq!(ps[0].namespace.as_deref(), Some("b"));
        assert_eq!(r.skipped[0].object, "a/bad");
        assert_eq!(r.skipped[0].reason, "invalid");
    }

    #[test]
    fn tenants_need_an_id_and_a_quota_and_the_first_claim_wins() {
        let r = policy_snapshot(
            &[],
            &[
                tenant("z", "t", "acme", Some(5)),
                tenant("a", "t", "acme", Some(10)),
                tenant("a", "u", "", Some(1)),
                tenant("a", "v", "free", None),
            ],
        );
        let ts = r.snapshot.tenants.unwrap();
        assert_eq!(ts.len(), 1);
        assert_eq!(ts[0].tenant_id.as_deref(), Some("acme"));
        assert_eq!(ts[0].max_index_entries, Some(10));
        assert_eq!(ts[0].isolation_mode.as_deref(), Some("Fairness"));
    }
}

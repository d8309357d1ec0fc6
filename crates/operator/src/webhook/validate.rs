//! The CachePolicy and CacheTenant validation rules of B.5, as pure
//! functions over the object, its previous version and its namespace's
//! siblings (the handler lists those through the apiserver).
//!
//! On UPDATE only errors the change newly introduces are reported, so an
//! object admitted under older rules can still be edited
//! (`filterIntroducedErrors` in the reference).

use crate::crd::{CachePolicy, CacheTenant, PROBE_TENANT};
use crate::duration::parse_go_duration;
use kube::ResourceExt;

/// CREATE or UPDATE (DELETE and CONNECT are not validated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A new object.
    Create,
    /// A changed object.
    Update,
}

fn policy_field_errors(p: &CachePolicy) -> Vec<String> {
    let mut errs = Vec::new();
    if let Some(ttl) = p.spec.eviction_ttl.as_deref() {
        match parse_go_duration(ttl) {
            Ok(ns) if ns <= 0 => errs.push(format!(
                "spec.evictionTTL: Invalid value: {ttl:?}: must be greater than 0"
            )),
            Ok(_) => {}
            Err(_) => errs.push(format!(
                "spec.evictionTTL: Invalid value: {ttl:?}: must be a duration such as \"30m\""
            )),
        }
    }
    if let Some(s) = p.spec.strategy {
        if s.enable_chain_matching == Some(false) && s.require_chain == Some(true) {
            errs.push(
                "spec.strategy.requireChain: Invalid value: true: strategy.requireChain requires strategy.enableChainMatching"
                    .into(),
            );
        }
    }
    if let Some(r) = p.spec.routing {
        errs.extend(r.field_errors());
    }
    errs
}

fn introduced(new: Vec<String>, old: Vec<String>) -> Vec<String> {
    new.into_iter().filter(|e| !old.contains(e)).collect()
}

/// Validates a CachePolicy. `siblings` are the other CachePolicies of its
/// namespace. Returns the denial message, if any.
pub fn cache_policy(
    op: Op,
    new: &CachePolicy,
    old: Option<&CachePolicy>,
    siblings: &[CachePolicy],
) -> Option<String> {
    let mut errs = policy_field_errors(new);
    if op == Op::Update {
        errs = introduced(errs, old.map(policy_field_errors).unwrap_or_default());
    }
    if op == Op::Create {
        let name = new.name_any();
        if let Some(first) = siblings
            .iter()
            .map(ResourceExt::name_any)
            .filter(|n| *n != name)
            .min()
        {
            errs.push(format!(
                "metadata.name: Forbidden: only one CachePolicy is allowed per namespace; {:?} already exists in namespace {:?}",
                first,
                new.namespace().unwrap_or_default()
            ));
        }
    }
    (!errs.is_empty()).then(|| errs.join("; "))
}

/// Validates a CacheTenant. `siblings` are the other CacheTenants of its
/// namespace.
pub fn cache_tenant(
    op: Op,
    new: &CacheTenant,
    old: Option<&CacheTenant>,
    siblings: &[CacheTenant],
) -> Option<String> {
    let mut errs = Vec::new();
    let id = new.spec.tenant_id.as_str();
    let old_id = old.map(|o| o.spec.tenant_id.as_str());
    let reserved_now = id == PROBE_TENANT;
    if reserved_now && (op == Op::Create || old_id != Some(PROBE_TENANT)) {
        errs.push(format!(
            "spec.tenantID: Invalid value: {id:?}: the tenant {PROBE_TENANT:?} is reserved for the server's functional probe"
        ));
    }
    if op == Op::Create || old_id != Some(id) {
        let name = new.name_any();
        if let Some(other) = siblings
            .iter()
            .filter(|t| t.name_any() != name && t.spec.tenant_id == id)
            .map(ResourceExt::name_any)
            .min()
        {
            errs.push(format!(
                "spec.tenantID: Duplicate value: {id:?}: already used by CacheTenant {other:?} in this namespace"
            ));
        }
    }
    (!errs.is_empty()).then(|| errs.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{CachePolicySpec, CacheTenantSpec, Strategy};

    fn policy(name: &str, spec: CachePolicySpec) -> CachePolicy {
        let mut p = CachePolicy::new(name, spec);
        p.metadata.namespace = Some("ns".into());
        p
    }

    fn tenant(name: &str, id: &str) -> CacheTenant {
        let mut t = CacheTenant::new(
            name,
            CacheTenantSpec {
                tenant_id: id.into(),
                ..Default::default()
            },
        );
        t.metadata.namespace = Some("ns".into());
        t
    }

    #[test]
    fn a_second_policy_in_a_namespace_is_forbidden_on_create_only() {
        let first = policy("b", CachePolicySpec::default());
        let other = policy("a", CachePolicySpec::default());
        let new = policy("c", CachePolicySpec::default());
        let msg = cache_policy(Op::Create, &new, None, &[first.clone(), other]).unwrap();
        assert!(msg.contains("metadata.name: Forbidden"), "{msg}");
        assert!(msg.contains("\"a\" already exists"), "{msg}");
        assert_eq!(cache_policy(Op::Update, &new, Some(&new), &[first]), None);
    }

    #[test]
    fn non_positive_or_unreadable_ttl_is_rejected() {
        for ttl in ["0s", "-5m", "forever"] {
            let p = policy(
                "p",
                CachePolicySpec {
                    eviction_ttl: Some(ttl.into()),
                    ..Default::default()
                },
            );
            let msg = cache_policy(Op::Create, &p, None, &[]).unwrap();
            assert!(msg.starts_with("spec.evictionTTL"), "{msg}");
        }
    }

    #[test]
    fn require_chain_needs_chain_matching_and_updates_report_only_new_errors() {
        let bad = policy(
            "p",
            CachePolicySpec {
                strategy: Some(Strategy {
                    enable_chain_matching: Some(false),
                    require_chain: Some(true),
                    enable_tenant_hot: None,
                }),
                ..Default::default()
            },
        );
        let msg = cache_policy(Op::Create, &bad, None, &[]).unwrap();
        assert!(msg.contains("strategy.requireChain requires strategy.enableChainMatching"));
        // Already invalid before the edit: not newly introduced.
        assert_eq!(cache_policy(Op::Update, &bad, Some(&bad), &[]), None);
        let good = policy("p", CachePolicySpec::default());
        assert!(cache_policy(Op::Update, &bad, Some(&good), &[]).is_some());
    }

    #[test]
    fn routing_values_outside_the_servers_ranges_are_rejected() {
        let with = |routing: serde_json::Value| {
            let spec: CachePolicySpec =
                serde_json::from_value(serde_json::json!({ "routing": routing })).unwrap();
            policy("p", spec)
        };
        for (routing, want) in [
            (
                serde_json::json!({"prefillMicrosPerToken": -1}),
                "spec.routing.prefillMicrosPerToken: Invalid value: -1: must be greater than or equal to 0",
            ),
            (
                serde_json::json!({"t3ReloadCost": 1.5}),
                "spec.routing.t3ReloadCost: Invalid value: 1.5: must be less than or equal to 1",
            ),
            (
                serde_json::json!({"tentativeTTLSeconds": 90000}),
                "spec.routing.tentativeTTLSeconds: Invalid value: 90000: must be less than or equal to 86400",
            ),
            (
                serde_json::json!({"affinityMaxPressure": -0.5}),
                "spec.routing.affinityMaxPressure",
            ),
        ] {
            let msg = cache_policy(Op::Create, &with(routing.clone()), None, &[])
                .unwrap_or_else(|| panic!("{routing} admitted"));
            assert!(msg.contains(want), "{routing}: {msg}");
        }
        let edges = with(serde_json::json!({
            "ranking": "Contract", "prefillMicrosPerToken": 0, "t2ReloadCost": 1,
            "t3ReloadCost": 0, "tentativeTTLSeconds": 86400, "loadBound": 0
        }));
        assert_eq!(cache_policy(Op::Create, &edges, None, &[]), None);
        // An unknown ranking never reaches the rules: the typed decode (and
        // the schema's enum) refuse it.
        assert!(
            serde_json::from_value::<CachePolicySpec>(
                serde_json::json!({"routing": {"ranking": "ttft"}})
            )
            .is_err()
        );
    }

    #[test]
    fn the_probe_tenant_is_reserved() {
        let t = tenant("t", PROBE_TENANT);
        assert!(
            cache_tenant(Op::Create, &t, None, &[])
                .unwrap()
                .contains("reserved")
        );
        assert_eq!(cache_tenant(Op::Update, &t, Some(&t), &[]), None);
        let before = tenant("t", "acme");
        assert!(cache_tenant(Op::Update, &t, Some(&before), &[]).is_some());
    }

    #[test]
    fn a_duplicate_tenant_id_in_the_namespace_is_rejected() {
        let existing = tenant("a", "acme");
        let new = tenant("b", "acme");
        let msg = cache_tenant(Op::Create, &new, None, std::slice::from_ref(&existing)).unwrap();
        assert!(msg.contains("Duplicate value: \"acme\""), "{msg}");
        // An unrelated edit of an existing duplicate is not blocked.
        assert_eq!(
            cache_tenant(Op::Update, &new, Some(&new), &[existing]),
            None
        );
    }
}

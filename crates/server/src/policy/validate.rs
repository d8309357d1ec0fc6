//! `/policy` bodies checked the way the CRD schema and admission webhook
//! check the objects they come from (`subscriber-and-control-plane.md` B.1),
//! so a hand-written or corrupted push cannot install values no CachePolicy
//! or CacheTenant could hold. The first violation is reported, naming the
//! entry and the field: `policies[0] (namespace "a").minimumMatchedTokens:
//! must be >= 0, got -5`.
//!
//! The reference instead clamps negative numbers to 0 and reads unknown
//! eviction strings as LRU; `--lenient-policy-validation` restores that for
//! `/policy` ([`super::decode_policy_json_lenient`]).

use super::wire::{PolicyError, PolicySnapshot, ResolvedPolicy, ResolvedTenant};
use inferencecache_control_api::policy::RoutingWire;

/// Largest routing floor the CRD's pattern admits (8 integer digits).
const MAX_ROUTING_FLOOR: f32 = 1e8;
/// Largest `routing.tentativeTTLSeconds` (the CRD's maximum; lenient mode
/// clamps to it).
const MAX_TENTATIVE_TTL_SECONDS: f64 = 86_400.0;

fn invalid(entry: &str, field: &str, why: String) -> PolicyError {
    PolicyError::Invalid(format!("{entry}.{field}: {why}"))
}

fn non_negative<T: PartialOrd + Default + std::fmt::Display + Copy>(
    entry: &str,
    field: &str,
    v: Option<T>,
) -> Result<(), PolicyError> {
    match v {
        Some(x) if x < T::default() => Err(invalid(entry, field, format!("must be >= 0, got {x}"))),
        _ => Ok(()),
    }
}

/// The v8 `routing` numbers, checked against the CachePolicy schema's
/// ranges (`spec.routing`): at least 0, reload costs at most 1, tentative
/// holdings at most a day. `ranking` is checked when it is resolved.
fn routing(e: &str, r: &RoutingWire) -> Result<(), PolicyError> {
    let fields = [
        ("prefillMicrosPerToken", r.prefill_micros_per_token, None),
        ("requestOverheadMicros", r.request_overhead_micros, None),
        ("pressureMicros", r.pressure_micros, None),
        ("t2ReloadCost", r.t2_reload_cost, Some(1.0)),
        ("t3ReloadCost", r.t3_reload_cost, Some(1.0)),
        (
            "affinityMaxPressure",
            r.affinity_max_pressure.map(f64::from),
            None,
        ),
        (
            "tentativeTTLSeconds",
            r.tentative_ttl_seconds,
            Some(MAX_TENTATIVE_TTL_SECONDS),
        ),
        ("loadBound", r.load_bound, None),
    ];
    for (field, v, max) in fields {
        let Some(x) = v else { continue };
        let why = match max {
            Some(m) if !(0.0..=m).contains(&x) => format!("must be in [0, {m}], got {x}"),
            None if x.is_nan() || x < 0.0 => format!("must be >= 0, got {x}"),
            _ => continue,
        };
        return Err(invalid(e, &format!("routing.{field}"), why));
    }
    Ok(())
}

fn policy(i: usize, version: i64, p: &ResolvedPolicy) -> Result<(), PolicyError> {
    let entry = format!(
        "policies[{i}] (namespace {:?})",
        p.namespace.as_deref().unwrap_or("")
    );
    let e = entry.as_str();
    if let Some(ttl) = p.eviction_ttl.filter(|&t| t < 0) {
        return Err(invalid(
            e,
            "evictionTTL",
            format!("must be > 0, got {ttl}ns"),
        ));
    }
    non_negative(e, "minimumPrefixTokens", p.minimum_prefix_tokens)?;
    non_negative(e, "minimumMatchedTokens", p.minimum_matched_tokens)?;
    non_negative(e, "lookupTimeoutMs", p.lookup_timeout_ms)?;
    if let Some(f) = p.routing_floor_score {
        if !f.is_finite() || !(0.0..MAX_ROUTING_FLOOR).contains(&f) {
            return Err(invalid(
                e,
                "routingFloorScore",
                format!("must be a number in [0, 1e8), got {f}"),
            ));
        }
    }
    if let Some(ev) = p.eviction.as_deref().filter(|s| !s.is_empty()) {
        if !ev.eq_ignore_ascii_case("lru") && !ev.eq_ignore_ascii_case("lfu") {
            return Err(invalid(
                e,
                "eviction",
                format!("must be LRU or LFU, got {ev:?}"),
            ));
        }
    }
    // Versions before 8 ignore `routing`, so its values cannot matter there.
    if let Some(r) = p.routing.as_ref().filter(|_| version >= 8) {
        routing(e, r)?;
    }
    if let Some(s) = p.strategy {
        if s.require_chain == Some(true) && s.enable_chain_matching == Some(false) {
            return Err(invalid(
                e,
                "strategy.requireChain",
                "strategy.requireChain requires strategy.enableChainMatching".into(),
            ));
        }
    }
    Ok(())
}

fn tenant(i: usize, t: &ResolvedTenant) -> Result<(), PolicyError> {
    let id = t.tenant_id.as_deref().unwrap_or("");
    let entry = format!("tenants[{i}] (tenantID {id:?})");
    let e = entry.as_str();
    non_negative(e, "maxIndexEntries", t.max_index_entries)?;
    if let Some(m) = t.isolation_mode.as_deref().filter(|s| !s.is_empty()) {
        if m != "Fairness" {
            return Err(invalid(
                e,
                "isolationMode",
                format!("must be Fairness, got {m:?}"),
            ));
        }
    }
    Ok(())
}

/// Checks every entry; the first violation wins.
pub(super) fn check(s: &PolicySnapshot) -> Result<(), PolicyError> {
    for (i, p) in s.policies.iter().flatten().enumerate() {
        policy(i, s.version, p)?;
    }
    for (i, t) in s.tenants.iter().flatten().enumerate() {
        tenant(i, t)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{decode_policy_json, decode_policy_json_lenient};

    fn refused(body: &str) -> String {
        let e = decode_policy_json(body.as_bytes()).expect_err(body);
        e.to_string()
    }

    #[test]
    fn every_schema_rule_names_its_field() {
        let cases = [
            (
                r#"{"namespace":"a","minimumMatchedTokens":-5}"#,
                "(namespace \"a\").minimumMatchedTokens: must be >= 0, got -5",
            ),
            (
                r#"{"namespace":"a","minimumPrefixTokens":-1}"#,
                "minimumPrefixTokens",
            ),
            (
                r#"{"namespace":"a","lookupTimeoutMs":-3}"#,
                "lookupTimeoutMs",
            ),
            (
                r#"{"namespace":"a","evictionTTL":-1}"#,
                "evictionTTL: must be > 0",
            ),
            (
                r#"{"namespace":"a","routingFloorScore":-0.5}"#,
                "routingFloorScore",
            ),
            (
                r#"{"namespace":"a","routingFloorScore":1e9}"#,
                "routingFloorScore",
            ),
            (
                r#"{"namespace":"a","eviction":"FIFO"}"#,
                "eviction: must be LRU or LFU",
            ),
            (
                r#"{"namespace":"a","strategy":{"enableChainMatching":false,"requireChain":true}}"#,
                "strategy.requireChain requires strategy.enableChainMatching",
            ),
        ];
        for (p, want) in cases {
            let body = format!(r#"{{"version":7,"policies":[{{"namespace":"ok"}},{p}]}}"#);
            let msg = refused(&body);
            assert!(msg.starts_with("invalid policy snapshot: "), "{msg}");
            assert!(msg.contains(want), "{p}: {msg}");
            assert!(msg.contains("policies[1]"), "{p}: {msg}");
        }
        let tenants = [
            (
                r#"{"tenantID":"t","maxIndexEntries":-7}"#,
                "tenants[0] (tenantID \"t\").maxIndexEntries",
            ),
            (
                r#"{"tenantID":"t","maxIndexEntries":1,"isolationMode":"Strict"}"#,
                "isolationMode",
            ),
        ];
        for (t, want) in tenants {
            let body = format!(r#"{{"version":7,"tenants":[{t}]}}"#);
            let msg = refused(&body);
            assert!(msg.contains(want), "{t}: {msg}");
        }
    }

    #[test]
    fn v8_routing_numbers_are_checked_like_the_crd() {
        let cases = [
            (
                r#"{"prefillMicrosPerToken":-1}"#,
                "routing.prefillMicrosPerToken: must be >= 0, got -1",
            ),
            (r#"{"pressureMicros":-0.5}"#, "routing.pressureMicros"),
            (
                r#"{"t2ReloadCost":2}"#,
                "routing.t2ReloadCost: must be in [0, 1], got 2",
            ),
            (r#"{"t3ReloadCost":-1}"#, "routing.t3ReloadCost"),
            (
                r#"{"affinityMaxPressure":-1}"#,
                "routing.affinityMaxPressure",
            ),
            (
                r#"{"tentativeTTLSeconds":86401}"#,
                "routing.tentativeTTLSeconds: must be in [0, 86400]",
            ),
            (r#"{"loadBound":-2}"#, "routing.loadBound"),
        ];
        for (r, want) in cases {
            let body = format!(r#"{{"version":8,"policies":[{{"namespace":"a","routing":{r}}}]}}"#);
            let msg = refused(&body);
            assert!(msg.contains(want), "{r}: {msg}");
            assert!(msg.contains("policies[0] (namespace \"a\")"), "{r}: {msg}");
            // Ignored before v8; clamped in lenient mode.
            let v7 = body.replace(r#""version":8"#, r#""version":7"#);
            assert!(decode_policy_json(v7.as_bytes()).is_ok(), "{v7}");
            assert!(
                decode_policy_json_lenient(body.as_bytes()).is_ok(),
                "{body}"
            );
        }
        let edges = r#"{"version":8,"policies":[{"namespace":"a","routing":{"ranking":"contract",
            "prefillMicrosPerToken":0,"requestOverheadMicros":0,"pressureMicros":0,"t2ReloadCost":1,
            "t3ReloadCost":0,"affinityMaxPressure":0,"tentativeTTLSeconds":86400,"loadBound":0}}]}"#;
        assert!(decode_policy_json(edges.as_bytes()).is_ok());
    }

    #[test]
    fn valid_values_at_the_edges_pass() {
        let body = r#"{"version":7,
            "policies":[{"namespace":"a","minimumMatchedTokens":0,"minimumPrefixTokens":0,"lookupTimeoutMs":0,
                         "routingFloorScore":0,"eviction":"lfu","evictionTTL":1,
                         "strategy":{"enableChainMatching":true,"requireChain":true}}],
            "tenants":[{"tenantID":"t","maxIndexEntries":0,"isolationMode":"Fairness"}]}"#;
        assert!(decode_policy_json(body.as_bytes()).is_ok());
    }

    #[test]
    fn lenient_mode_clamps_like_the_reference() {
        let body = br#"{"version":7,"policies":[{"namespace":"a","minimumMatchedTokens":-5,"eviction":"FIFO"}]}"#;
        let set = decode_policy_json_lenient(body).expect("reference behaviour");
        assert_eq!(set.policies["a"].minimum_matched_tokens, 0);
    }
}

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

/// Largest routing floor the CRD's pattern admits (8 integer digits).
const MAX_ROUTING_FLOOR: f32 = 1e8;

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

fn policy(i: usize, p: &ResolvedPolicy) -> Result<(), PolicyError> {
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
        policy(i, p)?;
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

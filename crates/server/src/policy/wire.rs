//! The `/policy` JSON wire types (`server.md` §4.1), exactly as the controller
//! marshals them, and their decoding into a [`PolicySet`].

use super::resolved::{EvictionAlgorithm, PolicySet, TenantPolicy};
use super::routing::resolve_routing;
pub use inferencecache_control_api::policy::{
    DEFAULT_MINIMUM_MATCHED_TOKENS, DEFAULT_ROUTING_FLOOR_SCORE, MAX_POLICY_BODY_BYTES,
    POLICY_MINIMUM_ACCEPTED_VERSION, POLICY_PROPAGATION_VERSION, PolicySnapshot, ResolvedPolicy,
    ResolvedTenant, StrategyWire,
};
use std::time::Duration;

/// Why a policy document was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Not JSON, unknown field, wrong type, or too large.
    #[error("decode policy snapshot: {0}")]
    Decode(String),
    /// Version outside [3, 8].
    #[error("unsupported policy snapshot version")]
    Version(i64),
    /// A value no CachePolicy / CacheTenant could hold (`validate.rs`).
    #[error("invalid policy snapshot: {0}")]
    Invalid(String),
}

/// Decodes a `/policy` body: the first JSON value only (trailing content is
/// ignored, as the reference's decoder does), unknown fields rejected, values
/// checked as the CRD schema would (`validate.rs`).
pub fn decode_policy_json(body: &[u8]) -> Result<PolicySet, PolicyError> {
    into_policy_set(decode_first(body)?)
}

/// [`decode_policy_json`] without the schema checks: negative numbers are
/// clamped to 0 and unknown eviction strings read as LRU, as the reference
/// does (`--lenient-policy-validation`).
pub fn decode_policy_json_lenient(body: &[u8]) -> Result<PolicySet, PolicyError> {
    resolve_policy_set(decode_first(body)?)
}

fn decode_first(body: &[u8]) -> Result<PolicySnapshot, PolicyError> {
    if body.len() > MAX_POLICY_BODY_BYTES {
        return Err(PolicyError::Decode("http: request body too large".into()));
    }
    let mut stream = serde_json::Deserializer::from_slice(body).into_iter::<PolicySnapshot>();
    match stream.next() {
        Some(Ok(s)) => Ok(s),
        Some(Err(e)) => Err(PolicyError::Decode(e.to_string())),
        None => Err(PolicyError::Decode("EOF".into())),
    }
}

/// Checks the version and the values, normalizes older bodies and resolves
/// defaults.
pub fn into_policy_set(snapshot: PolicySnapshot) -> Result<PolicySet, PolicyError> {
    super::validate::check(&snapshot)?;
    resolve_policy_set(snapshot)
}

/// Checks the version, normalizes older bodies and resolves defaults; values
/// are clamped, not checked (the reference's behaviour).
fn resolve_policy_set(snapshot: PolicySnapshot) -> Result<PolicySet, PolicyError> {
    let v = snapshot.version;
    if !(POLICY_MINIMUM_ACCEPTED_VERSION..=POLICY_PROPAGATION_VERSION).contains(&v) {
        return Err(PolicyError::Version(v));
    }
    let mut set = PolicySet {
        version: v,
        ..PolicySet::default()
    };
    for p in snapshot.policies.unwrap_or_default() {
        let Some(ns) = p.namespace.clone().filter(|n| !n.is_empty()) else {
            continue;
        };
        // Later duplicates win, as in the reference.
        set.policies.insert(ns, resolve(&p, v)?);
    }
    for t in snapshot.tenants.unwrap_or_default() {
        let Some(id) = t.tenant_id.filter(|n| !n.is_empty()) else {
            continue;
        };
        set.quotas
            .insert(id, t.max_index_entries.unwrap_or(0).max(0));
    }
    Ok(set)
}

/// Resolves one entry of a body of `version` into the values the server
/// uses. v<4: a 0 matched-tokens floor means "unset" → 64. Null floor,
/// affinity and strategy switches take their defaults in every version,
/// which is what v<5/v<6/v<7 normalization produces.
fn resolve(p: &ResolvedPolicy, version: i64) -> Result<TenantPolicy, PolicyError> {
    let defaults = TenantPolicy::default();
    let (ranking, ttft) = match (&p.routing, version >= 8) {
        (Some(r), true) => resolve_routing(r).map_err(|e| PolicyError::Decode(e.to_string()))?,
        _ => (defaults.ranking, defaults.ttft),
    };
    let mut matched = p.minimum_matched_tokens.unwrap_or(0);
    if version < 4 && matched == 0 {
        matched = DEFAULT_MINIMUM_MATCHED_TOKENS;
    }
    let strategy = p.strategy.unwrap_or_default();
    Ok(TenantPolicy {
        eviction_ttl: p
            .eviction_ttl
            .filter(|&ns| ns > 0)
            .map(|ns| Duration::from_nanos(ns.unsigned_abs())),
        minimum_prefix_tokens: p.minimum_prefix_tokens.unwrap_or(0).max(0),
        minimum_matched_tokens: matched.max(0),
        routing_floor_score: p
            .routing_floor_score
            .map_or(DEFAULT_ROUTING_FLOOR_SCORE, |f| f.max(0.0)),
        lookup_timeout: p
            .lookup_timeout_ms
            .filter(|&ms| ms > 0)
            .map(|ms| Duration::from_millis(u64::from(ms.unsigned_abs()))),
        affinity_routing: p.affinity_routing.unwrap_or(defaults.affinity_routing),
        eviction: EvictionAlgorithm::from_policy_str(p.eviction.as_deref().unwrap_or("")),
        enable_chain_matching: strategy
            .enable_chain_matching
            .unwrap_or(defaults.enable_chain_matching),
        require_chain: strategy.require_chain.unwrap_or(defaults.require_chain),
        enable_tenant_hot: strategy
            .enable_tenant_hot
            .unwrap_or(defaults.enable_tenant_hot),
        has_policy: true,
        ranking,
        ttft,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(s: &str) -> Result<PolicySet, PolicyError> {
        decode_policy_json(s.as_bytes())
    }

    #[test]
    fn version_constant_is_eight() {
        assert_eq!(POLICY_PROPAGATION_VERSION, 8);
    }

    #[test]
    fn v8_routing_is_resolved_and_ignored_before_v8() {
        use inferencecache_index::{RankingMode, TtftWeights};
        let body = |v: i64| {
            format!(
                r#"{{"version":{v},"policies":[{{"namespace":"a","routing":{{"ranking":"contract","prefillMicrosPerToken":80,"t2ReloadCost":2,"pressureMicros":-1,"tentativeTTLSeconds":0,"loadBound":2.5}}}}]}}"#
            )
        };
        // Out-of-range numbers are refused by the strict decoder
        // (`validate.rs`); lenient mode clamps them, as resolution always does.
        assert!(decode(&body(8)).is_err());
        let p = decode_policy_json_lenient(body(8).as_bytes())
            .unwrap()
            .policies["a"];
        assert_eq!(p.ranking, Some(RankingMode::Contract));
        assert_eq!(p.ttft.prefill_us_per_token, 80.0);
        assert_eq!(p.ttft.t2_reload, 1.0, "clamped to [0, 1]");
        assert_eq!(p.ttft.pressure_us, 0.0, "negative clamped to 0");
        assert!(p.ttft.tentative_ttl.is_zero());
        assert_eq!(p.ttft.load_bound, 2.5);
        let old = decode(&body(7)).unwrap().policies["a"];
        assert_eq!(old.ranking, None);
        assert_eq!(old.ttft, TtftWeights::default());
        let e =
            decode(r#"{"version":8,"policies":[{"namespace":"a","routing":{"ranking":"best"}}]}"#)
                .unwrap_err()
                .to_string();
        assert!(
            e.starts_with("decode policy snapshot: routing.ranking"),
            "{e}"
        );
        let e = decode(r#"{"version":8,"policies":[{"namespace":"a","routing":{"bogus":1}}]}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn marshal_wire_shape_is_pinned() {
        let snap = PolicySnapshot {
            version: 7,
            policies: Some(vec![ResolvedPolicy {
                namespace: Some("team-a".into()),
                routing_floor_score: Some(0.0),
                ..Default::default()
            }]),
            tenants: Some(vec![ResolvedTenant {
                tenant_id: Some("tenant-a".into()),
                max_index_entries: Some(10),
                isolation_mode: None,
            }]),
        };
        assert_eq!(
            serde_json::to_string(&snap).unwrap(),
            r#"{"version":7,"policies":[{"namespace":"team-a","routingFloorScore":0.0}],"tenants":[{"tenantID":"tenant-a","maxIndexEntries":10}]}"#
        );
    }

    #[test]
    fn v3_body_gets_the_matched_tokens_floor_default() {
        let set = decode(r#"{"version":3,"policies":[{"namespace":"a"}]}"#).unwrap();
        let p = set.policies["a"];
        assert_eq!(p.minimum_matched_tokens, 64);
        assert!((p.routing_floor_score - 0.1).abs() < f32::EPSILON);
        assert!(p.affinity_routing && p.enable_chain_matching && p.enable_tenant_hot);
        assert!(!p.require_chain);
    }

    #[test]
    fn v4_explicit_zero_floor_is_kept_and_routing_floor_normalized() {
        let set =
            decode(r#"{"version":4,"policies":[{"namespace":"a","minimumMatchedTokens":0}]}"#)
                .unwrap();
        assert_eq!(set.policies["a"].minimum_matched_tokens, 0);
        assert!((set.policies["a"].routing_floor_score - 0.1).abs() < f32::EPSILON);
    }

    #[test]
    fn v5_explicit_routing_floor_zero_is_kept() {
        let set = decode(r#"{"version":5,"policies":[{"namespace":"a","routingFloorScore":0}]}"#)
            .unwrap();
        assert_eq!(set.policies["a"].routing_floor_score, 0.0);
    }

    #[test]
    fn explicit_strategy_is_kept() {
        // requireChain without chain matching is out of schema (refused by
        // default, validate.rs); the reference keeps it as sent.
        let set = decode_policy_json_lenient(
            r#"{"version":6,"policies":[{"namespace":"a","strategy":{"enableChainMatching":false,"requireChain":true,"enableTenantHot":false}}]}"#
                .as_bytes(),
        )
        .unwrap();
        let p = set.policies["a"];
        assert!(!p.enable_chain_matching && p.require_chain && !p.enable_tenant_hot);
    }

    #[test]
    fn v6_affinity_null_normalizes_to_true_and_v7_explicit_false_is_kept() {
        let set = decode(r#"{"version":6,"policies":[{"namespace":"a"}]}"#).unwrap();
        assert!(set.policies["a"].affinity_routing);
        let set = decode(r#"{"version":7,"policies":[{"namespace":"a","affinityRouting":false}]}"#)
            .unwrap();
        assert!(!set.policies["a"].affinity_routing);
    }

    #[test]
    fn versions_outside_the_window_are_rejected() {
        for v in ["2", "9", "0"] {
            let e = decode(&format!(r#"{{"version":{v}}}"#)).unwrap_err();
            assert_eq!(e.to_string(), "unsupported policy snapshot version");
        }
        let e = decode(r#"{"policies":[]}"#).unwrap_err();
        assert!(matches!(e, PolicyError::Version(0)));
    }

    #[test]
    fn unknown_fields_and_non_json_are_decode_errors() {
        for body in [
            r#"{"version":7,"bogus":1}"#,
            r#"{"version":7,"policies":[{"namespace":"a","ttl":5}]}"#,
            "not json",
            "",
        ] {
            let e = decode(body).unwrap_err().to_string();
            assert!(e.starts_with("decode policy snapshot: "), "{body}: {e}");
        }
    }

    #[test]
    fn trailing_content_after_the_first_value_is_ignored() {
        assert!(decode(r#"{"version":7} garbage"#).is_ok());
    }

    #[test]
    fn oversized_body_is_refused() {
        let body = vec![b' '; MAX_POLICY_BODY_BYTES + 1];
        assert!(matches!(
            decode_policy_json(&body),
            Err(PolicyError::Decode(_))
        ));
    }

    #[test]
    fn empty_keys_are_dropped_negatives_clamped_duplicates_last_wins() {
        // Negatives are refused by default; the reference's clamping is the
        // lenient mode.
        let set = decode_policy_json_lenient(
            r#"{"version":7,
                "policies":[{"namespace":""},{"namespace":"a","minimumMatchedTokens":-5,"routingFloorScore":-1,"lookupTimeoutMs":-3},
                            {"namespace":"b","eviction":"LRU"},{"namespace":"b","eviction":"LfU"}],
                "tenants":[{"tenantID":"","maxIndexEntries":3},{"tenantID":"t","maxIndexEntries":-7}]}"#
                .as_bytes(),
        )
        .unwrap();
        assert_eq!(set.policies.len(), 2);
        assert_eq!(set.policies["a"].minimum_matched_tokens, 0);
        assert_eq!(set.policies["a"].routing_floor_score, 0.0);
        assert_eq!(set.policies["a"].lookup_timeout, None);
        assert_eq!(set.policies["b"].eviction, EvictionAlgorithm::Lfu);
        assert_eq!(set.quotas.len(), 1);
        assert_eq!(set.quotas["t"], 0);
    }

    #[test]
    fn eviction_ttl_is_go_duration_nanoseconds() {
        let set = decode(r#"{"version":7,"policies":[{"namespace":"a","evictionTTL":60000000000,"lookupTimeoutMs":25}]}"#)
            .unwrap();
        assert_eq!(
            set.policies["a"].eviction_ttl,
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            set.policies["a"].lookup_timeout,
            Some(Duration::from_millis(25))
        );
    }
}

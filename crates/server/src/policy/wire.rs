//! The `/policy` JSON wire types (`server.md` §4.1), exactly as the controller
//! marshals them, and their decoding into a [`PolicySet`].

use super::resolved::{EvictionAlgorithm, PolicySet, TenantPolicy};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Version the controller writes today.
pub const POLICY_PROPAGATION_VERSION: i64 = 7;
/// Oldest version still accepted (and normalized).
pub const POLICY_MINIMUM_ACCEPTED_VERSION: i64 = 3;
/// Matched-tokens floor when a tenant has no policy (and for v3 bodies that leave it 0).
pub const DEFAULT_MINIMUM_MATCHED_TOKENS: i32 = 64;
/// Routing floor when a tenant has no policy or leaves it null.
pub const DEFAULT_ROUTING_FLOOR_SCORE: f32 = 0.1;
/// Largest accepted `/policy` body.
pub const MAX_POLICY_BODY_BYTES: usize = 1 << 20;

/// The pushed document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySnapshot {
    /// Wire version, 3 to 7.
    #[serde(default)]
    pub version: i64,
    /// One entry per CachePolicy namespace (== tenant_id).
    #[serde(default)]
    pub policies: Option<Vec<ResolvedPolicy>>,
    /// CacheTenant quotas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<ResolvedTenant>>,
}

/// One namespace's policy. Every field is optional on the wire; `null` and
/// absent mean the same.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ResolvedPolicy {
    /// Namespace, matched against `tenant_id`. Empty entries are dropped.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Index TTL in nanoseconds (Go `time.Duration`); <= 0 keeps the default.
    #[serde(default, rename = "evictionTTL", skip_serializing_if = "is_zero_opt")]
    pub eviction_ttl: Option<i64>,
    /// Prompts shorter than this get no prefix hint; <= 0 disables.
    #[serde(default, skip_serializing_if = "is_zero_opt")]
    pub minimum_prefix_tokens: Option<i32>,
    /// Matches shorter than this are not hints; 0 opts out (v4+).
    #[serde(default, skip_serializing_if = "is_zero_opt")]
    pub minimum_matched_tokens: Option<i32>,
    /// Top scores below this are not hints; null = 0.1, 0 opts out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_floor_score: Option<f32>,
    /// Per-lookup budget in milliseconds; <= 0 = none.
    #[serde(default, skip_serializing_if = "is_zero_opt")]
    pub lookup_timeout_ms: Option<i32>,
    /// AFFINITY_HINT fallback; null = on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_routing: Option<bool>,
    /// Cap victim order: "lfu" (any case) or LRU.
    #[serde(default, skip_serializing_if = "is_empty_opt")]
    pub eviction: Option<String>,
    /// Matching strategy switches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<StrategyWire>,
}

/// `strategy` object; each switch null = its default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StrategyWire {
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_chain_matching: Option<bool>,
    /// Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_chain: Option<bool>,
    /// Default true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_tenant_hot: Option<bool>,
}

/// One CacheTenant quota.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolvedTenant {
    /// Tenant id; empty entries are dropped.
    #[serde(default, rename = "tenantID")]
    pub tenant_id: Option<String>,
    /// Budget of distinct prefixes; negative is clamped to 0.
    #[serde(default, rename = "maxIndexEntries")]
    pub max_index_entries: Option<i64>,
    /// Carried, unused (only Fairness exists).
    #[serde(
        default,
        rename = "isolationMode",
        skip_serializing_if = "is_empty_opt"
    )]
    pub isolation_mode: Option<String>,
}

#[allow(clippy::ref_option)] // serde's skip_serializing_if passes &Option<T>
fn is_zero_opt<T: Default + PartialEq>(v: &Option<T>) -> bool {
    v.as_ref().is_none_or(|x| *x == T::default())
}

#[allow(clippy::ref_option)]
fn is_empty_opt(v: &Option<String>) -> bool {
    v.as_ref().is_none_or(String::is_empty)
}

/// Why a policy document was refused.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Not JSON, unknown field, wrong type, or too large.
    #[error("decode policy snapshot: {0}")]
    Decode(String),
    /// Version outside [3, 7].
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
    decode_first(body)?.into_policy_set()
}

/// [`decode_policy_json`] without the schema checks: negative numbers are
/// clamped to 0 and unknown eviction strings read as LRU, as the reference
/// does (`--lenient-policy-validation`).
pub fn decode_policy_json_lenient(body: &[u8]) -> Result<PolicySet, PolicyError> {
    decode_first(body)?.resolve()
}

fn decode_first(body: &[u8]) -> Result<PolicySnapshot, PolicyError> {
    if body.len() > MAX_POLICY_BODY_BYTES {
        return Err(PolicyError::Decode("http: request body too large".into()));
    }
    let mut stream = serde_json::Deserializer::from_slice(body).into_iter::<PolicySnapshot>();
    let snapshot = match stream.next() {
        Some(Ok(s)) => s,
        Some(Err(e)) => return Err(PolicyError::Decode(e.to_string())),
        None => return Err(PolicyError::Decode("EOF".into())),
    };
    Ok(snapshot)
}

impl PolicySnapshot {
    /// Checks the version and the values, normalizes older bodies and
    /// resolves defaults.
    pub fn into_policy_set(self) -> Result<PolicySet, PolicyError> {
        super::validate::check(&self)?;
        self.resolve()
    }

    /// Checks the version, normalizes older bodies and resolves defaults.
    fn resolve(self) -> Result<PolicySet, PolicyError> {
        let v = self.version;
        if !(POLICY_MINIMUM_ACCEPTED_VERSION..=POLICY_PROPAGATION_VERSION).contains(&v) {
            return Err(PolicyError::Version(v));
        }
        let mut set = PolicySet {
            version: v,
            ..PolicySet::default()
        };
        for p in self.policies.unwrap_or_default() {
            let Some(ns) = p.namespace.clone().filter(|n| !n.is_empty()) else {
                continue;
            };
            // Later duplicates win, as in the reference.
            set.policies.insert(ns, p.resolve(v));
        }
        for t in self.tenants.unwrap_or_default() {
            let Some(id) = t.tenant_id.filter(|n| !n.is_empty()) else {
                continue;
            };
            set.quotas
                .insert(id, t.max_index_entries.unwrap_or(0).max(0));
        }
        Ok(set)
    }
}

impl ResolvedPolicy {
    /// Resolves one entry of a body of `version` into the values the server
    /// uses. v<4: a 0 matched-tokens floor means "unset" → 64. Null floor,
    /// affinity and strategy switches take their defaults in every version,
    /// which is what v<5/v<6/v<7 normalization produces.
    fn resolve(&self, version: i64) -> TenantPolicy {
        let defaults = TenantPolicy::default();
        let mut matched = self.minimum_matched_tokens.unwrap_or(0);
        if version < 4 && matched == 0 {
            matched = DEFAULT_MINIMUM_MATCHED_TOKENS;
        }
        let strategy = self.strategy.unwrap_or_default();
        TenantPolicy {
            eviction_ttl: self
                .eviction_ttl
                .filter(|&ns| ns > 0)
                .map(|ns| Duration::from_nanos(ns.unsigned_abs())),
            minimum_prefix_tokens: self.minimum_prefix_tokens.unwrap_or(0).max(0),
            minimum_matched_tokens: matched.max(0),
            routing_floor_score: self
                .routing_floor_score
                .map_or(DEFAULT_ROUTING_FLOOR_SCORE, |f| f.max(0.0)),
            lookup_timeout: self
                .lookup_timeout_ms
                .filter(|&ms| ms > 0)
                .map(|ms| Duration::from_millis(u64::from(ms.unsigned_abs()))),
            affinity_routing: self.affinity_routing.unwrap_or(defaults.affinity_routing),
            eviction: EvictionAlgorithm::from_policy_str(self.eviction.as_deref().unwrap_or("")),
            enable_chain_matching: strategy
                .enable_chain_matching
                .unwrap_or(defaults.enable_chain_matching),
            require_chain: strategy.require_chain.unwrap_or(defaults.require_chain),
            enable_tenant_hot: strategy
                .enable_tenant_hot
                .unwrap_or(defaults.enable_tenant_hot),
            has_policy: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(s: &str) -> Result<PolicySet, PolicyError> {
        decode_policy_json(s.as_bytes())
    }

    #[test]
    fn version_constant_is_seven() {
        assert_eq!(POLICY_PROPAGATION_VERSION, 7);
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
        for v in ["2", "8", "0"] {
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

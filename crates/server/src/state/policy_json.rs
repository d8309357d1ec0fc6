//! The policy set as `/policy` JSON, for snapshots: every resolved value is
//! written explicitly in the set's own version, so decoding it with the
//! `/policy` decoder gives the same set back.

use crate::policy::{EvictionAlgorithm, PolicySet};
use crate::policy::{PolicySnapshot, ResolvedPolicy, ResolvedTenant, RoutingWire, StrategyWire};

/// Encodes a policy set; empty for the no-policy set (version 0).
pub fn encode(set: &PolicySet) -> Vec<u8> {
    if set.version == 0 {
        return Vec::new();
    }
    let mut names: Vec<&String> = set.policies.keys().collect();
    names.sort();
    let policies = names
        .into_iter()
        .filter_map(|ns| set.policies.get(ns).map(|p| (ns, p)))
        .map(|(ns, p)| ResolvedPolicy {
            namespace: Some(ns.clone()),
            eviction_ttl: p
                .eviction_ttl
                .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
            minimum_prefix_tokens: Some(p.minimum_prefix_tokens),
            minimum_matched_tokens: Some(p.minimum_matched_tokens),
            routing_floor_score: Some(p.routing_floor_score),
            lookup_timeout_ms: p
                .lookup_timeout
                .map(|d| i32::try_from(d.as_millis()).unwrap_or(i32::MAX)),
            affinity_routing: Some(p.affinity_routing),
            eviction: Some(
                match p.eviction {
                    EvictionAlgorithm::Lfu => "lfu",
                    EvictionAlgorithm::Lru => "lru",
                }
                .into(),
            ),
            strategy: Some(StrategyWire {
                enable_chain_matching: Some(p.enable_chain_matching),
                require_chain: Some(p.require_chain),
                enable_tenant_hot: Some(p.enable_tenant_hot),
            }),
            // Resolved weights, written in full; versions before 8 ignore it.
            routing: (set.version >= 8).then(|| RoutingWire {
                ranking: p.ranking.map(|r| r.name().to_owned()),
                prefill_micros_per_token: Some(p.ttft.prefill_us_per_token),
                request_overhead_micros: Some(p.ttft.request_overhead_us),
                pressure_micros: Some(p.ttft.pressure_us),
                t2_reload_cost: Some(p.ttft.t2_reload),
                t3_reload_cost: Some(p.ttft.t3_reload),
                affinity_max_pressure: Some(p.ttft.affinity_max_pressure),
                tentative_ttl_seconds: Some(p.ttft.tentative_ttl.as_secs_f64()),
                load_bound: Some(p.ttft.load_bound),
            }),
        })
        .collect();
    let mut tenants: Vec<(&String, &i64)> = set.quotas.iter().collect();
    tenants.sort();
    let snap = PolicySnapshot {
        version: set.version,
        policies: Some(policies),
        tenants: Some(
            tenants
                .into_iter()
                .map(|(t, q)| ResolvedTenant {
                    tenant_id: Some(t.clone()),
                    max_index_entries: Some(*q),
                    isolation_mode: None,
                })
                .collect(),
        ),
    };
    serde_json::to_vec(&snap).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{decode_policy_json, decode_policy_json_lenient};

    #[test]
    fn every_version_round_trips_through_the_policy_decoder() {
        for v in 3..=8 {
            let body = format!(
                r#"{{"version":{v},"policies":[
                    {{"namespace":"a","evictionTTL":60000000000,"minimumPrefixTokens":32,"routingFloorScore":0,"lookupTimeoutMs":7,"affinityRouting":false,"eviction":"LFU","strategy":{{"requireChain":true,"enableTenantHot":false}},"routing":{{"ranking":"contract","requestOverheadMicros":7000,"t3ReloadCost":0.5,"tentativeTTLSeconds":30,"loadBound":1.5}}}},
                    {{"namespace":"b"}}],
                  "tenants":[{{"tenantID":"a","maxIndexEntries":10}},{{"tenantID":"c","maxIndexEntries":-4}}]}}"#
            );
            // Lenient: the negative quota is clamped, as a reference
            // controller's push would be; what is encoded back is valid.
            let set = decode_policy_json_lenient(body.as_bytes()).expect("valid body");
            let back = decode_policy_json(&encode(&set)).expect("encoded body decodes");
            assert_eq!(back, set, "version {v}");
        }
        assert!(encode(&PolicySet::default()).is_empty());
    }
}

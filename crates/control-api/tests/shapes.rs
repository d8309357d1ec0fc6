//! The JSON shapes the server and the operator exchange, pinned.

use inferencecache_control_api::pd::{PdTopology, Transport};
use inferencecache_control_api::policy::{PolicySnapshot, ResolvedPolicy};
use inferencecache_control_api::snapshot::{GoF32, ReplicaJson, SnapshotJson, TenantJson};
use inferencecache_control_api::templates::{PromptTemplate, SlotKind};

#[test]
fn templates_body_is_an_array_of_templates() {
    let body = r#"[{"namespace":"t","name":"chat","body":"{{ sys }} {{ user }}",
        "slots":[{"name":"sys","type":"Stable"},{"name":"user","type":"Mutable","required":true}]}]"#;
    let v: Vec<PromptTemplate> = serde_json::from_str(body).unwrap();
    assert_eq!(v[0].revision, None);
    assert_eq!(v[0].slots[1].kind, SlotKind::Mutable);
    assert_eq!(v[0].slots[1].required, Some(true));
    let bad = r#"[{"namespace":"t","name":"c","body":"x","slots":[{"name":"a","type":"Other"}]}]"#;
    assert!(serde_json::from_str::<Vec<PromptTemplate>>(bad).is_err());
    let unknown = r#"[{"namespace":"t","name":"c","body":"x","bogus":1}]"#;
    assert!(serde_json::from_str::<Vec<PromptTemplate>>(unknown).is_err());
}

#[test]
fn pd_body_is_an_array_of_topologies_with_transport_spelled_as_in_the_contract() {
    let body = r#"[{"namespace":"t","name":"pd","prefillReplicas":["p1"],"decodeReplicas":["d1","d2"],"transport":"NIXL"}]"#;
    let v: Vec<PdTopology> = serde_json::from_str(body).unwrap();
    assert_eq!(v[0].transport, Transport::Nixl);
    assert_eq!(v[0].transport.as_str(), "NIXL");
    let round: Vec<PdTopology> = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
    assert_eq!(round, v);
    let defaulted: Vec<PdTopology> =
        serde_json::from_str(r#"[{"namespace":"t","name":"pd"}]"#).unwrap();
    assert_eq!(defaulted[0].transport, Transport::Direct);
}

#[test]
fn snapshot_round_trips_and_omits_optional_keys() {
    let snap = SnapshotJson {
        replicas: vec![ReplicaJson {
            replica_id: "r1".into(),
            hit_rate: GoF32(0.25),
            last_update: "0001-01-01T00:00:00Z".into(),
            last_event_at: "0001-01-01T00:00:00Z".into(),
            ..Default::default()
        }],
        tenants: vec![TenantJson {
            tenant_id: "t".into(),
            index_entries: 3,
            ..Default::default()
        }],
        total_prefixes: 3,
        hot_prefixes: 0,
        ..Default::default()
    };
    let text = serde_json::to_string(&snap).unwrap();
    assert!(!text.contains("statsReported") && !text.contains("clientVersion"));
    assert!(text.contains(r#""hitRate":0.25"#));
    let back: SnapshotJson = serde_json::from_str(&text).unwrap();
    assert_eq!(back, snap);
}

#[test]
fn policy_document_serializes_like_the_controller() {
    let doc = PolicySnapshot {
        version: 7,
        policies: Some(vec![ResolvedPolicy {
            namespace: Some("a".into()),
            minimum_matched_tokens: Some(32),
            ..Default::default()
        }]),
        tenants: None,
    };
    assert_eq!(
        serde_json::to_string(&doc).unwrap(),
        r#"{"version":7,"policies":[{"namespace":"a","minimumMatchedTokens":32}]}"#
    );
}

#[test]
fn snapshot_store_keys_are_additive() {
    // A body without them (the reference's, or an older server's) decodes.
    let old: SnapshotJson =
        serde_json::from_str(r#"{"replicas":[],"tenants":[],"totalPrefixes":0,"hotPrefixes":0}"#)
            .unwrap();
    assert!(old.templates.is_empty() && old.pd_topologies.is_empty());
    let text = serde_json::to_string(&SnapshotJson::default()).unwrap();
    assert!(
        text.contains(r#""templates":[],"pdTopologies":[]"#),
        "{text}"
    );
}

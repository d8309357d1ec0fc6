//! PromptTemplate and PDTopology objects → the `/templates` and
//! `/pd-topologies` push bodies. A PDTopology pool's `matchLabels` are
//! resolved to the names of the matching pods in its namespace (pod name =
//! replica id, as the injected sidecar reports it).

use crate::crd::{PDTopology, Pool, PromptTemplate, SlotType, Transport};
use crate::push::{PushError, list_all};
use inferencecache_control_api::pd::{PdTopology, Transport as WireTransport};
use inferencecache_control_api::templates::{
    PromptTemplate as WireTemplate, SlotKind, TemplateSlot,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;

/// One template's wire form (revision = the object's generation).
pub fn template_wire(t: &PromptTemplate) -> WireTemplate {
    WireTemplate {
        namespace: t.namespace().unwrap_or_default(),
        name: t.name_any(),
        revision: t.metadata.generation.map(|g| g.to_string()),
        body: t.spec.body.clone(),
        slots: t
            .spec
            .slots
            .iter()
            .map(|s| TemplateSlot {
                name: s.name.clone(),
                kind: match s.slot_type {
                    SlotType::Stable => SlotKind::Stable,
                    SlotType::Mutable => SlotKind::Mutable,
                },
                required: s.required,
                description: s.description.clone(),
            })
            .collect(),
    }
}

/// Every PromptTemplate, sorted by (namespace, name).
pub async fn templates_document(client: &Client) -> Result<Vec<WireTemplate>, PushError> {
    let list: Vec<PromptTemplate> = list_all(client, "PromptTemplate").await?;
    let mut out: Vec<WireTemplate> = list.iter().map(template_wire).collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(out)
}

fn label_selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The pods of the pools: a pool with no labels selects nothing.
fn pool_members(pods: &[Pod], pools: &[Pool]) -> Vec<String> {
    let mut names: Vec<String> = pods
        .iter()
        .filter(|p| {
            pools.iter().any(|pool| {
                !pool.match_labels.is_empty()
                    && pool
                        .match_labels
                        .iter()
                        .all(|(k, v)| p.labels().get(k) == Some(v))
            })
        })
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    names.dedup();
    names
}

/// One topology's wire form, given its namespace's pods.
pub fn topology_wire(t: &PDTopology, pods: &[Pod]) -> PdTopology {
    PdTopology {
        namespace: t.namespace().unwrap_or_default(),
        name: t.name_any(),
        prefill_replicas: pool_members(pods, &t.spec.prefill_pools),
        decode_replicas: pool_members(pods, &t.spec.decode_pools),
        transport: match t.spec.transport.unwrap_or_default() {
            Transport::Mooncake => WireTransport::Mooncake,
            Transport::Nixl => WireTransport::Nixl,
            Transport::Direct => WireTransport::Direct,
        },
    }
}

/// Every PDTopology with its pools resolved, sorted by (namespace, name).
pub async fn pd_document(client: &Client) -> Result<Vec<PdTopology>, PushError> {
    let list: Vec<PDTopology> = list_all(client, "PDTopology").await?;
    let mut out = Vec::with_capacity(list.len());
    for t in &list {
        let ns = t.namespace().unwrap_or_default();
        // Only the pods some pool could select: one list per pool selector.
        let mut pods: Vec<Pod> = Vec::new();
        for pool in t.spec.prefill_pools.iter().chain(&t.spec.decode_pools) {
            if pool.match_labels.is_empty() {
                continue;
            }
            let lp = ListParams::default().labels(&label_selector(&pool.match_labels));
            match Api::<Pod>::namespaced(client.clone(), &ns).list(&lp).await {
                Ok(l) => pods.extend(l.items),
                Err(source) => {
                    return Err(PushError::List {
                        kind: "Pod",
                        source,
                    });
                }
            }
        }
        out.push(topology_wire(t, &pods));
    }
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{PDTopologySpec, PromptTemplateSpec, Slot};

    fn pod(name: &str, role: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.name = Some(name.into());
        p.metadata.labels = Some(BTreeMap::from([("role".into(), role.into())]));
        p
    }

    #[test]
    fn pools_resolve_to_sorted_pod_names_and_transport_defaults_to_direct() {
        let pool = |name: &str, role: &str| Pool {
            name: name.into(),
            match_labels: BTreeMap::from([("role".into(), role.into())]),
            ..Default::default()
        };
        let mut t = PDTopology::new(
            "pd",
            PDTopologySpec {
                prefill_pools: vec![pool("p", "prefill")],
                decode_pools: vec![pool("d", "decode"), Pool::default()],
                ..Default::default()
            },
        );
        t.metadata.namespace = Some("ns".into());
        let pods = [
            pod("z", "prefill"),
            pod("a", "prefill"),
            pod("d1", "decode"),
            pod("x", "other"),
        ];
        let w = topology_wire(&t, &pods);
        assert_eq!(w.prefill_replicas, ["a", "z"]);
        assert_eq!(w.decode_replicas, ["d1"]);
        assert_eq!(w.transport, WireTransport::Direct);
        assert_eq!(serde_json::to_value(&w).unwrap()["transport"], "Direct");
    }

    #[test]
    fn templates_carry_body_slots_and_generation() {
        let mut t = PromptTemplate::new(
            "greet",
            PromptTemplateSpec {
                body: "Hello {{name}}".into(),
                slots: vec![Slot {
                    name: "name".into(),
                    slot_type: SlotType::Mutable,
                    required: Some(true),
                    description: None,
                }],
            },
        );
        t.metadata.namespace = Some("ns".into());
        t.metadata.generation = Some(3);
        let w = template_wire(&t);
        assert_eq!(
            serde_json::to_value(&w).unwrap(),
            serde_json::json!({"namespace": "ns", "name": "greet", "revision": "3",
                "body": "Hello {{name}}",
                "slots": [{"name": "name", "type": "Mutable", "required": true}]})
        );
    }
}

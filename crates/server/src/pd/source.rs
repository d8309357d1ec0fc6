//! Where topologies come from: the `POST /pd-topologies` body and
//! `--pd-topology-file` (the same list, as YAML or JSON). Every topology is
//! validated before anything is put in force: one bad entry refuses the
//! whole push or reload.

use super::Topology;
use crate::named::{FileKind, NamedSet, Source};
use crate::store_metrics::StoreMetrics;
use crate::watch::{decode_yaml_or_json, read_limited};
use inferencecache_control_api::pd::PdTopology;
use std::path::Path;

fn validate(t: PdTopology) -> Result<(String, Topology), String> {
    let bad_part = |s: &str| s.is_empty() || s.contains('/');
    if bad_part(&t.namespace) || bad_part(&t.name) {
        return Err(format!(
            "pd topology {:?}/{:?}: namespace and name must be non-empty and hold no '/'",
            t.namespace, t.name
        ));
    }
    let key = format!("{}/{}", t.namespace, t.name);
    let pool = |mut ids: Vec<String>, which: &str| {
        if ids.iter().any(String::is_empty) {
            return Err(format!("pd topology {key}: empty replica id in {which}"));
        }
        ids.sort();
        ids.dedup();
        Ok(ids)
    };
    let topology = Topology {
        prefill: pool(t.prefill_replicas, "prefillReplicas")?,
        decode: pool(t.decode_replicas, "decodeReplicas")?,
        transport: t.transport.as_str().to_owned(),
        namespace: t.namespace,
        name: t.name,
    };
    Ok((key, topology))
}

fn build(list: Vec<PdTopology>, source: Source) -> Result<NamedSet<Topology>, String> {
    let items = list
        .into_iter()
        .map(validate)
        .collect::<Result<Vec<_>, _>>()?;
    NamedSet::build(items, source).map_err(|e| format!("pd topology {e}"))
}

/// Decodes and validates a `POST /pd-topologies` body.
pub(crate) fn decode_pd_topologies_json(body: &[u8]) -> Result<NamedSet<Topology>, String> {
    let list: Vec<PdTopology> =
        serde_json::from_slice(body).map_err(|e| format!("decode pd topologies: {e}"))?;
    build(list, Source::Http)
}

/// Reads a `--pd-topology-file`.
pub(crate) fn load_pd_topology_file(path: &Path) -> Result<NamedSet<Topology>, String> {
    let bytes = read_limited(path, crate::policy::MAX_POLICY_BODY_BYTES)?;
    let list: Vec<PdTopology> = decode_yaml_or_json(path, &bytes)?;
    build(list, Source::File).map_err(|e| format!("{}: {e}", path.display()))
}

/// `--pd-topology-file`: how it loads and what it records.
pub(crate) static PD_TOPOLOGY_FILE: FileKind<Topology> = FileKind {
    load: load_pd_topology_file,
    loaded: "pd_topology_file_loaded",
    reload_failed: "pd_topology_file_reload_failed",
    applied: StoreMetrics::pd_topologies_applied,
    rejected: StoreMetrics::pd_topologies_rejected,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_sorted_and_deduplicated() {
        let set = decode_pd_topologies_json(
            br#"[{"namespace":"n","name":"pd","prefillReplicas":["p2","p1","p2"],"decodeReplicas":["d1"],"transport":"NIXL"}]"#,
        )
        .unwrap();
        let t = set.get("n/pd").unwrap();
        assert_eq!(t.prefill, ["p1", "p2"]);
        assert_eq!(t.transport, "NIXL");
    }

    #[test]
    fn bad_entries_refuse_the_whole_list() {
        for (body, want) in [
            (
                r#"[{"namespace":"","name":"x","prefillReplicas":[],"decodeReplicas":[],"transport":"Direct"}]"#,
                "non-empty",
            ),
            (
                r#"[{"namespace":"n","name":"x","prefillReplicas":[""],"decodeReplicas":[],"transport":"Direct"}]"#,
                "empty replica id",
            ),
            (
                r#"[{"namespace":"n","name":"x","prefillReplicas":[],"decodeReplicas":[],"transport":"Carrier pigeon"}]"#,
                "decode pd topologies",
            ),
            (r#"{}"#, "decode pd topologies"),
        ] {
            let e = decode_pd_topologies_json(body.as_bytes()).unwrap_err();
            assert!(e.contains(want), "{body}: {e}");
        }
    }

    #[test]
    fn yaml_file_loads() {
        let p = std::env::temp_dir().join(format!("ic-pd-{}.yaml", std::process::id()));
        std::fs::write(
            &p,
            "- namespace: n\n  name: pd\n  prefillReplicas: [p1]\n  decodeReplicas: [d1, d2]\n  transport: Mooncake\n",
        )
        .unwrap();
        let set = load_pd_topology_file(&p).unwrap();
        assert_eq!(set.get("n/pd").unwrap().decode, ["d1", "d2"]);
        assert_eq!(set.source(), Source::File);
    }
}

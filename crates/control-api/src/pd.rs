//! The `/pd-topologies` push body: prefill/decode pools for `LookupPDRoute`.
//!
//! `POST /pd-topologies` takes a JSON array of [`PdTopology`] and replaces the
//! whole set (replace-on-write). `--pd-topology-file` holds the same list as
//! YAML or JSON. The operator resolves a PDTopology's pool label selectors to
//! replica ids (pod names) when it pushes.

use serde::{Deserialize, Serialize};

/// One topology, addressed as `namespace/name` by `pd_topology_ref`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PdTopology {
    /// Namespace (the tenant).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Replica ids that run prefill.
    #[serde(default)]
    pub prefill_replicas: Vec<String>,
    /// Replica ids that run decode.
    #[serde(default)]
    pub decode_replicas: Vec<String>,
    /// KV transfer between the two pools, returned as `transport_hint`.
    #[serde(default)]
    pub transport: Transport,
}

/// How KV moves from the prefill to the decode replica.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Transport {
    /// Mooncake transfer engine.
    Mooncake,
    /// NVIDIA NIXL.
    #[serde(rename = "NIXL")]
    Nixl,
    /// Direct engine-to-engine transfer.
    #[default]
    Direct,
}

impl Transport {
    /// The wire spelling, as returned in `transport_hint`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mooncake => "Mooncake",
            Self::Nixl => "NIXL",
            Self::Direct => "Direct",
        }
    }
}

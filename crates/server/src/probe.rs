//! The functional self-test behind `POST /probe` (`server.md` §10): ingest a
//! synthetic prefix for a backend under the reserved probe tenant, check that
//! the low-level lookup and the routing lookup both find it, then clear it.
//! Runs in process, bypassing the gRPC guards that hide the probe tenant.

use crate::reserved_tenant::PROBE_TENANT;
use inferencecache_index::{
    CacheEvent, CacheUpdate, EventKind, Index, LookupRequest, PrefixEntry, ReplicaStatsReport,
    Strategy, Tier,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Tokens of the probe's single block.
pub(crate) const PROBE_TOKEN_COUNT: i32 = 16;
/// Largest accepted request body.
pub(crate) const MAX_PROBE_BODY_BYTES: usize = 4 << 10;

/// The request body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ProbeRequest {
    /// Backend (CacheBackend "namespace/name").
    #[serde(default)]
    pub backend: String,
    /// Model.
    #[serde(default)]
    pub model: String,
    /// Hash scheme.
    #[serde(default)]
    pub hash_scheme: String,
    /// Backend type ("" = LMCache). Accepted (the body is decoded with
    /// `deny_unknown_fields`) but not read: no probe stage depends on it yet.
    #[serde(default)]
    #[allow(dead_code)]
    pub backend_type: String,
}

/// One stage's failure.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct StageError {
    /// ingest, routing or t2.
    pub stage: &'static str,
    /// What went wrong.
    pub message: String,
}

/// The response body.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(crate) struct ProbeResponse {
    /// Echo of the request's backend.
    pub backend: String,
    /// ok / failed / skipped.
    pub ingest: &'static str,
    /// ok / failed / skipped.
    pub routing: &'static str,
    /// ok / failed / skipped (no T2 prober is wired: always skipped).
    pub t2: &'static str,
    /// Failures, omitted when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<StageError>,
}

/// Why a probe request was refused (400).
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeRequestError {
    /// Not JSON or unknown field.
    #[error("decode probe request: {0}")]
    Decode(String),
    /// More than one JSON value.
    #[error("probe request body has trailing content after the first JSON value")]
    Trailing,
    /// A required field is empty.
    #[error("probe request missing required field (backend, model, hashScheme)")]
    Missing,
}

/// Parses a probe body: exactly one JSON object with the required fields.
pub(crate) fn parse_probe_request(body: &[u8]) -> Result<ProbeRequest, ProbeRequestError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let req =
        ProbeRequest::deserialize(&mut de).map_err(|e| ProbeRequestError::Decode(e.to_string()))?;
    de.end().map_err(|_| ProbeRequestError::Trailing)?;
    if req.backend.is_empty() || req.model.is_empty() || req.hash_scheme.is_empty() {
        return Err(ProbeRequestError::Missing);
    }
    Ok(req)
}

/// The probe's 32-byte hash: SHA-256 over a domain tag and the
/// length-prefixed scheme, model and backend.
pub(crate) fn probe_hash(backend: &str, model: &str, hash_scheme: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"inferencecache.io/probe/v1\n");
    for part in [hash_scheme, model, backend] {
        let len = u32::try_from(part.len()).unwrap_or(u32::MAX);
        h.update(len.to_be_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().into()
}

/// One mutex per (backend, model), so concurrent probes of a backend queue.
type ProbeLocks = HashMap<(String, String), Arc<Mutex<()>>>;

/// Runs probes, one at a time per (backend, model).
#[derive(Debug, Default, Clone)]
pub(crate) struct Prober {
    locks: Arc<Mutex<ProbeLocks>>,
}

impl Prober {
    fn lock_for(&self, backend: &str, model: &str) -> Arc<Mutex<()>> {
        let mut map = match self.locks.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        Arc::clone(
            map.entry((backend.to_owned(), model.to_owned()))
                .or_default(),
        )
    }

    /// Runs one probe against `index` (blocking; call off the async runtime).
    pub(crate) fn run(&self, index: &Index, req: &ProbeRequest) -> ProbeResponse {
        let lock = self.lock_for(&req.backend, &req.model);
        let _serial = match lock.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let replica = format!("__probe-{}", req.backend);
        let hash = probe_hash(&req.backend, &req.model, &req.hash_scheme).to_vec();
        let mut resp = ProbeResponse {
            backend: req.backend.clone(),
            ingest: "skipped",
            routing: "skipped",
            t2: "skipped",
            errors: Vec::new(),
        };
        index.ingest(&CacheUpdate {
            replica_id: replica.clone(),
            model_id: req.model.clone(),
            tenant_id: PROBE_TENANT.to_owned(),
            hash_scheme: req.hash_scheme.clone(),
            timestamp_us: 0,
            prefixes: vec![PrefixEntry {
                block_hashes: vec![hash.clone()],
                block_token_counts: vec![PROBE_TOKEN_COUNT],
                tier: Tier::T1,
                ..Default::default()
            }],
            stats: Some(ReplicaStatsReport {
                hit_rate: 1.0,
                ..Default::default()
            }),
            adapter_id: String::new(),
        });
        self.stages(index, req, &replica, &hash, &mut resp);
        // Cleanup always runs.
        index.apply_event(&CacheEvent {
            kind: EventKind::AllCleared,
            replica_id: replica,
            model_id: req.model.clone(),
            tenant_id: PROBE_TENANT.to_owned(),
            prefix_hash: Vec::new(),
            timestamp_us: 0,
            adapter_id: String::new(),
        });
        resp
    }

    fn stages(
        &self,
        index: &Index,
        req: &ProbeRequest,
        replica: &str,
        hash: &[u8],
        resp: &mut ProbeResponse,
    ) {
        let chain = [hash.to_vec()];
        let counts = [PROBE_TOKEN_COUNT];
        let lookup =
            LookupRequest::new(PROBE_TENANT, &req.model, &req.hash_scheme).chain(&chain, &counts);
        let holds = |scores: &[inferencecache_index::ReplicaScore]| {
            scores.iter().any(|s| &*s.replica_id == replica)
        };
        if !holds(&index.lookup(&lookup).scores) {
            resp.ingest = "failed";
            resp.errors.push(StageError {
                stage: "ingest",
                message: format!(
                    "in-process ingest of the probe prefix for {replica} was not visible to lookup"
                ),
            });
            return;
        }
        resp.ingest = "ok";
        let routed = index.lookup_route(&lookup);
        if routed.strategy != Strategy::PrefixMatch {
            resp.routing = "failed";
            resp.errors.push(StageError {
                stage: "routing",
                message: format!(
                    "LookupRoute returned {}, expected PREFIX_MATCH — the index did not route to the probe prefix",
                    crate::route::strategy_reason(routed.strategy)
                ),
            });
            return;
        }
        if !holds(&routed.scores) {
            resp.routing = "failed";
            resp.errors.push(StageError {
                stage: "routing",
                message: format!("LookupRoute did not rank the probe replica {replica}"),
            });
            return;
        }
        resp.routing = "ok";
        // Stage C needs a T2 prober, which no server wires yet: skipped.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn probe_hash_matches_the_cross_check_vector() {
        assert_eq!(
            hex(&probe_hash("ns/cb", "m", "vllm")),
            "b59ef690abed72afcf5a454ca8415705f23a0b14dc90176da5c6c9e36040f024"
        );
        assert_ne!(
            probe_hash("a", "bc", "d"),
            probe_hash("ab", "c", "d"),
            "injective"
        );
    }

    #[test]
    fn happy_path_and_no_residue() {
        let index = Index::builder().build();
        let req =
            parse_probe_request(br#"{"backend":"ns/cb","model":"m","hashScheme":"vllm"}"#).unwrap();
        let resp = Prober::default().run(&index, &req);
        assert_eq!(
            (resp.ingest, resp.routing, resp.t2),
            ("ok", "ok", "skipped")
        );
        assert!(resp.errors.is_empty());
        assert_eq!(index.total_entries(), 0, "cleanup removed the probe entry");
        assert_eq!(index.snapshot().replicas.len(), 0);
    }

    #[test]
    fn bad_requests() {
        assert!(matches!(
            parse_probe_request(br#"{"backend":"b","model":"m"}"#),
            Err(ProbeRequestError::Missing)
        ));
        assert!(matches!(
            parse_probe_request(br#"{"backend":"b","model":"m","hashScheme":"v"} {}"#),
            Err(ProbeRequestError::Trailing)
        ));
        assert!(matches!(
            parse_probe_request(br#"{"backend":"b","model":"m","hashScheme":"v","x":1}"#),
            Err(ProbeRequestError::Decode(_))
        ));
    }
}

//! Resource limits (issue 18: "every resource has a limit"): the knobs, their
//! defaults, the producer-side checks and the counters of what was refused.
//!
//! What a client sees past each limit:
//! - an id (replica, tenant, model, scheme, adapter, client version) longer
//!   than `--max-id-bytes`, a prefix or block hash longer than
//!   `--max-hash-bytes`, or an empty `replica_id` on ReportCacheState /
//!   PublishEvent: `INVALID_ARGUMENT` naming the field (the stream ends; what
//!   it delivered before stays ingested);
//! - a new replica past `--index-max-replicas`: `RESOURCE_EXHAUSTED`;
//! - a request message past `--max-grpc-message-bytes`: `RESOURCE_EXHAUSTED`
//!   (see `grpc_limits.rs`); an undecodable one: `INVALID_ARGUMENT`;
//! - `prompt_text` past the tokenizer's concurrency or memory budget: an
//!   immediate `NO_HINT` (counted in `inferencecache_lookup_shed_total`);
//! - an HTTP client that sends no complete header within
//!   `--http-header-timeout` or no complete body within `--http-body-timeout`:
//!   the connection is closed / `408 Request Timeout`.
//!
//! Every refusal is counted in `inferencecache_requests_rejected_total{reason}`.

use crate::grpc_error::GrpcError;
pub use inferencecache_index::DEFAULT_MAX_REPLICAS;
use inferencecache_proto::v1alpha1::{CacheEvent, CacheStateUpdate};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::time::Duration;

/// Default `--max-id-bytes`: Kubernetes names are at most 253 bytes; model
/// ids such as `Qwen/Qwen3-8B` are far shorter.
pub const DEFAULT_MAX_ID_BYTES: usize = 256;
/// Default `--max-hash-bytes`: fingerprints are 8 bytes, SHA-256 keys 32.
pub const DEFAULT_MAX_HASH_BYTES: usize = 64;
/// Default `--tokenize-concurrency` (the reference's 64 is far more than two
/// cores can serve; each slot may hold a large prompt's buffers).
pub const DEFAULT_TOKENIZE_CONCURRENCY: usize = 8;
/// Default `--tokenize-memory-budget-bytes`.
pub const DEFAULT_TOKENIZE_MEMORY_BUDGET: usize = 512 << 20;
/// Bytes of tokenizer working memory charged per byte of `prompt_text` on
/// the fast encode (allow-listed GPT-4-style tokenizers, `tokenize/split.rs`)
/// and tiktoken: the request's copy, the rendered template, its NFC copy
/// when it is not NFC, ids and piece offsets (about a token per 4 bytes),
/// and the prefix cache's entry. Measured (issue 36): 16 clients flooding
/// 1 MiB prompts, 8 in flight, peak +231 MiB over the base, ~29 MiB each
/// with the gRPC buffers of the queued requests.
pub const TOKENIZE_BYTES_PER_PROMPT_BYTE: usize = 48;
/// The same for a tokenizer outside the allow-list, encoded by HF with its
/// offsets and per-byte alignment tables: ~143 MiB per 1 MiB prompt in
/// flight (issue 36's flood: +1,142 MiB with 8 in flight).
pub const HF_TOKENIZE_BYTES_PER_PROMPT_BYTE: usize = 160;
/// Default `--http-header-timeout` (the reference's ReadHeaderTimeout).
pub const DEFAULT_HTTP_HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Default `--http-body-timeout`.
pub const DEFAULT_HTTP_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// Every limit the server enforces outside the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest id string in bytes; 0 = unlimited.
    pub max_id_bytes: usize,
    /// Longest prefix / block hash in bytes; 0 = unlimited.
    pub max_hash_bytes: usize,
    /// Accept an empty `replica_id` from producers (the reference does).
    pub accept_empty_replica_id: bool,
    /// Largest gRPC request message in bytes.
    pub max_grpc_message_bytes: usize,
    /// Tokenizations running at once.
    pub tokenize_concurrency: usize,
    /// Tokenizer working memory all running tokenizations may claim.
    pub tokenize_memory_budget: usize,
    /// Time an HTTP client has to send a complete request head.
    pub http_header_timeout: Duration,
    /// Time an HTTP handler waits for a complete request body.
    pub http_body_timeout: Duration,
    /// `/policy` clamps out-of-schema values as the reference does instead
    /// of refusing them with 400.
    pub lenient_policy_validation: bool,
    /// Threads applying ingest and events (0 = inline on the runtime).
    pub ingest_lanes: usize,
    /// gRPC connections write the responses of one scheduler round with one
    /// syscall (`write_coalesce`).
    pub grpc_write_coalescing: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_id_bytes: DEFAULT_MAX_ID_BYTES,
            max_hash_bytes: DEFAULT_MAX_HASH_BYTES,
            accept_empty_replica_id: false,
            max_grpc_message_bytes: crate::grpc_limits::DEFAULT_MAX_GRPC_MESSAGE_BYTES,
            tokenize_concurrency: DEFAULT_TOKENIZE_CONCURRENCY,
            tokenize_memory_budget: DEFAULT_TOKENIZE_MEMORY_BUDGET,
            http_header_timeout: DEFAULT_HTTP_HEADER_TIMEOUT,
            http_body_timeout: DEFAULT_HTTP_BODY_TIMEOUT,
            lenient_policy_validation: false,
            ingest_lanes: crate::ingest_lane::default_lanes(),
            grpc_write_coalescing: true,
        }
    }
}

impl Limits {
    fn id(&self, field: &str, value: &str) -> Result<(), GrpcError> {
        if self.max_id_bytes > 0 && value.len() > self.max_id_bytes {
            return Err(GrpcError::FieldTooLong {
                field: field.to_owned(),
                len: value.len(),
                max: self.max_id_bytes,
                flag: "--max-id-bytes",
            });
        }
        Ok(())
    }

    fn hash(&self, field: &str, value: &[u8]) -> Result<(), GrpcError> {
        if self.max_hash_bytes > 0 && value.len() > self.max_hash_bytes {
            return Err(GrpcError::FieldTooLong {
                field: field.to_owned(),
                len: value.len(),
                max: self.max_hash_bytes,
                flag: "--max-hash-bytes",
            });
        }
        Ok(())
    }

    fn replica(&self, replica_id: &str) -> Result<(), GrpcError> {
        if replica_id.is_empty() && !self.accept_empty_replica_id {
            return Err(GrpcError::EmptyReplicaId);
        }
        self.id("replica_id", replica_id)
    }

    /// Checks one ReportCacheState message.
    pub fn check_update(&self, u: &CacheStateUpdate) -> Result<(), GrpcError> {
        self.replica(&u.replica_id)?;
        self.id("tenant_id", &u.tenant_id)?;
        self.id("model_id", &u.model_id)?;
        self.id("hash_scheme", &u.hash_scheme)?;
        self.id("adapter_id", &u.adapter_id)?;
        if let Some(s) = &u.stats {
            self.id("stats.client_version", &s.client_version)?;
        }
        for (i, e) in u.prefixes.iter().enumerate() {
            self.id(&format!("prefixes[{i}].adapter_id"), &e.adapter_id)?;
            self.hash(&format!("prefixes[{i}].prefix_hash"), &e.prefix_hash)?;
            if let Some(j) = e
                .block_hashes
                .iter()
                .position(|h| self.max_hash_bytes > 0 && h.len() > self.max_hash_bytes)
            {
                self.hash(
                    &format!("prefixes[{i}].block_hashes[{j}]"),
                    &e.block_hashes[j],
                )?;
            }
        }
        Ok(())
    }

    /// Checks one PublishEvent.
    pub fn check_event(&self, e: &CacheEvent) -> Result<(), GrpcError> {
        self.replica(&e.replica_id)?;
        self.id("tenant_id", &e.tenant_id)?;
        self.id("model_id", &e.model_id)?;
        self.id("adapter_id", &e.adapter_id)?;
        self.hash("prefix_hash", &e.prefix_hash)
    }
}

/// Label of the limit counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabel {
    /// Which limit.
    pub reason: String,
}

/// Counters and gauges of the limits.
#[derive(Debug, Clone, Default)]
pub struct LimitMetrics {
    /// Requests refused with a status: `invalid_argument`,
    /// `replica_limit`, `oversize`, `undecodable`, `http_body_timeout`.
    pub rejected: Family<LimitLabel, Counter>,
    /// LookupRoute calls answered NO_HINT at once because a tokenizer
    /// limit was reached: `tokenize_concurrency`, `tokenize_memory`,
    /// `prompt_too_large`.
    pub shed: Family<LimitLabel, Counter>,
    /// `--index-max-replicas`.
    pub index_max_replicas: Gauge,
    /// Tokenizer working memory claimed by running tokenizations.
    pub tokenize_memory_bytes: Gauge,
}

impl LimitMetrics {
    /// Registers every series in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "inferencecache_requests_rejected",
            "Requests refused by a limit or as malformed, by reason (invalid_argument|replica_limit|oversize|undecodable|http_body_timeout)",
            self.rejected.clone(),
        );
        registry.register(
            "inferencecache_lookup_shed",
            "LookupRoute calls answered NO_HINT at once because a tokenizer limit was reached, by reason (tokenize_concurrency|tokenize_memory|prompt_too_large)",
            self.shed.clone(),
        );
        registry.register(
            "inferencecache_index_max_replicas",
            "Limit on distinct replica ids (--index-max-replicas); 0 = unbounded",
            self.index_max_replicas.clone(),
        );
        registry.register(
            "inferencecache_tokenize_memory_bytes",
            "Tokenizer working memory claimed by running prompt_text tokenizations",
            self.tokenize_memory_bytes.clone(),
        );
    }

    /// The refusal counter of `reason` (for layers that count on their own).
    pub fn counter(&self, reason: &str) -> Counter {
        self.rejected
            .get_or_create(&LimitLabel {
                reason: reason.to_owned(),
            })
            .clone()
    }

    /// Counts one refusal.
    pub fn reject(&self, reason: &str) {
        self.rejected
            .get_or_create(&LimitLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts one shed lookup.
    pub fn shed(&self, reason: &str) {
        self.shed
            .get_or_create(&LimitLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferencecache_proto::v1alpha1::{PrefixEntry, ReplicaStats};

    fn update() -> CacheStateUpdate {
        CacheStateUpdate {
            replica_id: "r".into(),
            tenant_id: "t".into(),
            model_id: "m".into(),
            hash_scheme: "vllm".into(),
            prefixes: vec![PrefixEntry {
                prefix_hash: vec![1; 8],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn message(r: Result<(), GrpcError>) -> String {
        let s = tonic::Status::from(r.expect_err("must be refused"));
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        s.message().to_owned()
    }

    #[test]
    fn every_id_field_is_bounded_and_named() {
        let l = Limits::default();
        assert!(l.check_update(&update()).is_ok());
        let long = "x".repeat(DEFAULT_MAX_ID_BYTES + 1);
        type Mutate<'a> = Box<dyn Fn(&mut CacheStateUpdate) + 'a>;
        let cases: Vec<(&str, Mutate)> = vec![
            ("replica_id", Box::new(|u| u.replica_id = long.clone())),
            ("tenant_id", Box::new(|u| u.tenant_id = long.clone())),
            ("model_id", Box::new(|u| u.model_id = long.clone())),
            ("hash_scheme", Box::new(|u| u.hash_scheme = long.clone())),
            ("adapter_id", Box::new(|u| u.adapter_id = long.clone())),
            (
                "prefixes[0].adapter_id",
                Box::new(|u| u.prefixes[0].adapter_id = long.clone()),
            ),
            (
                "stats.client_version",
                Box::new(|u| {
                    u.stats = Some(ReplicaStats {
                        client_version: long.clone(),
                        ..Default::default()
                    })
                }),
            ),
            (
                "prefixes[0].prefix_hash",
                Box::new(|u| u.prefixes[0].prefix_hash = vec![0; DEFAULT_MAX_HASH_BYTES + 1]),
            ),
            (
                "prefixes[0].block_hashes[1]",
                Box::new(|u| {
                    u.prefixes[0].block_hashes = vec![vec![0; 8], vec![0; 65]];
                    u.prefixes[0].block_token_counts = vec![16, 16];
                }),
            ),
        ];
        for (field, mutate) in cases {
            let mut u = update();
            mutate(&mut u);
            let m = message(l.check_update(&u));
            assert!(m.starts_with(field), "{field}: {m}");
        }
        // At the limit is fine.
        let mut u = update();
        u.model_id = "x".repeat(DEFAULT_MAX_ID_BYTES);
        assert!(l.check_update(&u).is_ok());
        // 0 disables.
        let off = Limits {
            max_id_bytes: 0,
            max_hash_bytes: 0,
            ..Limits::default()
        };
        u.model_id = "x".repeat(1 << 20);
        u.prefixes[0].prefix_hash = vec![0; 1 << 16];
        assert!(off.check_update(&u).is_ok());
    }

    #[test]
    fn empty_replica_is_refused_unless_compat_mode() {
        let mut u = update();
        u.replica_id.clear();
        assert!(message(Limits::default().check_update(&u)).contains("replica_id is empty"));
        let e = CacheEvent::default();
        assert!(message(Limits::default().check_event(&e)).contains("replica_id is empty"));
        let compat = Limits {
            accept_empty_replica_id: true,
            ..Limits::default()
        };
        assert!(compat.check_update(&u).is_ok());
        assert!(compat.check_event(&e).is_ok());
    }
}

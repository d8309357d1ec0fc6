//! What the server knows about each producer identity: when it last wrote,
//! what it was refused, its open streams and its block bucket. Exposed as
//! metrics (`inferencecache_producer_*{identity}`) and as the additive
//! `producers` key of `/snapshot` (present only when producer auth is on,
//! so the reference's key set is unchanged by default).
//!
//! Rows exist only for authenticated identities, so their number is bounded
//! by the cluster's namespaces (or the CA's issued names), not by callers.

use super::ratelimit::{Bucket, Limits};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

/// Why a producer's update was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Wrote a tenant it is not entitled to (PERMISSION_DENIED).
    PermissionDenied,
    /// Over its blocks/s budget (RESOURCE_EXHAUSTED).
    RateLimited,
    /// Over its open-stream cap (RESOURCE_EXHAUSTED).
    TooManyStreams,
}

impl Rejection {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::PermissionDenied => "permission_denied",
            Self::RateLimited => "rate_limited",
            Self::TooManyStreams => "too_many_streams",
        }
    }
    fn slot(self) -> usize {
        self as usize
    }
}

/// Label: one producer identity.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IdentityLabel {
    /// Namespace (or CN) the writes are scoped to.
    pub identity: String,
}

/// Labels: identity and rejection reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RejectedLabels {
    /// Namespace (or CN).
    pub identity: String,
    /// permission_denied, rate_limited or too_many_streams.
    pub reason: String,
}

/// Label: an authentication outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthResultLabel {
    /// ok, unauthenticated or unavailable.
    pub result: String,
}

/// One identity's live state.
#[derive(Debug)]
pub struct IdentityState {
    identity: String,
    subject: RwLock<String>,
    last_seen_ms: AtomicI64,
    rejected: [AtomicU64; 3],
    blocks: AtomicU64,
    pub(super) streams: AtomicU32,
    pub(super) bucket: Mutex<Bucket>,
    /// This identity's series, resolved once (no label allocation per update).
    blocks_total: Counter,
    last_seen_gauge: Gauge,
    streams_gauge: Gauge,
}

/// The producer metrics and the identity table.
pub struct ProducerMetrics {
    table: RwLock<HashMap<String, Arc<IdentityState>>>,
    /// Producer authentication outcomes.
    pub auth: Family<AuthResultLabel, Counter>,
    /// Consumer (lookup) authentication outcomes, when `--consumer-auth`.
    pub consumer_auth: Family<AuthResultLabel, Counter>,
    rejected: Family<RejectedLabels, Counter>,
    blocks: Family<IdentityLabel, Counter>,
    last_seen: Family<IdentityLabel, Gauge>,
    streams: Family<IdentityLabel, Gauge>,
}

impl std::fmt::Debug for ProducerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerMetrics").finish_non_exhaustive()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl ProducerMetrics {
    /// Creates the families and registers them.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            table: RwLock::new(HashMap::new()),
            auth: Family::default(),
            consumer_auth: Family::default(),
            rejected: Family::default(),
            blocks: Family::default(),
            last_seen: Family::default(),
            streams: Family::default(),
        };
        registry.register(
            "inferencecache_producer_auth",
            "Producer (ReportCacheState/PublishEvent) authentication outcomes (ok|unauthenticated|unavailable)",
            m.auth.clone(),
        );
        registry.register(
            "inferencecache_consumer_auth",
            "Consumer (lookup) authentication outcomes with --consumer-auth (ok|unauthenticated|unavailable)",
            m.consumer_auth.clone(),
        );
        registry.register(
            "inferencecache_producer_rejected",
            "Producer updates refused, by identity and reason (permission_denied|rate_limited|too_many_streams)",
            m.rejected.clone(),
        );
        registry.register(
            "inferencecache_producer_blocks",
            "Blocks (index keys written or removed) admitted per producer identity",
            m.blocks.clone(),
        );
        registry.register(
            "inferencecache_producer_last_seen_timestamp_ms",
            "Unix time in milliseconds of the last admitted update per producer identity",
            m.last_seen.clone(),
        );
        registry.register(
            "inferencecache_producer_open_streams",
            "Open ReportCacheState streams per producer identity",
            m.streams.clone(),
        );
        m
    }

    /// The state of `identity`, created on first use.
    pub fn identity(&self, identity: &str, subject: &str, limits: &Limits) -> Arc<IdentityState> {
        let read = match self.table.read() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        if let Some(s) = read.get(identity) {
            return Arc::clone(s);
        }
        drop(read);
        let mut table = match self.table.write() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        Arc::clone(table.entry(identity.to_owned()).or_insert_with(|| {
            let label = IdentityLabel {
                identity: identity.to_owned(),
            };
            Arc::new(IdentityState {
                blocks_total: self.blocks.get_or_create(&label).clone(),
                last_seen_gauge: self.last_seen.get_or_create(&label).clone(),
                streams_gauge: self.streams.get_or_create(&label).clone(),
                identity: identity.to_owned(),
                subject: RwLock::new(subject.to_owned()),
                last_seen_ms: AtomicI64::new(0),
                rejected: Default::default(),
                blocks: AtomicU64::new(0),
                streams: AtomicU32::new(0),
                bucket: Mutex::new(Bucket::new(limits, Instant::now())),
            })
        }))
    }

    /// Counts admitted blocks and refreshes last-seen.
    pub fn admitted(&self, s: &IdentityState, subject: &str, blocks: u64) {
        let now = now_ms();
        s.last_seen_ms.store(now, Ordering::Relaxed);
        s.blocks.fetch_add(blocks, Ordering::Relaxed);
        s.blocks_total.inc_by(blocks);
        s.last_seen_gauge.set(now);
        let stale = match s.subject.read() {
            Ok(cur) => *cur != subject,
            Err(_) => false,
        };
        if stale {
            if let Ok(mut cur) = s.subject.write() {
                subject.clone_into(&mut cur);
            }
        }
    }

    /// Counts one refusal.
    pub fn rejected(&self, s: &IdentityState, why: Rejection) {
        s.rejected[why.slot()].fetch_add(1, Ordering::Relaxed);
        self.rejected
            .get_or_create(&RejectedLabels {
                identity: s.identity.clone(),
                reason: why.label().to_owned(),
            })
            .inc();
    }

    /// Sets the open-stream gauge from the state.
    pub fn streams_changed(&self, s: &IdentityState) {
        s.streams_gauge
            .set(i64::from(s.streams.load(Ordering::Relaxed)));
    }

    /// One row per identity, sorted by identity, for `/snapshot`.
    pub fn snapshot(&self) -> Vec<ProducerJson> {
        let table = match self.table.read() {
            Ok(t) => t,
            Err(p) => p.into_inner(),
        };
        let mut rows: Vec<ProducerJson> = table
            .values()
            .map(|s| {
                let last = s.last_seen_ms.load(Ordering::Relaxed);
                ProducerJson {
                    identity: s.identity.clone(),
                    subject: s.subject.read().map(|g| g.clone()).unwrap_or_default(),
                    last_seen: crate::snapshot::rfc3339_nano((last > 0).then(|| last * 1_000_000)),
                    blocks: s.blocks.load(Ordering::Relaxed),
                    open_streams: s.streams.load(Ordering::Relaxed),
                    rejected_permission: s.rejected[0].load(Ordering::Relaxed),
                    rejected_rate: s.rejected[1].load(Ordering::Relaxed),
                    rejected_streams: s.rejected[2].load(Ordering::Relaxed),
                }
            })
            .collect();
        rows.sort_by(|a, b| a.identity.cmp(&b.identity));
        rows
    }
}

pub use inferencecache_control_api::snapshot::ProducerJson;

//! Every gRPC error the server answers, in one table (as [`HttpError`] is for
//! HTTP): one variant per outcome, its status code in [`GrpcError::code`] and
//! a message that says what to do next. Code below the handlers returns
//! `GrpcError`; the conversion to `tonic::Status` happens once, here (the
//! handlers' `?` goes through `From`).
//!
//! [`HttpError`]: crate::http::error::HttpError

use inferencecache_proto::RETRY_PUSHBACK_KEY;
use std::time::Duration;
use tonic::{Code, Status};

/// A refused gRPC call or report stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrpcError {
    /// An id or hash field over its configured limit.
    #[error("{field} is {len} bytes; the limit is {max} ({flag})")]
    FieldTooLong {
        /// The field, e.g. `prefixes[2].prefix_hash`.
        field: String,
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
        /// The flag that sets the limit.
        flag: &'static str,
    },
    /// A report or event without a replica id.
    #[error("replica_id is empty; every report must name its replica")]
    EmptyReplicaId,
    /// A request message over `--max-grpc-message-bytes`.
    #[error(
        "request message too large: {len} bytes; the limit is {max} (--max-grpc-message-bytes)"
    )]
    MessageTooLarge {
        /// The message's declared length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An update from a new replica past `--index-max-replicas`.
    #[error(
        "the index already tracks {max} replicas, its limit (--index-max-replicas); \
         replicas that hold nothing and report nothing are released by the sweep"
    )]
    ReplicaLimit {
        /// The limit.
        max: usize,
    },
    /// The server is draining; a producer's stream must be reopened elsewhere
    /// or after the restart.
    #[error("server shutting down: reconnect and re-report")]
    ShuttingDown,
    /// The replica's producer was declared silent while its stream was open.
    #[error(
        "this replica's producer was silent past --producer-silence and \
         its blocks were withdrawn: reconnect and re-report the full state"
    )]
    ProducerSilent,
    /// Bus mode: the relay may have lost updates.
    #[error("bus relay: {0}; updates may have been lost: reconnect and re-report the full state")]
    BusResync(&'static str),
    /// A StreamCacheEvents subscriber fell behind the index.
    #[error(
        "event stream subscriber fell {behind} events behind the index and was \
         disconnected; reconnect, read faster, or narrow the filter \
         (model_id, tenant_id, types)"
    )]
    SubscriberLagged {
        /// Events it missed.
        behind: u64,
    },
    /// No valid producer or consumer credential (the message says which).
    #[error("{0}")]
    Unauthenticated(String),
    /// The credential could not be checked (TokenReview unreachable).
    #[error("{0}")]
    AuthUnavailable(String),
    /// A producer writing a tenant it is not granted.
    #[error(
        "producer {identity} ({subject}) may not write tenant {tenant:?}: a producer writes its own \
         namespace and the tenants granted to it; nothing of this update was applied"
    )]
    TenantDenied {
        /// The producer's identity.
        identity: String,
        /// Its authenticated subject.
        subject: String,
        /// The tenant it wrote.
        tenant: String,
    },
    /// A producer over `--producer-max-streams`.
    #[error(
        "producer {identity} already has {max} open ReportCacheState streams \
         (--producer-max-streams); close one or retry later"
    )]
    TooManyStreams {
        /// The producer's identity.
        identity: String,
        /// The limit.
        max: u32,
    },
    /// A producer over its ingest rate.
    #[error(
        "producer {identity} is over its ingest limit of {blocks_per_second} blocks/s \
         (burst {burst_blocks}); nothing of this update ({blocks} blocks) was applied; \
         retry in {} ms",
        retry.as_millis().max(1)
    )]
    RateLimited {
        /// The producer's identity.
        identity: String,
        /// `--producer-blocks-per-second`.
        blocks_per_second: u64,
        /// `--producer-burst-blocks`.
        burst_blocks: u64,
        /// Blocks in the refused update.
        blocks: u64,
        /// When the bucket holds enough again.
        retry: Duration,
    },
}

/// How long a producer over its stream limit is told to wait.
const STREAM_RETRY: Duration = Duration::from_secs(1);

impl GrpcError {
    /// The status code of this outcome.
    pub fn code(&self) -> Code {
        match self {
            Self::FieldTooLong { .. } | Self::EmptyReplicaId => Code::InvalidArgument,
            Self::MessageTooLarge { .. }
            | Self::ReplicaLimit { .. }
            | Self::SubscriberLagged { .. }
            | Self::TooManyStreams { .. }
            | Self::RateLimited { .. } => Code::ResourceExhausted,
            Self::ShuttingDown
            | Self::ProducerSilent
            | Self::BusResync(_)
            | Self::AuthUnavailable(_) => Code::Unavailable,
            Self::Unauthenticated(_) => Code::Unauthenticated,
            Self::TenantDenied { .. } => Code::PermissionDenied,
        }
    }

    /// The pushback a client should wait before retrying, when the refusal
    /// is a rate (sent as `grpc-retry-pushback-ms`).
    fn retry(&self) -> Option<Duration> {
        match self {
            Self::TooManyStreams { .. } => Some(STREAM_RETRY),
            Self::RateLimited { retry, .. } => Some(*retry),
            _ => None,
        }
    }
}

impl From<GrpcError> for Status {
    fn from(e: GrpcError) -> Self {
        let code = e.code();
        let retry = e.retry();
        let message = e.to_string();
        match retry {
            Some(wait) => {
                let mut md = tonic::metadata::MetadataMap::new();
                if let Ok(v) = wait.as_millis().max(1).to_string().parse() {
                    md.insert(RETRY_PUSHBACK_KEY, v);
                }
                Status::with_metadata(code, message, md)
            }
            None => Status::new(code, message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_says_when_to_retry_and_a_drain_carries_no_pushback() {
        let e = GrpcError::RateLimited {
            identity: "ns/sa".into(),
            blocks_per_second: 10,
            burst_blocks: 20,
            blocks: 30,
            retry: Duration::from_millis(250),
        };
        assert!(e.to_string().contains("retry in 250 ms"));
        let s = Status::from(GrpcError::ShuttingDown);
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(inferencecache_proto::retry_pushback(&s), None);
    }
}

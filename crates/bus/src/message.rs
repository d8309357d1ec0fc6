//! Bus messages: the contract's own protobuf (`CacheStateUpdate` or
//! `CacheEvent`), with a header naming which.
//!
//! The header is the type tag, so the body stays the exact gRPC message any
//! tool can decode, and a consumer can skip a message of a kind it does not
//! know (a newer producer) without guessing. Messages are *not* stamped by
//! producers: a `timestamp_us` of 0 is resolved by every consumer to the
//! stream's own receive time of the message, one clock for every replica.

use bytes::Bytes;
use inferencecache_proto::v1alpha1::{CacheEvent, CacheStateUpdate};
use prost::Message;

/// Header carrying the message kind.
pub const KIND_HEADER: &str = "Inferencecache-Kind";
/// Kind of a `CacheStateUpdate`.
pub const KIND_UPDATE: &str = "CacheStateUpdate";
/// Kind of a `CacheEvent`.
pub const KIND_EVENT: &str = "CacheEvent";

/// A decoded bus message.
#[derive(Debug, Clone, PartialEq)]
pub enum BusMessage {
    /// A `ReportCacheState` message.
    Update(CacheStateUpdate),
    /// A `PublishEvent` message.
    Event(CacheEvent),
}

impl BusMessage {
    /// Tenant of the message (it picks the subject).
    pub fn tenant(&self) -> &str {
        match self {
            BusMessage::Update(u) => &u.tenant_id,
            BusMessage::Event(e) => &e.tenant_id,
        }
    }

    /// Model of the message (it picks the subject).
    pub fn model(&self) -> &str {
        match self {
            BusMessage::Update(u) => &u.model_id,
            BusMessage::Event(e) => &e.model_id,
        }
    }

    /// The header value naming the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            BusMessage::Update(_) => KIND_UPDATE,
            BusMessage::Event(_) => KIND_EVENT,
        }
    }

    /// Protobuf body.
    pub fn encode_body(&self) -> Bytes {
        match self {
            BusMessage::Update(u) => Bytes::from(u.encode_to_vec()),
            BusMessage::Event(e) => Bytes::from(e.encode_to_vec()),
        }
    }

    /// Decodes a body of the named kind.
    pub fn decode(kind: Option<&str>, body: &[u8]) -> Result<BusMessage, SkipReason> {
        match kind {
            None => Err(SkipReason::MissingKind),
            Some(KIND_UPDATE) => CacheStateUpdate::decode(body)
                .map(BusMessage::Update)
                .map_err(|_| SkipReason::Garbage),
            Some(KIND_EVENT) => CacheEvent::decode(body)
                .map(BusMessage::Event)
                .map_err(|_| SkipReason::Garbage),
            Some(_) => Err(SkipReason::UnknownKind),
        }
    }
}

/// Why a consumer skipped a message (each is counted, none stalls it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// No kind header.
    MissingKind,
    /// A kind this build does not know.
    UnknownKind,
    /// The body does not decode as the named kind.
    Garbage,
    /// A message for the reserved `/probe` tenant.
    ProbeTenant,
}

impl SkipReason {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            SkipReason::MissingKind => "missing_kind",
            SkipReason::UnknownKind => "unknown_kind",
            SkipReason::Garbage => "garbage",
            SkipReason::ProbeTenant => "probe_tenant",
        }
    }

    /// Every reason (for pre-registering metric series).
    pub const ALL: [SkipReason; 4] = [
        SkipReason::MissingKind,
        SkipReason::UnknownKind,
        SkipReason::Garbage,
        SkipReason::ProbeTenant,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_round_trip_and_bad_input_is_named() {
        // A hybrid model's match-end mark (our field 7) crosses the bus as
        // it came: replicas applying it back their matches off alike.
        let u = BusMessage::Update(CacheStateUpdate {
            replica_id: "r".into(),
            tenant_id: "t".into(),
            prefixes: vec![inferencecache_proto::v1alpha1::PrefixEntry {
                block_hashes: vec![vec![2; 8]],
                block_token_counts: vec![32],
                no_match_end: true,
                ..Default::default()
            }],
            ..Default::default()
        });
        let e = BusMessage::Event(CacheEvent {
            r#type: 2,
            prefix_hash: vec![1; 8],
            ..Default::default()
        });
        for m in [&u, &e] {
            assert_eq!(
                BusMessage::decode(Some(m.kind()), &m.encode_body()).as_ref(),
                Ok(m)
            );
        }
        assert_eq!(BusMessage::decode(None, b""), Err(SkipReason::MissingKind));
        assert_eq!(
            BusMessage::decode(Some("CacheSomethingElse"), b""),
            Err(SkipReason::UnknownKind)
        );
        assert_eq!(
            BusMessage::decode(Some(KIND_UPDATE), &[0xff, 0xff, 0xff]),
            Err(SkipReason::Garbage)
        );
    }
}

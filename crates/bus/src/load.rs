//! Shared load: the hints each server replica delivered, coalesced per
//! interval and published on a core-NATS subject outside the stream
//! ([`crate::BusConfig::load_subject`]), so every replica's load estimate
//! counts the whole fleet's deliveries, not 1/N of them.
//!
//! Why not the stream: a delivery is a short-lived load signal (it counts for
//! the milliseconds of prefill it stands for, and for the ranking's two-minute
//! hint count), not state. Persisting it would replay stale load at every
//! restart, and losing one must not cost a full resync of every sidecar, which
//! is what a lost stream message means ([`crate::Producer`]). So a batch is
//! published fire-and-forget: a batch the bus cannot take is dropped and
//! counted, never buffered, never retried, and never waited for by a lookup.
//!
//! The body is protobuf (this schema, our extension beside v1alpha1; field
//! numbers are never reused, new fields are added with the next number):
//!
//! ```proto
//! message DeliveryBatch {
//!   string origin = 1;                    // the publishing server process
//!   int64 sent_unix_ns = 2;               // when it was published
//!   repeated ReplicaDeliveries replicas = 3;
//!   uint64 batch = 4;                     // per-origin counter from 1 (gaps = losses)
//! }
//! message ReplicaDeliveries {
//!   string replica_id = 1;
//!   uint32 hints = 2;                     // hints delivered to it in the interval
//!   double work_us = 3;                   // their estimated prefill work, summed
//!   int64 first_unix_ns = 4;              // the first one's delivery time
//!   int64 last_unix_ns = 5;               // the last one's
//! }
//! ```
//!
//! The origin lets a replica skip its own batches (it applied those hints
//! when it delivered them); it is unique per process, so a restarted replica
//! under the same name is another origin.

use bytes::Bytes;
use prost::Message;

/// Header naming the body's kind on the load subject.
pub const KIND_DELIVERIES: &str = "DeliveryBatch";

/// Header kind of a [`CallerLoadBatch`] on the same subject.
pub const KIND_CALLER_LOAD: &str = "CallerLoadBatch";

/// Replicas per published message at most: a batch over more is split, so a
/// message stays far below NATS's default 1 MiB payload limit whatever the
/// replica ids' lengths (ids are bounded by the server's producer limits).
pub const MAX_REPLICAS_PER_MESSAGE: usize = 1_024;

/// One interval's deliveries of one server replica.
#[derive(Clone, PartialEq, Message)]
pub struct DeliveryBatch {
    /// The publishing server process (name and a per-process nonce).
    #[prost(string, tag = "1")]
    pub origin: String,
    /// When the batch was published, Unix ns.
    #[prost(int64, tag = "2")]
    pub sent_unix_ns: i64,
    /// Deliveries per engine replica.
    #[prost(message, repeated, tag = "3")]
    pub replicas: Vec<ReplicaDeliveries>,
    /// Per-origin batch counter from 1.
    #[prost(uint64, tag = "4")]
    pub batch: u64,
}

/// The hints delivered to one engine replica in one interval.
#[derive(Clone, PartialEq, Message)]
pub struct ReplicaDeliveries {
    /// The engine replica the hints named.
    #[prost(string, tag = "1")]
    pub replica_id: String,
    /// Hints delivered.
    #[prost(uint32, tag = "2")]
    pub hints: u32,
    /// Their estimated prefill work, summed, µs.
    #[prost(double, tag = "3")]
    pub work_us: f64,
    /// The first one's delivery time, Unix ns.
    #[prost(int64, tag = "4")]
    pub first_unix_ns: i64,
    /// The last one's delivery time, Unix ns.
    #[prost(int64, tag = "5")]
    pub last_unix_ns: i64,
}

/// Callers' in-flight reports one server replica received
/// (`ReportCallerLoad`), passed on to the others (issue 36, item 4):
///
/// ```proto
/// message CallerLoadBatch {
///   string origin = 1;                    // the publishing server process
///   int64 sent_unix_ns = 2;
///   repeated CallerLoadEntry loads = 3;
/// }
/// message CallerLoadEntry {
///   string caller = 1;                    // the reporting gateway process
///   string replica_id = 2;                // the engine replica
///   uint32 in_flight = 3;                 // its requests not finished
///   uint64 prefill_tokens = 4;            // their tokens still to prefill
///   int64 at_unix_ns = 5;                 // when the caller counted them
/// }
/// ```
#[derive(Clone, PartialEq, Message)]
pub struct CallerLoadBatch {
    /// The publishing server process.
    #[prost(string, tag = "1")]
    pub origin: String,
    /// When the batch was published, Unix ns.
    #[prost(int64, tag = "2")]
    pub sent_unix_ns: i64,
    /// The reports.
    #[prost(message, repeated, tag = "3")]
    pub loads: Vec<CallerLoadEntry>,
}

/// One caller's count for one engine replica.
#[derive(Clone, PartialEq, Message)]
pub struct CallerLoadEntry {
    /// The reporting caller.
    #[prost(string, tag = "1")]
    pub caller: String,
    /// The engine replica.
    #[prost(string, tag = "2")]
    pub replica_id: String,
    /// Requests not finished.
    #[prost(uint32, tag = "3")]
    pub in_flight: u32,
    /// Their prompt tokens still to prefill.
    #[prost(uint64, tag = "4")]
    pub prefill_tokens: u64,
    /// When the caller counted them, Unix ns.
    #[prost(int64, tag = "5")]
    pub at_unix_ns: i64,
}

impl CallerLoadBatch {
    /// Protobuf body.
    pub fn encode_body(&self) -> Bytes {
        Bytes::from(self.encode_to_vec())
    }

    /// Decodes a body; `None` for one that is not a batch.
    pub fn decode_body(body: &[u8]) -> Option<Self> {
        Self::decode(body).ok()
    }
}

impl DeliveryBatch {
    /// Protobuf body.
    pub fn encode_body(&self) -> Bytes {
        Bytes::from(self.encode_to_vec())
    }

    /// Decodes a body; `None` for one that is not a batch.
    pub fn decode_body(body: &[u8]) -> Option<Self> {
        Self::decode(body).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_round_trips_and_garbage_is_refused() {
        let b = DeliveryBatch {
            origin: "a/1".into(),
            sent_unix_ns: 7,
            replicas: vec![ReplicaDeliveries {
                replica_id: "r".into(),
                hints: 3,
                work_us: 1.5,
                first_unix_ns: 5,
                last_unix_ns: 6,
            }],
            batch: 1,
        };
        assert_eq!(DeliveryBatch::decode_body(&b.encode_body()), Some(b));
        assert_eq!(DeliveryBatch::decode_body(&[0xff, 0xff, 0xff]), None);
    }
}

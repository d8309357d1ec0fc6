//! The inference-cache wire contract (`inferencecache.v1alpha1`), generated at
//! build time from `proto/inferencecache/v1alpha1/inferencecache.proto`.
//!
//! Only the edges of the system (gRPC handlers, the gateway client, the
//! subscriber's reporter) use these types; the index works on its own domain
//! types.

/// Messages, enums, and the `InferenceCache` client and server of package
/// `inferencecache.v1alpha1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1alpha1 {
    tonic::include_proto!("inferencecache.v1alpha1");
}

pub mod codec;
mod reason;

pub use reason::Reason;

/// Encoded `FileDescriptorSet` of the contract, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/inferencecache_descriptor.bin"));

/// Fully qualified service name, as registered in gRPC health and reflection.
pub const SERVICE_NAME: &str = "inferencecache.v1alpha1.InferenceCache";

/// Metadata key of gRPC's retry-pushback hint (milliseconds), sent with
/// `RESOURCE_EXHAUSTED` when a producer is over its ingest limit.
pub const RETRY_PUSHBACK_KEY: &str = "grpc-retry-pushback-ms";

/// The retry-pushback hint a status carries, if any.
pub fn retry_pushback(status: &tonic::Status) -> Option<std::time::Duration> {
    status
        .metadata()
        .get(RETRY_PUSHBACK_KEY)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
        .map(std::time::Duration::from_millis)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn descriptor_set_names_the_service() {
        // The descriptor is what reflection serves; a truncated or empty set
        // would make grpcurl fail to describe the service.
        let text = String::from_utf8_lossy(FILE_DESCRIPTOR_SET);
        assert!(text.contains("inferencecache.v1alpha1"));
        assert!(text.contains("InferenceCache"));
        assert!(text.contains("LookupRoute"));
    }

    #[test]
    fn field_numbers_match_the_contract() {
        // token_ids is field 9 (packed uint32) and adapter_id is field 11.
        let req = v1alpha1::LookupRouteRequest {
            token_ids: vec![1, 2],
            adapter_id: "a".into(),
            ..Default::default()
        };
        let bytes = req.encode_to_vec();
        assert_eq!(bytes, vec![0x4a, 0x02, 0x01, 0x02, 0x5a, 0x01, b'a']);
    }

    #[test]
    fn float_scores_are_fixed32() {
        // field 2, wire type 5 (fixed32) => tag 0x15.
        let s = v1alpha1::ReplicaScore {
            score: 1.0,
            ..Default::default()
        };
        assert_eq!(s.encode_to_vec(), vec![0x15, 0, 0, 0x80, 0x3f]);
    }
}

//! Helpers of the client's suites; the running server itself is
//! `inferencecache_testkit::server`.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use inferencecache_client::{CacheStateUpdate, Client, ClientConfig, PrefixEntry, ReplicaStats};
use std::time::Duration;

/// Policy that turns affinity off, so misses are NO_HINT / TENANT_HOT.
pub(crate) const NO_AFFINITY: &str = r#"{"version":7,"policies":[{"namespace":"t","affinityRouting":false,"minimumMatchedTokens":64}]}"#;

pub(crate) use inferencecache_testkit::server::{Isolated, Running};

/// An SDK client of `s` with a deadline generous enough for a loaded debug build.
pub(crate) async fn sdk(s: &Running) -> Client {
    Client::connect(ClientConfig::new(s.endpoint()).lookup_deadline(Duration::from_secs(5)))
        .await
        .expect("connect")
}

/// A state update for tenant `t`, model `m`, scheme `vllm`.
pub(crate) fn update(replica: &str, prefixes: Vec<PrefixEntry>) -> CacheStateUpdate {
    CacheStateUpdate {
        replica_id: replica.into(),
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        prefixes,
        ..Default::default()
    }
}

/// The chain entry a subscriber would report for `tokens`.
pub(crate) fn chain_entry(tokens: &[u32]) -> PrefixEntry {
    let (block_hashes, block_token_counts) = inferencecache_client::block_hashes(tokens, 16);
    PrefixEntry {
        block_hashes,
        block_token_counts,
        ..Default::default()
    }
}

/// An update whose replica reports a cache hit rate (what makes it "hot").
pub(crate) fn hot_update(replica: &str, prefixes: Vec<PrefixEntry>) -> CacheStateUpdate {
    CacheStateUpdate {
        stats: Some(ReplicaStats {
            hit_rate: 0.8,
            ..Default::default()
        }),
        ..update(replica, prefixes)
    }
}

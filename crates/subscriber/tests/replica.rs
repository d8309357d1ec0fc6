//! Deliveries → updates for a replica with several data-parallel ranks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use bytes::Bytes;
use common::*;
use inferencecache_fingerprint::prefix_hashes;
use inferencecache_subscriber::{
    DecodeOptions, Delivery, MappingConfig, ReplicaState, Tier, Update,
};

fn state() -> ReplicaState {
    ReplicaState::new(MappingConfig::default(), DecodeOptions::default())
}

fn apply(rank: u32, seq: u64, payload: Vec<u8>) -> Delivery {
    Delivery::Apply {
        rank,
        seq,
        payload: Bytes::from(payload),
    }
}

fn report_hashes(out: &[Update]) -> Vec<u64> {
    out.iter()
        .filter_map(|u| match u {
            Update::Report(r) => Some(r.prefix_hash),
            _ => None,
        })
        .collect()
}

#[test]
fn applies_batches_and_counts_bad_events() {
    let mut r = state();
    let mut out = Vec::new();
    let payload = vllm_batch(
        12.5,
        vec![
            vllm_stored(&[1, 2], None, 0..32, 16),
            map(vec![("type", s("BlockStored"))]),
            map(vec![("type", s("Future"))]),
        ],
    );
    assert_eq!(r.handle(&apply(0, 0, payload), &mut out), Some(12.5));
    assert_eq!(
        report_hashes(&out),
        prefix_hashes(&(0..32).collect::<Vec<_>>(), 16)
    );
    assert_eq!(r.stats().bad_events, 1);
    assert_eq!(r.stats().unknown_events, 1);
    let mut out = Vec::new();
    r.handle(&apply(0, 1, vec![0xc1]), &mut out);
    assert!(out.is_empty());
    assert_eq!(r.stats().bad_batches, 1);
    assert_eq!(r.stats().batches, 2);
}

#[test]
fn ranks_are_separate_and_a_restart_re_reports_the_other_ranks() {
    let mut r = state();
    let mut out = Vec::new();
    // the same engine hash on two ranks means two different caches
    r.handle(
        &apply(
            0,
            0,
            vllm_batch(1.0, vec![vllm_stored(&[7], None, 0..16, 16)]),
        ),
        &mut out,
    );
    r.handle(
        &apply(
            1,
            0,
            vllm_batch(1.0, vec![vllm_stored(&[7], None, 100..116, 16)]),
        ),
        &mut out,
    );
    assert_eq!(r.mapping(0).unwrap().tracked_blocks(), 1);
    assert_eq!(r.mapping(1).unwrap().tracked_blocks(), 1);
    // rank 0 restarts: ALL_CLEARED first, then rank 1's blocks again
    let mut out = Vec::new();
    assert_eq!(
        r.handle(&Delivery::EngineRestarted { rank: 0 }, &mut out),
        None
    );
    assert_eq!(out[0], Update::AllCleared);
    assert_eq!(
        report_hashes(&out[1..]),
        prefix_hashes(&(100..116).collect::<Vec<_>>(), 16)
    );
    assert_eq!(r.mapping(0).unwrap().tracked_blocks(), 0);
    assert_eq!(r.stats().engine_restarts, 1);
    // an engine-side AllBlocksCleared on rank 1 does the same for rank 0
    r.handle(
        &apply(
            0,
            0,
            vllm_batch(2.0, vec![vllm_stored(&[8], None, 0..16, 16)]),
        ),
        &mut out,
    );
    let mut out = Vec::new();
    r.handle(
        &apply(
            1,
            1,
            vllm_batch(3.0, vec![map(vec![("type", s("AllBlocksCleared"))])]),
        ),
        &mut out,
    );
    assert_eq!(out[0], Update::AllCleared);
    assert_eq!(
        report_hashes(&out[1..]),
        prefix_hashes(&(0..16).collect::<Vec<_>>(), 16)
    );
    assert_eq!(r.current_reports().len(), 1);
    assert!(r.current_reports().iter().all(|p| p.tier == Tier::T1));
}

#[test]
fn caught_up_drops_held_blocks_and_lost_is_counted() {
    let mut r = state();
    let mut out = Vec::new();
    r.handle(
        &apply(
            0,
            5,
            vllm_batch(1.0, vec![vllm_stored(&[2], Some(1), 16..32, 16)]),
        ),
        &mut out,
    );
    assert!(out.is_empty());
    assert_eq!(r.mapping(0).unwrap().pending_blocks(), 1);
    r.handle(&Delivery::CaughtUp { rank: 0 }, &mut out);
    assert_eq!(r.mapping(0).unwrap().pending_blocks(), 0);
    assert_eq!(r.mapping(0).unwrap().stats().dropped_unknown_parent, 1);
    r.handle(
        &Delivery::Lost {
            rank: 0,
            from: 3,
            to: 4,
        },
        &mut out,
    );
    assert_eq!(r.stats().lost_messages, 2);
    assert!(out.is_empty());
}

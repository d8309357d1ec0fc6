//! The lookup path's part of load sharing (`DeliveryLog::record`) allocates
//! nothing once the replicas have been seen (both swap buffers), counted by
//! an instrumented global allocator. The only test in this binary, so no
//! other test allocates meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use inferencecache_server::delivery_log::{DeliveryLog, DeliveryMap};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;
use std::sync::Arc;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

#[test]
fn recording_deliveries_allocates_nothing_in_steady_state() {
    let log = DeliveryLog::default();
    log.enable();
    let replicas: Vec<Arc<str>> = (0..256)
        .map(|i| Arc::from(format!("replica-{i}")))
        .collect();
    let mut spare = DeliveryMap::new();
    // Warm-up: both maps (the live one and the publisher's) learn every name.
    for _ in 0..2 {
        for r in &replicas {
            log.record(r, 5_000.0, 1);
        }
        log.take(&mut spare);
    }
    // The allocator counts every thread: the test harness may allocate
    // while the pass runs (seen at start-up). The record path is
    // deterministic, so allocations of its own would show in every pass;
    // one clean pass out of three proves there are none.
    let mut seen = Vec::new();
    for _ in 0..3 {
        let region = Region::new(GLOBAL);
        for round in 0..20 {
            for (i, r) in replicas.iter().enumerate().cycle().take(5_000) {
                log.record(r, 1_000.0 + i as f64, round);
            }
            log.take(&mut spare);
        }
        let stats = region.change();
        assert_eq!(
            spare.values().map(|c| u64::from(c.hints)).sum::<u64>(),
            5_000
        );
        if stats.allocations == 0 && stats.reallocations == 0 {
            return;
        }
        seen.push((stats.allocations, stats.reallocations));
    }
    panic!("allocations on the record path in every pass: {seen:?}");
}

//! Concurrency: writers, sweepers and readers in parallel; no lookup may ever
//! see a torn (prefix, replica) entry.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

const TTL_NS: i64 = 30 * 60 * 1_000_000_000;

/// Everything about an entry is a function of its version `v`.
fn tokens_of(v: i32) -> i32 {
    v
}
fn tier_of(v: i32) -> i32 {
    (v % 3) + 1
}
fn ts_us_of(v: i32) -> i64 {
    T0 / 1000 + i64::from(v)
}

#[test]
fn no_lookup_ever_sees_a_torn_entry() {
    let e = Arc::new(Env::with(|c| c.max_entries(2_000)));
    e.pol.set_lfu("t");
    e.pol.set_quota("noise", 700);
    // Freeze "now" one second after T0 so freshness is a pure function of v.
    e.clock.set_ns(T0 + 1_000_000_000);
    let now = e.clock.now_ns();
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();

    // Writers: replica r{w} rewrites hashes 0..8 with increasing versions.
    for w in 0..2 {
        let e = e.clone();
        let stop = stop.clone();
        handles.push(std::thread::spawn(move || {
            let mut v = 1i32;
            while !stop.load(Ordering::Relaxed) && v < 200_000 {
                let prefixes = (0..8u64)
                    .map(|hash| PrefixEntry {
                        prefix_hash: h(hash),
                        token_count: tokens_of(v),
                        tier: Tier::from_wire(tier_of(v)),
                        ..Default::default()
                    })
                    .collect();
                let mut u = upd("t", "m", "vllm", &format!("r{w}"), prefixes);
                u.timestamp_us = ts_us_of(v);
                e.idx.ingest(&u);
                v += 1;
            }
        }));
    }
    // Noise writer: old entries under another tenant force cap evictions.
    {
        let e = e.clone();
        let stop = stop.clone();
        handles.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut u = upd(
                    "noise",
                    "m",
                    "vllm",
                    "n",
                    (0..16).map(|k| legacy(i * 16 + k, 16)).collect(),
                );
                u.timestamp_us = T0 / 1000 - 600_000_000;
                e.idx.ingest(&u);
                i += 1;
            }
        }));
    }
    // Churn: evict / clear / re-add a third replica, sweep.
    {
        let e = e.clone();
        let stop = stop.clone();
        handles.push(std::thread::spawn(move || {
            let mut v = 1i32;
            while !stop.load(Ordering::Relaxed) {
                let mut u = upd(
                    "t",
                    "m",
                    "vllm",
                    "r9",
                    (0..8).map(|x| legacy(x, tokens_of(v))).collect(),
                );
                for p in &mut u.prefixes {
                    p.tier = Tier::from_wire(tier_of(v));
                }
                u.timestamp_us = ts_us_of(v);
                e.idx.ingest(&u);
                e.event(EventKind::PrefixEvicted, "t", "m", "r9", Some(3), "");
                if v % 7 == 0 {
                    e.event(EventKind::AllCleared, "t", "m", "r9", None, "");
                }
                if v % 50 == 0 {
                    e.idx.sweep();
                }
                v += 1;
            }
        }));
    }
    // Readers: exact lookups on every hash; each returned entry must be whole.
    let mut readers = Vec::new();
    for _ in 0..2 {
        let e = e.clone();
        readers.push(std::thread::spawn(move || {
            let mut seen = 0u64;
            let deadline = std::time::Instant::now() + Duration::from_millis(1500);
            while std::time::Instant::now() < deadline {
                for hash in 0..8u64 {
                    let r = e.exact("t", "m", "vllm", hash);
                    for s in &r.scores {
                        let v = s.matched_tokens;
                        assert!(v >= 1, "{s:?}");
                        assert_eq!(s.tier.raw(), tier_of(v), "torn tier: {s:?}");
                        let fresh = freshness(now, ts_us_of(v) * 1000, TTL_NS);
                        assert_eq!(s.estimated_cache_hit_prob, fresh, "torn lastSeen: {s:?}");
                        seen += 1;
                    }
                    e.idx.credit(&r.hits);
                    let hs = [h(0), h(1), h(2), h(3)];
                    let c = [16, 16, 16, 16];
                    let cr = e
                        .idx
                        .lookup_route(&LookupRequest::new("t", "m", "vllm").chain(&hs, &c));
                    for s in &cr.scores {
                        assert!(s.matched_tokens % 16 == 0 && s.matched_tokens > 0);
                    }
                }
            }
            seen
        }));
    }
    let seen: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    assert!(seen > 0);
    // Counters agree with a full recount after the dust settles.
    let snap = e.idx.snapshot();
    let rows: i64 = snap.replicas.iter().map(|r| r.prefix_count).sum();
    assert_eq!(rows as u64, e.idx.total_entries());
    assert!(e.idx.total_entries() <= 2_000);
    assert_eq!(snap.total_prefixes as u64, e.idx.distinct_prefixes());
    assert!(e.idx.cache_state("noise", "m").total_prefixes <= 700);
}

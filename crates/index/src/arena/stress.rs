//! Lookups under churn: walks while writers create, edit, trim and retire
//! runs around them, grow the shards' run arrays and reuse run ids. Any
//! read path (the run locks today, a lock-free one tried and measured in
//! BENCHMARKS.md) must pass it: a reader sees each run before or after a
//! writer's edit, never halfway, never older than it saw before.

use super::tests::Stop;
use super::*;
use crate::types::Tier;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// Stable chains: 16 chains of 20 blocks, each held by one replica; the
/// even ones re-stored all along, the odd ones stored once.
const CHAINS: u64 = 16;
const LEN: usize = 20;

fn stable(k: u64) -> Vec<u64> {
    (0..LEN as u64).map(|d| (k << 40) | (d + 1)).collect()
}

/// A reader walking chains, half of which a refresher keeps re-storing
/// (each store one edit of one run, published at once), while two
/// churners store and remove thousands of other chains in the same shards:
/// every walk sees each stable chain whole, held by its own replica only
/// (a reused run id never answers for another chain); a chain stored once
/// keeps its time (its run survives the tables' growth); a refreshed one
/// shows a time no older than a walk before it saw (a run's versions are
/// seen in order) and no newer than the refresher has reached, and its
/// refreshes do show.
#[test]
fn readers_see_each_run_whole_and_in_order_under_churn() {
    let a = ChainArena::new();
    let counts = vec![16; LEN];
    for k in 0..CHAINS {
        a.store(1, 100 + k as u32, &stable(k), &counts, 1, Tier::T1);
    }
    let latest = AtomicI64::new(1);
    let done = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let (a, latest, done, counts) = (&a, &latest, &done, &counts);
        sc.spawn(move || {
            let _stop = Stop(done);
            for i in 2..40_000i64 {
                let k = (i as u64 * 2) % CHAINS;
                // Announced before it is stored: a reader that then reads
                // `latest` has a bound on every time it could have seen.
                latest.store(i, Ordering::SeqCst);
                let got = a.store(1, 100 + k as u32, &stable(k), counts, i, Tier::T1);
                assert_eq!((got.lost, got.refreshed), (0, LEN as u64));
            }
        });
        for w in 0..2u64 {
            sc.spawn(move || {
                let _stop = Stop(done);
                let mut x = 0x2545_F491_4F6C_DD1Du64 ^ w;
                for i in 0..30_000u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Short chains in a hash space of their own: new runs
                    // in every shard (tables grow), most of them removed
                    // again soon (runs trimmed and retired, ids reused).
                    let base = ((w + 1) << 56) | ((i % 4096) << 16) | ((x % 4) << 8);
                    let len = 1 + (x >> 8) as usize % 6;
                    let hs: Vec<u64> = (0..len as u64).map(|d| base + d).collect();
                    let r = (w * 4 + (x >> 20) % 4) as u32;
                    if x % 3 == 0 {
                        for h in hs.iter().rev() {
                            a.remove(1, *h, r);
                        }
                    } else {
                        a.store(1, r, &hs, &counts[..len], i as i64, Tier::T1);
                    }
                }
            });
        }
        sc.spawn(move || {
            let mut seen = [0i64; CHAINS as usize];
            let mut got = Vec::new();
            let mut walks = 0u64;
            while !done.load(Ordering::Acquire) || walks < 10_000 {
                let k = walks % CHAINS;
                walks += 1;
                a.walk(1, &stable(k), counts, 0, &mut got);
                let bound = latest.load(Ordering::SeqCst);
                assert_eq!(got.len(), 1, "chain {k}: {got:?}");
                let m = got[0];
                assert_eq!(
                    (m.replica, m.blocks, m.matched),
                    (100 + k as u32, LEN as u32, 16 * LEN as i32),
                    "chain {k}"
                );
                if k % 2 == 1 {
                    assert_eq!(m.oldest, 1, "chain {k} stored once");
                    continue;
                }
                let last = &mut seen[k as usize];
                assert!(
                    m.oldest >= *last,
                    "chain {k} went back: {} < {last}",
                    m.oldest
                );
                assert!(m.oldest <= bound, "chain {k} ahead: {} > {bound}", m.oldest);
                *last = m.oldest;
            }
            // And writers' edits do become visible.
            assert!(
                seen.iter().step_by(2).all(|&t| t > 1),
                "no refresh seen: {seen:?}"
            );
        });
    });
    // The churn left every table entry pointing at a run that has it.
    let mut placed = Vec::new();
    a.each_run(|r| placed.extend(r.hashes().iter().map(|&h| (r.part, h))));
    placed.sort_unstable();
    assert!(placed.windows(2).all(|w| w[0] != w[1]));
    assert_eq!(a.blocks(), placed.len());
}

//! The arena against a map of (block -> replica -> state): every lookup
//! agrees, through stores that grow, branch and refresh chains and
//! removals that split and retire runs.

use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

type Model = HashMap<(u32, u64), BTreeMap<u32, (i64, Tier)>>;

/// Block `d` of chain `c`: chains share the blocks before their split
/// depth, so stores of one chain land in the runs of another.
fn block(c: u8, d: usize) -> u64 {
    let split = [usize::MAX, 3, 6, 0, 10, 3][usize::from(c) % 6];
    if d < split {
        1000 + d as u64
    } else {
        u64::from(c) * 1000 + d as u64 + 7
    }
}

fn chain(c: u8, from: usize, to: usize) -> Vec<u64> {
    (from..to).map(|d| block(c, d)).collect()
}

fn model_walk(m: &Model, part: u32, hashes: &[u64], counts: &[i32], cutoff: i64) -> Vec<RunMatch> {
    let mut live: Vec<RunMatch> = Vec::new();
    let mut out = Vec::new();
    for (i, (h, &c)) in hashes.iter().zip(counts).enumerate() {
        let holders = m.get(&(part, *h)).cloned().unwrap_or_default();
        if i == 0 {
            for (&replica, &(ls, tier)) in holders.iter().filter(|(_, s)| s.0 >= cutoff) {
                live.push(RunMatch {
                    replica,
                    blocks: 1,
                    matched: c,
                    oldest: ls,
                    tier,
                });
            }
        } else {
            let mut kept = Vec::new();
            for mut r in live.drain(..) {
                match holders.get(&r.replica) {
                    Some(&(ls, tier)) if ls >= cutoff => {
                        r.blocks += 1;
                        r.matched = r.matched.wrapping_add(c);
                        r.oldest = r.oldest.min(ls);
                        r.tier = Tier::worst(r.tier, tier);
                        kept.push(r);
                    }
                    _ => out.push(r),
                }
            }
            live = kept;
        }
        if live.is_empty() {
            break;
        }
    }
    out.extend(live);
    out.sort_unstable_by_key(|r| r.replica);
    out
}

#[derive(Debug, Clone)]
enum Op {
    Store {
        part: u32,
        replica: u32,
        c: u8,
        from: usize,
        len: usize,
        ls: i64,
        tier: i32,
    },
    Remove {
        part: u32,
        replica: u32,
        c: u8,
        d: usize,
    },
    Lookup {
        part: u32,
        c: u8,
        len: usize,
        cutoff: i64,
        count: i32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..2, 0u32..10, 0u8..6, 0usize..12, 1usize..10, 0i64..6, 0i32..4).prop_map(
            |(part, replica, c, from, len, ls, tier)| Op::Store { part, replica, c, from, len, ls, tier }
        ),
        3 => (0u32..2, 0u32..10, 0u8..6, 0usize..20)
            .prop_map(|(part, replica, c, d)| Op::Remove { part, replica, c, d }),
        3 => (0u32..2, 0u8..6, 1usize..22, 0i64..4, prop_oneof![Just(16), Just(i32::MAX), -3i32..50])
            .prop_map(|(part, c, len, cutoff, count)| Op::Lookup { part, c, len, cutoff, count }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]
    #[test]
    fn the_arena_walks_like_a_map(ops in proptest::collection::vec(op(), 1..120)) {
        let mut a = ChainArena::new();
        let mut m: Model = HashMap::new();
        let mut got = Vec::new();
        for op in ops {
            match op {
                Op::Store { part, replica, c, from, len, ls, tier } => {
                    let hs = chain(c, from, from + len);
                    let tier = Tier::from_wire(tier).normalized();
                    a.store(part, replica, &hs, ls, tier);
                    for h in hs {
                        m.entry((part, h)).or_default().insert(replica, (ls, tier));
                    }
                }
                Op::Remove { part, replica, c, d } => {
                    let h = block(c, d);
                    let held = m.get_mut(&(part, h)).and_then(|hs| hs.remove(&replica)).is_some();
                    prop_assert_eq!(a.remove(part, h, replica), held);
                }
                Op::Lookup { part, c, len, cutoff, count } => {
                    let hs = chain(c, 0, len);
                    let counts: Vec<i32> = (0..len as i32).map(|i| count.wrapping_add(i)).collect();
                    a.walk(part, &hs, &counts, cutoff, &mut got);
                    prop_assert_eq!(&got, &model_walk(&m, part, &hs, &counts, cutoff));
                }
            }
            let held: usize = m.values().map(BTreeMap::len).sum();
            prop_assert_eq!(a.holdings(), held);
            for run in a.runs.iter() {
                for w in run.spans.windows(2) {
                    prop_assert!((w[0].replica, w[0].to) <= (w[1].replica, w[1].from));
                    prop_assert!(!(w[0].replica == w[1].replica && w[0].to == w[1].from && w[0].same_state(&w[1])));
                }
            }
        }
        // Every block left in the table belongs to a live run.
        prop_assert!(a.blocks() >= m.values().filter(|hs| !hs.is_empty()).count());
    }
}

/// A store that continues a run's last block grows that run; a suffix
/// stored on its own (the wire names no parent) starts one, and the walk
/// crosses from run to run.
#[test]
fn chains_grow_their_runs_and_the_walk_crosses_runs() {
    let mut a = ChainArena::new();
    a.store(1, 7, &chain(0, 0, 4), 10, Tier::T1);
    a.store(1, 8, &chain(0, 0, 12), 11, Tier::T2);
    assert_eq!((a.runs(), a.blocks(), a.holdings()), (1, 12, 16));
    for turn in 1..5 {
        a.store(1, 7, &chain(0, 8 + turn * 4, 12 + turn * 4), 10, Tier::T1);
    }
    a.store(1, 7, &chain(0, 4, 12), 10, Tier::T1);
    assert_eq!((a.runs(), a.blocks(), a.holdings()), (5, 28, 40));
    let mut got = Vec::new();
    a.walk(1, &chain(0, 0, 30), &[1; 30], 0, &mut got);
    let ids = |got: &[RunMatch]| {
        got.iter()
            .map(|r| (r.replica, r.blocks, r.matched))
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&got), [(7, 28, 28), (8, 12, 12)]);
    assert_eq!(
        (got[0].oldest, got[0].tier, got[1].tier),
        (10, Tier::T1, Tier::T2)
    );
    // A hole ends a stretch; a stale span ends it too.
    a.remove(1, block(0, 17), 7);
    a.walk(1, &chain(0, 0, 30), &[1; 30], 0, &mut got);
    assert_eq!(ids(&got), [(7, 17, 17), (8, 12, 12)]);
    a.walk(1, &chain(0, 0, 30), &[1; 30], 11, &mut got);
    assert_eq!(ids(&got), [(8, 12, 12)]);
    // Removing every holding retires every run and empties the table.
    for d in 0..28 {
        a.remove(1, block(0, d), 7);
        a.remove(1, block(0, d), 8);
    }
    assert_eq!((a.runs(), a.blocks(), a.holdings()), (0, 0, 0));
}

//! The arena against a map of (block -> replica -> state): every lookup,
//! every block's holders and every holding agree, through stores that
//! grow, branch and refresh chains, removals that split, trim and retire
//! runs, and sweeps.

use super::*;
use crate::types::Tier;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

type Model = HashMap<(u32, u64), BTreeMap<u32, (i64, Tier, i32)>>;

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
            for (&replica, &(ls, tier, _)) in holders.iter().filter(|(_, s)| s.0 >= cutoff) {
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
                    Some(&(ls, tier, _)) if ls >= cutoff => {
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
        base: i32,
        step: i32,
        wobble: bool,
        /// Through `store_each`, outcomes checked block by block.
        each: bool,
        /// (at, of): block `of` of the chain repeated at `at` (a chain
        /// that holds a block twice).
        dup: Option<(usize, usize)>,
    },
    Remove {
        part: u32,
        replica: u32,
        c: u8,
        d: usize,
    },
    /// `take` whose check answers `ok`.
    Take {
        part: u32,
        replica: u32,
        c: u8,
        d: usize,
        ok: bool,
    },
    /// `take_block` whose check answers `ok`.
    TakeBlock {
        part: u32,
        c: u8,
        d: usize,
        ok: bool,
    },
    WithHolding {
        part: u32,
        replica: u32,
        c: u8,
        d: usize,
    },
    EachBlock,
    Lookup {
        part: u32,
        c: u8,
        len: usize,
        cutoff: i64,
        count: i32,
    },
    Holders {
        part: u32,
        c: u8,
        d: usize,
    },
    /// Delivered hits over chain `c`'s first `len` blocks: (replica,
    /// leading blocks) each.
    Credit {
        part: u32,
        c: u8,
        len: usize,
        hits: Vec<(u32, u32)>,
    },
    /// A TTL sweep (`cutoff`) or, with `replica`, that replica's removal.
    Sweep {
        cutoff: i64,
        replica: Option<u32>,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u32..2, 0u32..10, 0u8..6, 0usize..12, 1usize..10, 0i64..6, 0i32..4, prop_oneof![Just(0), -20i32..20], prop_oneof![Just(16), 0i32..3], any::<bool>(), any::<bool>(), prop_oneof![3 => Just(None), 1 => (0usize..10, 0usize..10).prop_map(Some)]).prop_map(
            |(part, replica, c, from, len, ls, tier, base, step, wobble, each, dup)| Op::Store { part, replica, c, from, len, ls, tier, base, step, wobble, each, dup }
        ),
        2 => (0u32..2, 0u32..10, 0u8..6, 0usize..20)
            .prop_map(|(part, replica, c, d)| Op::Remove { part, replica, c, d }),
        2 => (0u32..2, 0u32..10, 0u8..6, 0usize..20, any::<bool>())
            .prop_map(|(part, replica, c, d, ok)| Op::Take { part, replica, c, d, ok }),
        1 => (0u32..2, 0u8..6, 0usize..20, prop_oneof![3 => Just(true), 1 => Just(false)])
            .prop_map(|(part, c, d, ok)| Op::TakeBlock { part, c, d, ok }),
        1 => (0u32..2, 0u32..10, 0u8..6, 0usize..20)
            .prop_map(|(part, replica, c, d)| Op::WithHolding { part, replica, c, d }),
        1 => Just(Op::EachBlock),
        3 => (0u32..2, 0u8..6, 1usize..22, 0i64..4, prop_oneof![Just(16), Just(i32::MAX), -3i32..50])
            .prop_map(|(part, c, len, cutoff, count)| Op::Lookup { part, c, len, cutoff, count }),
        1 => (0u32..2, 0u8..6, 0usize..20).prop_map(|(part, c, d)| Op::Holders { part, c, d }),
        1 => (0i64..4, proptest::option::of(0u32..10)).prop_map(|(cutoff, replica)| Op::Sweep { cutoff, replica }),
        2 => (0u32..2, 0u8..6, 1usize..22, proptest::collection::vec((0u32..10, 0u32..24), 0..4))
            .prop_map(|(part, c, len, hits)| Op::Credit { part, c, len, hits }),
        // A lookup's hits: in replica order, often most of the replicas
        // (the credit's one-pass path).
        2 => (0u32..2, 0u8..6, 1usize..22, proptest::collection::vec((0u32..10, 0u32..24), 0..12))
            .prop_map(|(part, c, len, mut hits)| {
                hits.sort_unstable_by_key(|h| h.0);
                Op::Credit { part, c, len, hits }
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]
    #[test]
    fn the_arena_walks_like_a_map(ops in proptest::collection::vec(op(), 1..120)) {
        let a = ChainArena::new();
        let mut m: Model = HashMap::new();
        // The LFU counts by (part, hash, replica): a holding's count, 0
        // when it has none; a removed holding's goes with it.
        let mut acc: HashMap<(u32, u64, u32), u32> = HashMap::new();
        let mut got = Vec::new();
        let mut held = Vec::new();
        let mut each = Vec::new();
        for op in ops {
            match op {
                Op::Store { part, replica, c, from, len, ls, tier, base, step, wobble, each: per_block, dup } => {
                    let mut hs = chain(c, from, from + len);
                    if let Some((at, of)) = dup {
                        let h = hs[of % len];
                        hs.insert(at % (len + 1), h);
                    }
                    // Cumulative counts as the index computes them for a
                    // store (from the store's first block), `step` a block;
                    // `wobble` makes blocks unequal (a run's counts leave
                    // their line).
                    let toks: Vec<i32> = hs.iter().zip(0..hs.len() as i32)
                        .map(|(h, i)| base.wrapping_add(step.wrapping_mul(i + 1)).wrapping_add(if wobble { (*h % 3) as i32 } else { 0 }))
                        .collect();
                    let tier = Tier::from_wire(tier).normalized();
                    let done = if per_block {
                        a.store_each(part, replica, &hs, &toks, ls, tier, &mut each)
                    } else {
                        a.store(part, replica, &hs, &toks, ls, tier)
                    };
                    // Block by block, each against the holdings its
                    // predecessors in the chain left (a repeated block was
                    // held by its first occurrence).
                    let mut want = Vec::new();
                    for (h, t) in hs.iter().zip(toks) {
                        let hs = m.entry((part, *h)).or_default();
                        want.push(if hs.contains_key(&replica) {
                            BlockStored::Refreshed
                        } else if hs.is_empty() {
                            BlockStored::NewKey
                        } else {
                            BlockStored::Added
                        });
                        hs.insert(replica, (ls, tier, t));
                    }
                    let count = |b: BlockStored| want.iter().filter(|&&w| w == b).count() as u64;
                    let had = count(BlockStored::Refreshed);
                    prop_assert_eq!((done.refreshed, done.added, done.lost), (had, hs.len() as u64 - had, 0));
                    prop_assert!(done.new_blocks <= count(BlockStored::NewKey));
                    if per_block {
                        prop_assert_eq!(&each, &want);
                    }
                }
                Op::Remove { part, replica, c, d } => {
                    let h = block(c, d);
                    let access = acc.remove(&(part, h, replica)).unwrap_or(0);
                    let held = m.get_mut(&(part, h)).and_then(|hs| hs.remove(&replica))
                        .map(|(last_seen, tier, tokens)| Holding { replica, tokens, last_seen, tier, access });
                    prop_assert_eq!(a.remove(part, h, replica), held);
                }
                Op::Take { part, replica, c, d, ok } => {
                    let h = block(c, d);
                    let hs = m.entry((part, h)).or_default();
                    let mut seen = None;
                    let mut rest = vec![Holding { replica: 99, tokens: 0, last_seen: 0, tier: Tier::T1, access: 0 }];
                    let took = a.take(part, h, replica, |x| { seen = Some(*x); ok }, &mut rest);
                    let want = match hs.get(&replica) {
                        None => Take::Absent,
                        Some(&(last_seen, tier, tokens)) => {
                            let access = acc.get(&(part, h, replica)).copied().unwrap_or(0);
                            let x = Holding { replica, tokens, last_seen, tier, access };
                            prop_assert_eq!(seen, Some(x));
                            if ok {
                                hs.remove(&replica);
                                acc.remove(&(part, h, replica));
                                Take::Removed(x)
                            } else {
                                Take::Refused(x)
                            }
                        }
                    };
                    let want_rest: Vec<Holding> = match want {
                        Take::Removed(_) => hs.iter()
                            .map(|(&replica, &(last_seen, tier, tokens))| Holding { replica, tokens, last_seen, tier, access: acc.get(&(part, h, replica)).copied().unwrap_or(0) })
                            .collect(),
                        _ => Vec::new(),
                    };
                    prop_assert_eq!(took, want);
                    prop_assert_eq!(&rest, &want_rest);
                }
                Op::TakeBlock { part, c, d, ok } => {
                    let h = block(c, d);
                    let hs = m.entry((part, h)).or_default();
                    let all: Vec<Holding> = hs.iter()
                        .map(|(&replica, &(last_seen, tier, tokens))| Holding { replica, tokens, last_seen, tier, access: acc.get(&(part, h, replica)).copied().unwrap_or(0) })
                        .collect();
                    let mut seen = None;
                    let mut out = vec![Holding { replica: 99, tokens: 0, last_seen: 0, tier: Tier::T1, access: 0 }];
                    let took = a.take_block(part, h, |x| { seen = Some(x.to_vec()); ok }, &mut out);
                    // The check sees the holders only when there are some.
                    prop_assert_eq!(seen, (!all.is_empty()).then(|| all.clone()));
                    let gone = ok && !all.is_empty();
                    prop_assert_eq!(took, gone);
                    if gone {
                        for r in hs.keys() {
                            acc.remove(&(part, h, *r));
                        }
                        hs.clear();
                        prop_assert_eq!(&out, &all);
                    } else {
                        prop_assert!(out.is_empty());
                    }
                }
                Op::WithHolding { part, replica, c, d } => {
                    let h = block(c, d);
                    let want = m.get(&(part, h)).and_then(|hs| hs.get(&replica))
                        .map(|&(last_seen, tier, tokens)| Holding { replica, tokens, last_seen, tier, access: acc.get(&(part, h, replica)).copied().unwrap_or(0) });
                    prop_assert_eq!(a.with_holding(part, h, replica, |x| *x), want);
                }
                Op::EachBlock => {
                    let mut all = Vec::new();
                    a.for_each_block(|part, hash, hs| all.push((part, hash, hs.to_vec())));
                    all.sort_unstable_by_key(|(part, hash, _)| (*part, *hash));
                    let mut want: Vec<_> = m.iter()
                        .filter(|(_, hs)| !hs.is_empty())
                        .map(|(&(part, hash), hs)| (part, hash, hs.iter()
                            .map(|(&replica, &(last_seen, tier, tokens))| Holding { replica, tokens, last_seen, tier, access: acc.get(&(part, hash, replica)).copied().unwrap_or(0) })
                            .collect::<Vec<_>>()))
                        .collect();
                    want.sort_unstable_by_key(|(part, hash, _)| (*part, *hash));
                    prop_assert_eq!(all, want);
                }
                Op::Lookup { part, c, len, cutoff, count } => {
                    let hs = chain(c, 0, len);
                    let counts: Vec<i32> = (0..len as i32).map(|i| count.wrapping_add(i)).collect();
                    a.walk(part, &hs, &counts, cutoff, &mut got);
                    prop_assert_eq!(&got, &model_walk(&m, part, &hs, &counts, cutoff));
                }
                Op::Holders { part, c, d } => {
                    let h = block(c, d);
                    a.holders(part, h, &mut held);
                    let want: Vec<Holding> = m.get(&(part, h)).into_iter().flatten()
                        .map(|(&replica, &(last_seen, tier, tokens))| Holding { replica, tokens, last_seen, tier, access: acc.get(&(part, h, replica)).copied().unwrap_or(0) })
                        .collect();
                    prop_assert_eq!(&held, &want);
                }
                Op::Credit { part, c, len, hits } => {
                    let hs = chain(c, 0, len);
                    let mut credits: Vec<Credit> = hits.iter()
                        .map(|&(replica, blocks)| Credit { replica, blocks })
                        .collect();
                    a.credit(part, hs.len(), |i| hs[i], &mut credits);
                    // Key by key, as the index credited before runs did.
                    for &(replica, blocks) in &hits {
                        for h in hs.iter().take(blocks as usize) {
                            if m.get(&(part, *h)).is_some_and(|x| x.contains_key(&replica)) {
                                *acc.entry((part, *h, replica)).or_default() += 1;
                            }
                        }
                    }
                }
                Op::Sweep { cutoff, replica } => {
                    let keep = |r: u32, ls: i64| match replica {
                        Some(x) => r != x,
                        None => ls >= cutoff,
                    };
                    let mut gone = Vec::new();
                    let n = a.retain(|_, r, ls, _| keep(r, ls), |s, empty| gone.push((s, empty)));
                    let mut want = Vec::new();
                    for (&(part, hash), hs) in m.iter_mut() {
                        let at = want.len();
                        hs.retain(|&r, &mut (ls, tier, tokens)| {
                            if !keep(r, ls) {
                                let access = acc.remove(&(part, hash, r)).unwrap_or(0);
                                want.push((Swept { part, hash, holding: Holding { replica: r, tokens, last_seen: ls, tier, access } }, false));
                            }
                            keep(r, ls)
                        });
                        // Emptied: nobody holds the block after the sweep.
                        for w in &mut want[at..] {
                            w.1 = hs.is_empty();
                        }
                    }
                    let key = |s: &(Swept, bool)| (s.0.part, s.0.hash, s.0.holding.replica);
                    gone.sort_by_key(key);
                    want.sort_by_key(key);
                    prop_assert_eq!(n, want.len());
                    prop_assert_eq!(gone, want);
                }
            }
            let held: usize = m.values().map(BTreeMap::len).sum();
            prop_assert_eq!(a.holdings(), held);
            let mut ordered = true;
            a.each_run(|run| {
                for w in run.spans.windows(2) {
                    ordered &= (w[0].replica(), w[0].to) <= (w[1].replica(), w[1].from);
                    ordered &= !(w[0].replica() == w[1].replica() && w[0].to == w[1].from && w[0].same_state(&w[1]));
                }
            });
            prop_assert!(ordered);
        }
        // Every holding, and no block past a run's last held one.
        let mut all = Vec::new();
        a.for_each(|part, hash, h| all.push((part, hash, h.replica, h.tokens, h.last_seen, h.tier)));
        all.sort_unstable();
        let mut want: Vec<_> = m.iter()
            .flat_map(|(&(part, hash), hs)| hs.iter().map(move |(&r, &(ls, tier, t))| (part, hash, r, t, ls, tier)))
            .collect();
        want.sort_unstable();
        prop_assert_eq!(all, want);
        let mut trimmed = true;
        a.each_run(|run| {
            if !run.hashes().is_empty() {
                trimmed &= run.spans.iter().map(|s| s.to as usize).max() == Some(run.hashes().len());
            }
        });
        prop_assert!(trimmed);
        prop_assert!(a.blocks() >= m.values().filter(|hs| !hs.is_empty()).count());
    }
}

/// Cumulative counts of 16-token blocks `from..to`, as a store from block
/// `from` reports them.
fn toks(from: usize, to: usize) -> Vec<i32> {
    (from..to).map(|i| 16 * (i - from + 1) as i32).collect()
}

/// A store that continues a run's last block grows that run; a suffix
/// stored on its own (the wire names no parent) starts one, and the walk
/// crosses from run to run.
#[test]
fn chains_grow_their_runs_and_the_walk_crosses_runs() {
    let a = ChainArena::new();
    a.store(1, 7, &chain(0, 0, 4), &toks(0, 4), 10, Tier::T1);
    a.store(1, 8, &chain(0, 0, 12), &toks(0, 12), 11, Tier::T2);
    assert_eq!((a.runs(), a.blocks(), a.holdings()), (1, 12, 16));
    for turn in 1..5 {
        a.store(
            1,
            7,
            &chain(0, 8 + turn * 4, 12 + turn * 4),
            &toks(0, 4),
            10,
            Tier::T1,
        );
    }
    a.store(1, 7, &chain(0, 4, 12), &toks(4, 12), 10, Tier::T1);
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

/// A store skips the optimistic probe of a block that follows a new one
/// (it is almost always new too): a block that exists all the same must
/// still be found under the write lock, held once, not stored twice.
#[test]
fn a_known_block_right_after_a_new_one_is_joined_not_stored_again() {
    let a = ChainArena::new();
    a.store(0, 1, &[10, 11, 12], &toks(0, 3), 5, Tier::T1);
    let out = a.store(0, 2, &[99, 11, 12, 13], &toks(0, 4), 6, Tier::T1);
    assert_eq!((out.new_blocks, out.added, out.lost), (2, 4, 0));
    assert_eq!((a.blocks(), a.holdings()), (5, 7));
    let matched = |hashes: &[u64]| {
        let mut got = Vec::new();
        a.walk(0, hashes, &[1; 4], 0, &mut got);
        got.iter()
            .map(|r| (r.replica, r.blocks))
            .collect::<Vec<_>>()
    };
    assert_eq!(matched(&[10, 11, 12, 13]), [(1, 3)]);
    assert_eq!(matched(&[99, 11, 12, 13]), [(2, 4)]);
    let mut hs = Vec::new();
    a.holders(0, 12, &mut hs);
    assert_eq!(hs.len(), 2);
}

#[test]
fn a_span_is_24_bytes_and_keeps_replica_and_tier() {
    assert_eq!(std::mem::size_of::<Span>(), 24);
    let s = Span::new((1 << 24) - 2, 0, 1, Tier::T3, -4, 9);
    assert_eq!(
        (s.replica(), s.tier(), s.delta),
        ((1 << 24) - 2, Tier::T3, -4)
    );
}

/// Unequal blocks leave the run's count line for a list, so replicas that
/// report the same counts still share one span each (without the list, a
/// span per block).
#[test]
fn unequal_blocks_keep_one_span_per_replica() {
    let a = ChainArena::new();
    let hs = chain(0, 0, 10);
    let counts: Vec<i32> = [16, 32, 40, 56, 60, 76, 92, 93, 109, 125].to_vec();
    for r in 0..3 {
        a.store(1, r, &hs, &counts, 5, Tier::T1);
    }
    let mut spans = 0;
    a.each_run(|r| spans += r.spans.len());
    assert_eq!(spans, 3);
    let mut held = Vec::new();
    a.holders(1, hs[7], &mut held);
    assert_eq!(
        held.iter().map(|h| h.tokens).collect::<Vec<_>>(),
        [93, 93, 93]
    );
}

/// Two writers churn chains that share their first blocks with a stable
/// chain while a reader walks: the stable chain's holders are always seen
/// whole, every answer is well formed, and afterwards the tables hold
/// exactly the blocks the runs do (no block placed twice by the racing
/// writers, none left behind by the removals).
#[test]
fn writers_and_a_reader_never_see_a_torn_run() {
    let a = ChainArena::new();
    let stable = chain(0, 0, 14);
    let sixteen = |n: usize| -> Vec<i32> { (1..=n as i32).map(|i| 16 * i).collect() };
    for r in 100..104 {
        a.store(1, r, &stable, &sixteen(14), 1, Tier::T1);
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|sc| {
        for w in 0..2u32 {
            let (a, done) = (&a, &done);
            sc.spawn(move || {
                // Tells the reader to stop even if this writer panics.
                let _stop = Stop(done);
                // Both writers make the same choices (their replicas
                // differ), so they often place the same new blocks at once;
                // every 64 steps the chains' own blocks are new ones.
                let mut x = 0x9E37_79B9u64;
                for i in 0..20_000u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let c = 1 + (x % 5) as u8;
                    let r = w * 10 + (x >> 8) as u32 % 4;
                    let from = (x >> 16) as usize % 6;
                    let len = 1 + (x >> 24) as usize % 12;
                    let hs: Vec<u64> = chain(c, from, from + len)
                        .into_iter()
                        .map(|h| if h >= 2000 { h + ((i / 64) << 32) } else { h })
                        .collect();
                    if x % 3 == 0 {
                        for h in hs {
                            a.remove(1, h, r);
                        }
                    } else {
                        let got = a.store(1, r, &hs, &sixteen(len), i as i64, Tier::T1);
                        assert_eq!(got.lost, 0);
                    }
                }
            });
        }
        let (a, done) = (&a, &done);
        sc.spawn(move || {
            let mut got = Vec::new();
            let counts = vec![16; 24];
            let mut walks = 0u64;
            while !done.load(std::sync::atomic::Ordering::Acquire) || walks < 1000 {
                walks += 1;
                let c = (walks % 6) as u8;
                let req = chain(c, 0, 24);
                a.walk(1, &req, &counts, 0, &mut got);
                assert!(
                    got.windows(2).all(|w| w[0].replica < w[1].replica),
                    "{got:?}"
                );
                for m in &got {
                    assert!(m.blocks >= 1 && m.blocks as usize <= req.len(), "{m:?}");
                    assert_eq!(m.matched, 16 * m.blocks as i32, "{m:?}");
                }
                if c == 0 {
                    let whole: Vec<u32> = got
                        .iter()
                        .filter(|m| m.replica >= 100)
                        .map(|m| m.blocks)
                        .collect();
                    assert_eq!(whole, [14; 4], "{got:?}");
                }
            }
        });
    });
    // Every table entry is a block some run holds a place for, and back,
    // and no block has two places.
    let mut placed = Vec::new();
    a.each_run(|r| placed.extend(r.hashes().iter().map(|&h| (r.part, h))));
    assert_eq!(a.blocks(), placed.len());
    placed.sort_unstable();
    assert!(placed.windows(2).all(|w| w[0] != w[1]));
    let mut all = Vec::new();
    a.for_each(|_, h, x| all.push((h, x.replica)));
    assert_eq!(all.len(), a.holdings());
    for (h, r) in all {
        assert!(a.remove(1, h, r).is_some());
    }
    assert_eq!((a.blocks(), a.runs(), a.holdings()), (0, 0, 0));
}

/// Per-block outcomes: a repeated block reads `Refreshed` the second
/// time, a block kept in its run after its last holder went is a
/// `NewKey` again though the table still has it.
#[test]
fn store_each_reports_every_block_in_chain_order() {
    use BlockStored::{Added, NewKey, Refreshed};
    let a = ChainArena::new();
    let mut each = vec![BlockStored::Lost; 9];
    let c = chain(0, 0, 4);
    let got = a.store_each(1, 1, &c, &toks(0, 4), 5, Tier::T1, &mut each);
    assert_eq!(each, [NewKey; 4]);
    assert_eq!((got.new_blocks, got.added, got.refreshed), (4, 4, 0));
    let hs = [c[0], c[1], c[0], 77, 77];
    let got = a.store_each(1, 2, &hs, &[16, 32, 48, 64], 5, Tier::T1, &mut each);
    assert_eq!(each, [Added, Added, Refreshed, NewKey]);
    assert_eq!((got.new_blocks, got.added, got.refreshed), (1, 3, 1));
    let mut held = Vec::new();
    a.holders(1, c[0], &mut held);
    assert_eq!(held.iter().map(|h| h.tokens).collect::<Vec<_>>(), [16, 48]);
    // Block 1 loses both holders but keeps its place (block 2 is held).
    for r in [1, 2] {
        assert!(a.remove(1, c[1], r).is_some());
    }
    let blocks = a.blocks();
    let got = a.store_each(1, 3, &c[1..3], &[1, 2], 5, Tier::T1, &mut each);
    assert_eq!(each, [NewKey, Added]);
    assert_eq!((got.new_blocks, a.blocks()), (0, blocks));
}

/// `take`, `take_block` and `retain` report what is left of a block; a
/// refused check changes nothing.
#[test]
fn conditional_removals_report_the_rest() {
    let a = ChainArena::new();
    let c = chain(0, 0, 6);
    for r in 0..3 {
        a.store(1, r, &c, &toks(0, 6), i64::from(r), Tier::T1);
    }
    let mut rest = Vec::new();
    let t = a.take(1, c[2], 1, |h| h.last_seen == 7, &mut rest);
    assert!(matches!(t, Take::Refused(h) if h.replica == 1 && h.tokens == 48));
    assert!(rest.is_empty() && a.holdings() == 18);
    let t = a.take(1, c[2], 1, |h| h.last_seen == 1, &mut rest);
    assert!(matches!(t, Take::Removed(h) if h.replica == 1));
    assert_eq!(rest.iter().map(|h| h.replica).collect::<Vec<_>>(), [0, 2]);
    assert_eq!(a.take(1, c[2], 1, |_| true, &mut rest), Take::Absent);
    assert_eq!(a.with_holding(1, c[2], 2, |h| h.tokens), Some(48));
    assert_eq!(a.with_holding(1, c[2], 1, |h| h.tokens), None);
    let mut out = Vec::new();
    assert!(!a.take_block(1, c[3], |hs| hs.len() == 2, &mut out));
    assert!(out.is_empty());
    assert!(a.take_block(1, c[3], |hs| hs.len() == 3, &mut out));
    assert_eq!(out.iter().map(|h| h.replica).collect::<Vec<_>>(), [0, 1, 2]);
    assert!(!a.take_block(1, c[3], |_| true, &mut out));
    // Block 3, emptied, kept its place; taking the run's last blocks trims
    // the unheld tail: blocks 3 to 5 leave.
    assert_eq!(a.blocks(), 6);
    assert!(a.take_block(1, c[5], |_| true, &mut out));
    assert!(a.take_block(1, c[4], |_| true, &mut out));
    assert_eq!(a.blocks(), 3);
    let mut seen = Vec::new();
    a.for_each_block(|_, h, hs| seen.push((h, hs.len())));
    assert_eq!(seen, [(c[0], 3), (c[1], 3), (c[2], 2)]);
    // Replica 0 goes: every block it held keeps another holder.
    let mut gone = Vec::new();
    a.retain(
        |_, r, _, _| r != 0,
        |s, empty| gone.push((s.hash, s.holding.replica, empty)),
    );
    assert_eq!(gone, [(c[0], 0, false), (c[1], 0, false), (c[2], 0, false)]);
    gone.clear();
    a.retain(
        |_, r, _, _| r == 1,
        |s, empty| gone.push((s.hash, s.holding.replica, empty)),
    );
    gone.sort_unstable();
    assert_eq!(gone, [(c[0], 2, false), (c[1], 2, false), (c[2], 2, true)]);
    assert_eq!((a.holdings(), a.blocks(), a.runs()), (2, 2, 1));
}

/// Writers storing with per-block outcomes and removing conditionally,
/// whole blocks included, beside sweeps and block scans: the lock order
/// holds (no deadlock) and afterwards tables and runs agree.
#[test]
fn conditional_writers_and_sweeps_keep_tables_and_runs_in_step() {
    let a = ChainArena::new();
    std::thread::scope(|sc| {
        for w in 0..2u32 {
            let a = &a;
            sc.spawn(move || {
                let mut each = Vec::new();
                let mut rest = Vec::new();
                let mut x = 0x2545_F491u64 + u64::from(w);
                for i in 0..3000i64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let c = (x % 6) as u8;
                    let r = (x >> 8) as u32 % 4;
                    let from = (x >> 16) as usize % 6;
                    let len = 1 + (x >> 24) as usize % 10;
                    let hs = chain(c, from, from + len);
                    match x % 5 {
                        0 => {
                            for &h in &hs {
                                a.take(1, h, r, |h| h.last_seen % 2 == 0, &mut rest);
                            }
                        }
                        1 => {
                            a.take_block(1, hs[0], |hs| hs.len() > 1, &mut rest);
                        }
                        _ => {
                            let got =
                                a.store_each(1, r, &hs, &toks(0, len), i, Tier::T1, &mut each);
                            assert_eq!((got.lost, each.len()), (0, len));
                            assert!(!each.contains(&BlockStored::Lost));
                        }
                    }
                }
            });
        }
        let a = &a;
        sc.spawn(move || {
            for i in 0..200i64 {
                a.retain(|_, _, ls, _| ls >= i * 10, |_, _| {});
                a.for_each_block(|_, _, hs| {
                    assert!(!hs.is_empty() && hs.windows(2).all(|w| w[0].replica < w[1].replica));
                });
            }
        });
    });
    let mut placed = Vec::new();
    a.each_run(|r| placed.extend(r.hashes().iter().map(|&h| (r.part, h))));
    assert_eq!(a.blocks(), placed.len());
    placed.sort_unstable();
    assert!(placed.windows(2).all(|w| w[0] != w[1]));
    let mut n = 0;
    a.for_each_block(|_, _, hs| n += hs.len());
    assert_eq!(n, a.holdings());
}

pub(super) struct Stop<'a>(pub(super) &'a std::sync::atomic::AtomicBool);

impl Drop for Stop<'_> {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }
}

/// A shard's partition tables: the first one inline, the others listed;
/// when the first empties another takes its place, and every partition's
/// blocks stay found through it.
#[test]
fn a_shard_keeps_every_partition_through_its_first_table_emptying() {
    let mut b = Blocks::default();
    let pos = |run: u32| RunPos { run, off: 0 };
    let found =
        |b: &Blocks, part: u32, kh: u64| b.candidates(part, kh).into_iter().collect::<Vec<_>>();
    b.insert(7, 1, pos(1));
    b.insert(8, 2, pos(2));
    b.insert(9, 3, pos(3));
    assert_eq!((b.first_part, b.rest.len(), b.len()), (7, 2, 3));
    b.remove(7, 1, pos(1));
    // Partition 9 (the last listed) moved into the first table.
    assert_eq!((b.first_part, b.rest.len(), b.len()), (9, 1, 2));
    assert!(found(&b, 7, 1).is_empty());
    assert_eq!(found(&b, 8, 2), vec![pos(2)]);
    assert_eq!(found(&b, 9, 3), vec![pos(3)]);
    // A partition that comes back is listed, not inlined over another.
    b.insert(7, 1, pos(4));
    assert_eq!(found(&b, 7, 1), vec![pos(4)]);
    assert_eq!(found(&b, 9, 3), vec![pos(3)]);
    for (part, kh, p) in [(8, 2, pos(2)), (9, 3, pos(3)), (7, 1, pos(4))] {
        b.remove(part, kh, p);
    }
    assert_eq!((b.len(), b.rest.len(), b.first.len()), (0, 0, 0));
    // Empty: the next partition takes the first table.
    b.insert(5, 6, pos(5));
    assert_eq!((b.first_part, b.rest.len()), (5, 0));
    assert_eq!(found(&b, 5, 6), vec![pos(5)]);
}

//! Hybrid models: blocks a replica holds where a match may not end
//! (`PrefixEntry::no_match_end`). A chain lookup backs each replica's run
//! off to its deepest valid end, in the contract ranking and the default
//! one alike; a mark goes with its holding and with a later report saying
//! otherwise; without marks nothing changes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use inferencecache_index::*;
use proptest::prelude::*;

const T: &str = "t";
const M: &str = "m";
const S: &str = "vllm";

/// Legacy entries for blocks `1..=n` of one chain (block `i` = hash `i`,
/// `i * 32` tokens), `no_end(i)` saying which are not a valid end.
fn report(env: &Env, replica: &str, n: u64, no_end: impl Fn(u64) -> bool) {
    let prefixes = (1..=n)
        .map(|i| PrefixEntry {
            no_match_end: no_end(i),
            ..legacy(i, i as i32 * 32)
        })
        .collect();
    env.idx.ingest(&upd(T, M, S, replica, prefixes));
}

/// The chain lookup of blocks `1..=n`: (replica, matched tokens) by rank.
fn contract(env: &Env, n: u64) -> Vec<(String, i32)> {
    let ids: Vec<u64> = (1..=n).collect();
    env.chain(T, M, S, &ids, &vec![32; n as usize])
        .scores
        .iter()
        .map(|s| (s.replica_id.to_string(), s.matched_tokens))
        .collect()
}

/// The default ranking's matched tokens for `replica` over blocks `1..=n`
/// (0 when it is not among the matches).
fn ttft(env: &Env, n: u64, replica: &str) -> i32 {
    let hs: Vec<Vec<u8>> = (1..=n).map(h).collect();
    let counts = vec![32; n as usize];
    let seed = chain_seed(&hs);
    let r = env.idx.route_ttft(
        &LookupRequest::new(T, M, S).chain(&hs, &counts),
        &RouteParams {
            weights: TtftWeights::default(),
            min_matched_tokens: 1,
            ignore_matches: false,
            seed: &seed,
        },
    );
    r.result
        .scores
        .iter()
        .find(|s| &*s.replica_id == replica)
        .map_or(0, |s| s.matched_tokens)
}

#[test]
fn a_match_backs_off_to_the_deepest_valid_end_in_both_rankings() {
    let env = Env::new();
    // r1 (hybrid): only blocks 2 and 6 are valid ends. r2: a reference
    // producer (no flag) holding the same chain.
    report(&env, "r1", 8, |i| i != 2 && i != 6);
    report(&env, "r2", 8, |_| false);
    assert_eq!(
        contract(&env, 8),
        [("r2".to_string(), 256), ("r1".to_string(), 192)]
    );
    assert_eq!(ttft(&env, 8, "r1"), 192);
    assert_eq!(ttft(&env, 8, "r2"), 256);
    // A shorter request ends inside: the deepest valid end within it.
    assert_eq!(contract(&env, 5)[1], ("r1".to_string(), 64));
    assert_eq!(ttft(&env, 5, "r1"), 64);
    // No valid end inside the request: no match for r1 at all.
    let only_r2: Vec<String> = contract(&env, 1).into_iter().map(|s| s.0).collect();
    assert_eq!(only_r2, ["r2"]);
    assert_eq!(ttft(&env, 1, "r1"), 0);
}

#[test]
fn a_report_saying_otherwise_moves_the_end() {
    let env = Env::new();
    report(&env, "r1", 4, |i| i < 4);
    assert_eq!(contract(&env, 4), [("r1".to_string(), 128)]);
    // The sliding-window blocks before block 4 were evicted: not an end now.
    env.idx.ingest(&upd(
        T,
        M,
        S,
        "r1",
        vec![PrefixEntry {
            no_match_end: true,
            ..legacy(4, 128)
        }],
    ));
    assert!(contract(&env, 4).is_empty());
    // And stored again: block 3 is an end.
    env.idx.ingest(&upd(T, M, S, "r1", vec![legacy(3, 96)]));
    assert_eq!(contract(&env, 4), [("r1".to_string(), 96)]);
}

#[test]
fn a_mark_goes_with_its_holding() {
    let env = Env::new();
    report(&env, "r1", 3, |i| i == 3);
    assert_eq!(contract(&env, 3), [("r1".to_string(), 64)]);
    // Evicted and stored again by a producer that sends no flag: a valid
    // end, not the old mark.
    env.event(EventKind::PrefixEvicted, T, M, "r1", Some(3), "");
    env.idx.ingest(&upd(T, M, S, "r1", vec![legacy(3, 96)]));
    assert_eq!(contract(&env, 3), [("r1".to_string(), 96)]);
    // ALL_CLEARED takes marks too.
    report(&env, "r1", 3, |i| i == 3);
    env.event(EventKind::AllCleared, T, M, "r1", None, "");
    report(&env, "r1", 3, |_| false);
    assert_eq!(contract(&env, 3), [("r1".to_string(), 96)]);
}

#[test]
fn a_chain_entry_marks_its_last_block() {
    let env = Env::new();
    env.idx.ingest(&upd(
        T,
        M,
        S,
        "r1",
        vec![PrefixEntry {
            no_match_end: true,
            ..chain(&[1, 2, 3], &[32, 32, 32])
        }],
    ));
    assert_eq!(contract(&env, 3), [("r1".to_string(), 64)]);
}

proptest! {
    /// Against a model: a replica's match is the deepest `end` within its
    /// held run whose block is not marked.
    #[test]
    fn the_match_is_the_deepest_valid_end_within_the_held_run(
        marks in proptest::collection::vec(any::<bool>(), 1..12),
        held in 0usize..12,
        asked in 1usize..12,
    ) {
        let env = Env::new();
        let held = held.min(marks.len());
        report(&env, "r1", held as u64, |i| marks[i as usize - 1]);
        let run = held.min(asked);
        let want = (1..=run).rev().find(|&e| !marks[e - 1]).unwrap_or(0) as i32 * 32;
        let got = contract(&env, asked as u64).first().map_or(0, |s| s.1);
        prop_assert_eq!(got, want);
        prop_assert_eq!(ttft(&env, asked as u64, "r1"), want);
    }
}

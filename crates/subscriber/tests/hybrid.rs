//! Hybrid models (issue 33, finding 7): the sliding-window groups decide
//! where a match may end. Events shaped as vLLM 0.32 sends them for a
//! Gemma-3 with three sliding-window groups (window 64) and one
//! full-attention group, 32-token blocks: a window group's store names only
//! the blocks it kept (the last few of a prefill) while its `token_ids`
//! and parent cover the whole step.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use inferencecache_subscriber::{
    BlockRemoved, BlockStored, EngineEvent, EngineHash, Mapping, MappingConfig, Medium, Update,
};
use proptest::prelude::*;

const BS: u32 = 32;
const FULL: i64 = 3;

fn hashes(ids: impl IntoIterator<Item = u64>) -> Vec<EngineHash> {
    ids.into_iter().map(EngineHash::Uint).collect()
}

/// Full-attention blocks `from..to` of one chain (block `i` = hash `i`).
fn full(from: u64, to: u64) -> EngineEvent {
    EngineEvent::BlockStored(BlockStored {
        block_hashes: hashes(from..to),
        parent_block_hash: from.checked_sub(1).map(EngineHash::Uint),
        token_ids: (from as u32 * BS..to as u32 * BS).collect(),
        block_size: BS,
        group_idx: Some(FULL),
        kv_cache_spec_kind: Some("full_attention".into()),
        medium: Some(Medium::Gpu),
        ..BlockStored::default()
    })
}

/// A window group's store after computing blocks `from..to`: it kept
/// `kept` of them.
fn window(group: i64, from: u64, to: u64, kept: &[u64]) -> EngineEvent {
    EngineEvent::BlockStored(BlockStored {
        block_hashes: hashes(kept.iter().copied()),
        parent_block_hash: from.checked_sub(1).map(EngineHash::Uint),
        token_ids: (from as u32 * BS..to as u32 * BS).collect(),
        block_size: BS,
        group_idx: Some(group),
        kv_cache_spec_kind: Some("sliding_window".into()),
        kv_cache_spec_sliding_window: Some(64),
        medium: Some(Medium::Gpu),
        ..BlockStored::default()
    })
}

fn removed(group: i64, ids: &[u64]) -> EngineEvent {
    EngineEvent::BlockRemoved(BlockRemoved {
        block_hashes: hashes(ids.iter().copied()),
        medium: Some(Medium::Gpu),
        group_idx: Some(group),
    })
}

/// One engine step: every group's events in one batch.
fn step(m: &mut Mapping, events: &[EngineEvent]) -> Vec<Update> {
    let mut out = Vec::new();
    m.apply_all(events, &mut out);
    out
}

/// The reported state: token count → not a valid end, for what is held.
#[derive(Default)]
struct Server(HashMap<i32, bool>);

impl Server {
    fn apply(&mut self, out: &[Update]) {
        for u in out {
            match u {
                Update::Report(r) => {
                    self.0.insert(r.token_count, r.no_match_end);
                }
                Update::Evict(e) => {
                    self.0.remove(&e.token_count);
                }
                Update::AllCleared => self.0.clear(),
            }
        }
    }

    /// Token counts a match may end at.
    fn ends(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self
            .0
            .iter()
            .filter(|(_, no_end)| !**no_end)
            .map(|(t, _)| *t)
            .collect();
        v.sort_unstable();
        v
    }
}

/// A 1000-token prompt (31 full blocks): each window group keeps blocks
/// 28..31; a match may end at 29 or 30 blocks' worth... of the ones the
/// server holds, exactly where vLLM would reuse.
#[test]
fn a_long_prefill_ends_only_where_the_windows_hold() {
    let mut m = Mapping::new(MappingConfig::default());
    let mut server = Server::default();
    let batch: Vec<EngineEvent> = (0..3)
        .map(|g| window(g, 0, 31, &[28, 29, 30]))
        .chain([full(0, 31)])
        .collect();
    server.apply(&step(&mut m, &batch));
    assert_eq!(server.0.len(), 31, "every full-attention block is reported");
    // End after block 29 (960 tokens) needs blocks 28, 29; after 30, 29 and 30.
    assert_eq!(server.ends(), [960, 992]);
    assert_eq!(m.window_blocks(), 9);
    // A follow-up stores block 31 in every group: 1024 is an end too.
    let batch: Vec<EngineEvent> = (0..3)
        .map(|g| window(g, 31, 32, &[31]))
        .chain([full(31, 32)])
        .collect();
    server.apply(&step(&mut m, &batch));
    assert_eq!(server.ends(), [960, 992, 1024]);
    // One group loses block 29: ends at 29 and 30 blocks go, re-reported.
    let out = step(&mut m, &[removed(1, &[29])]);
    assert_eq!(out.len(), 2, "{out:?}");
    server.apply(&out);
    assert_eq!(server.ends(), [1024]);
    assert_eq!(m.stats().end_changes, 2);
}

/// A resync (the sidecar reconnects: `ALL_CLEARED`, then every tracked
/// block) re-reports each block's mark as it stands, so a server that lost
/// its state gets the same match ends back.
#[test]
fn a_resync_re_reports_the_marks() {
    let mut m = Mapping::new(MappingConfig::default());
    let mut live = Server::default();
    let batch: Vec<EngineEvent> = (0..3)
        .map(|g| window(g, 0, 31, &[28, 29, 30]))
        .chain([full(0, 31)])
        .collect();
    live.apply(&step(&mut m, &batch));
    live.apply(&step(&mut m, &[removed(1, &[29])]));
    let mut restarted = Server::default();
    let mut resync = vec![Update::AllCleared];
    resync.extend(m.current_reports().map(Update::Report));
    restarted.apply(&resync);
    assert_eq!(restarted.0, live.0);
    assert!(restarted.0.values().any(|no_end| *no_end));
}

/// The full-attention group's events first in a batch: the model is known
/// hybrid before its first block is reported, so nothing is claimed valid
/// for a moment.
#[test]
fn full_attention_first_in_the_batch() {
    let mut m = Mapping::new(MappingConfig::default());
    let batch = [full(0, 4), window(0, 0, 4, &[2, 3])];
    let out = step(&mut m, &batch);
    let first: Vec<(i32, bool)> = out
        .iter()
        .filter_map(|u| match u {
            Update::Report(r) => Some((r.token_count, r.no_match_end)),
            _ => None,
        })
        .take(4)
        .collect();
    assert_eq!(
        first,
        [(32, true), (64, true), (96, true), (128, true)],
        "reported as not an end until the window blocks are seen"
    );
    let mut server = Server::default();
    server.apply(&out);
    assert_eq!(server.ends(), [128]);
}

/// Short prompts: a match shorter than the window needs every block from
/// the root; duplicates (a block stored twice in a window group) go one
/// copy at a time.
#[test]
fn short_prefixes_and_duplicate_window_blocks() {
    let mut m = Mapping::new(MappingConfig::default());
    let mut server = Server::default();
    server.apply(&step(&mut m, &[window(0, 0, 3, &[0, 1, 2]), full(0, 3)]));
    assert_eq!(server.ends(), [32, 64, 96]);
    server.apply(&step(&mut m, &[window(0, 0, 1, &[0])]));
    server.apply(&step(&mut m, &[removed(0, &[0])]));
    assert_eq!(
        server.ends(),
        [32, 64, 96],
        "another copy of block 0 remains"
    );
    server.apply(&step(&mut m, &[removed(0, &[0])]));
    assert_eq!(server.ends(), [96]);
}

/// A full-attention-only model never says anything new: every report is a
/// valid end and no window state is made.
#[test]
fn full_attention_models_are_unchanged() {
    let mut m = Mapping::new(MappingConfig::default());
    let plain = EngineEvent::BlockStored(BlockStored {
        block_hashes: hashes(0..3),
        token_ids: (0..96).collect(),
        block_size: BS,
        ..BlockStored::default()
    });
    let out = step(&mut m, &[plain]);
    assert_eq!(out.len(), 3);
    assert!(
        out.iter()
            .all(|u| matches!(u, Update::Report(r) if !r.no_match_end))
    );
    assert_eq!((m.window_blocks(), m.stats().window_blocks), (0, 0));
}

/// An engine restart forgets the windows with the blocks.
#[test]
fn reset_forgets_windows() {
    let mut m = Mapping::new(MappingConfig::default());
    step(&mut m, &[window(0, 0, 2, &[0, 1]), full(0, 2)]);
    m.reset();
    assert_eq!(m.window_blocks(), 0);
    let out = step(&mut m, &[full(0, 2)]);
    assert!(
        out.iter()
            .all(|u| matches!(u, Update::Report(r) if r.no_match_end)),
        "{out:?}"
    );
}

#[derive(Debug, Clone)]
enum Op {
    /// A window group keeps blocks `from..to` (clamped to the chain).
    Keep { group: i64, from: u64, len: u64 },
    /// A window group drops one copy of a block.
    Drop { group: i64, block: u64 },
    /// The full-attention chain grows by `n` blocks (its groups' events
    /// first or last in the batch).
    Grow { n: u64, window_first: bool },
    /// The full-attention chain loses its last block.
    Shrink,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0i64..2, 0u64..16, 1u64..4).prop_map(|(group, from, len)| Op::Keep { group, from, len }),
        (0i64..2, 0u64..16).prop_map(|(group, block)| Op::Drop { group, block }),
        (1u64..5, any::<bool>()).prop_map(|(n, window_first)| Op::Grow { n, window_first }),
        Just(Op::Shrink),
    ]
}

proptest! {
    /// Against vLLM's rule: after any sequence of window stores and
    /// removals and full-attention growth and eviction, the last report of
    /// every held full-attention block says it is a valid end exactly when
    /// every window group holds the blocks `max(0, e - 2) .. e` before the
    /// match point `e` (window 64 over 32-token blocks).
    #[test]
    fn reported_ends_follow_the_window_rule(ops in proptest::collection::vec(op(), 1..40)) {
        let mut m = Mapping::new(MappingConfig::default());
        let mut server = Server::default();
        // Copies per (group, block) the engine holds; the chain's length.
        let mut held: HashMap<(i64, u64), u32> = HashMap::new();
        let mut tail = 0u64;
        // Both groups exist from the start (as the engine's first step says).
        server.apply(&step(&mut m, &[window(0, 0, 0, &[]), window(1, 0, 0, &[])]));
        for op in ops {
            let out = match op {
                Op::Keep { group, from, len } => {
                    let kept: Vec<u64> = (from..from + len).collect();
                    for &b in &kept {
                        *held.entry((group, b)).or_default() += 1;
                    }
                    step(&mut m, &[window(group, from, from + len, &kept)])
                }
                Op::Drop { group, block } => {
                    match held.get_mut(&(group, block)) {
                        Some(n) if *n > 0 => *n -= 1,
                        _ => continue,
                    }
                    step(&mut m, &[removed(group, &[block])])
                }
                Op::Grow { n, window_first } => {
                    let (from, to) = (tail, tail + n);
                    tail = to;
                    let fa = full(from, to);
                    if window_first {
                        step(&mut m, &[window(0, from, to, &[]), fa])
                    } else {
                        step(&mut m, &[fa, window(0, from, to, &[])])
                    }
                }
                Op::Shrink => {
                    if tail == 0 {
                        continue;
                    }
                    tail -= 1;
                    step(&mut m, &[removed(FULL, &[tail])])
                }
            };
            server.apply(&out);
            let holds = |g: i64, b: u64| held.get(&(g, b)).is_some_and(|&n| n > 0);
            for e in 1..=tail {
                let valid = (0..2).all(|g| (e.saturating_sub(2)..e).all(|b| holds(g, b)));
                let tokens = (e * u64::from(BS)) as i32;
                prop_assert_eq!(server.0.get(&tokens).copied(), Some(!valid), "end {}", e);
            }
            prop_assert_eq!(server.0.len() as u64, tail);
        }
    }
}

/// Window blocks are bounded like full-attention ones: past the bound
/// (removals lost), they are forgotten and nothing is an end until the
/// engine stores window blocks again.
#[test]
fn window_blocks_are_bounded() {
    let mut m = Mapping::new(MappingConfig {
        max_tracked_blocks: 8,
        ..MappingConfig::default()
    });
    let mut server = Server::default();
    server.apply(&step(&mut m, &[window(0, 0, 4, &[0, 1, 2, 3]), full(0, 4)]));
    assert_eq!(server.ends(), [32, 64, 96, 128]);
    server.apply(&step(&mut m, &[window(0, 4, 9, &[10, 11, 12, 13, 14])]));
    assert_eq!(m.window_blocks(), 0);
    assert!(server.ends().is_empty());
    server.apply(&step(&mut m, &[window(0, 2, 4, &[2, 3])]));
    assert_eq!(server.ends(), [128]);
}

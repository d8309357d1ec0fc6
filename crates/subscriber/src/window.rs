//! Hybrid models: which full-attention blocks a match may END at.
//!
//! A hybrid model's KV cache has several groups (vLLM's hybrid memory
//! allocator): full-attention groups hold every block of a prompt, while a
//! sliding-window group keeps only the blocks inside its window (after a
//! long prefill, the last two or three; decode stores none). vLLM reuses a
//! prefix only up to a point where every non-full group can serve it
//! (`HybridKVCacheCoordinator.find_longest_cache_hit`): for a sliding window
//! of `w` tokens over blocks of `b`, a match of `e` blocks needs that group
//! to hold the `n = ceil((w - 1) / b)` blocks just before the match point,
//! `e - n .. e` (all of `0 .. e` when `e < n`; `SlidingWindowManager`).
//!
//! [`Windows`] keeps, per non-full group, the engine hashes it holds (with
//! physical copies, as the full-attention map does), and for the
//! full-attention chain the parent and child links between engine hashes
//! (block `i`'s hash is the same in every group of one block size). A
//! full-attention block is a valid end when every non-full group holds it
//! and the blocks before it that the group's window needs; the mapping
//! reports that with each block and re-reports a block whose validity
//! changes (blocks of a window stored or removed).
//!
//! Rules per group kind (`kv_cache_spec_kind`, `kv_cache_spec_sliding_window`):
//! - sliding window `w`: the window rule above;
//! - Mamba (and other state-space kinds): a match ends only on a block the
//!   group holds (a window of one block);
//! - anything else that is not full attention (chunked local attention,
//!   whose rule depends on the request's length; an unknown kind): no block
//!   is a valid end, so the replica is never hinted a match there (a missed
//!   hint, never a false one).
//!
//! Cost: none for a model whose events name only full-attention groups
//! (no `Windows` is made). For a hybrid one, a link per full-attention block
//! and a set entry per held window block; a validity check walks at most
//! `n` parent links per group, a store or removal re-checks the block and
//! its descendants within `n - 1` levels.

use std::collections::HashMap;

use foldhash::fast::RandomState;

use crate::event::BlockStored;
use crate::hash::EngineHash;

/// How a non-full-attention group decides whether a match may end at a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The group must hold the last `n` blocks up to and including the end
    /// block (all of them from the root when the prefix is shorter).
    Window(usize),
    /// The group's rule is not known here: no block is a valid end.
    Never,
}

impl Rule {
    /// The rule of the group `ev` belongs to; `None` for full attention.
    pub fn of(ev: &BlockStored) -> Option<Rule> {
        let kind = ev
            .kv_cache_spec_kind
            .as_deref()
            .map(str::to_ascii_lowercase);
        let kind = kind.as_deref().unwrap_or("");
        if let Some(w) = ev.kv_cache_spec_sliding_window {
            return Some(window_rule(w, ev.block_size));
        }
        if kind.contains("sliding") || kind.contains("swa") {
            // A window we are not told: nothing to go by.
            return Some(Rule::Never);
        }
        if kind.contains("mamba") {
            return Some(Rule::Window(1));
        }
        if ["local", "linear"].iter().any(|k| kind.contains(k)) {
            return Some(Rule::Never);
        }
        if kind.is_empty() || kind.contains("full") || kind.contains("mla") {
            return None;
        }
        // An unknown kind that is not full attention by name.
        Some(Rule::Never)
    }
}

/// `ceil((window - 1) / block_size)` blocks (vLLM's
/// `SlidingWindowManager._contiguous_blocks_for_hit` without EAGLE).
fn window_rule(window: i64, block_size: u32) -> Rule {
    if block_size == 0 || window < 1 {
        return Rule::Never;
    }
    let w = u64::try_from(window - 1).unwrap_or(0);
    let n = w.div_ceil(u64::from(block_size));
    Rule::Window(usize::try_from(n).unwrap_or(usize::MAX))
}

#[derive(Debug)]
struct Group {
    rule: Rule,
    /// Held engine hashes with their physical GPU copies.
    held: HashMap<EngineHash, u32, RandomState>,
}

#[derive(Debug, Default)]
struct Link {
    /// Whether `parent` is known: a placeholder made for a child before its
    /// parent was linked knows nothing of its own parent.
    known: bool,
    /// `None` (when known): a root block (the chain starts here).
    parent: Option<EngineHash>,
    children: Vec<EngineHash>,
    /// Full-attention groups holding the block.
    refs: u32,
}

/// What a window change affects: the hashes whose validity may have changed.
pub type Affected = Vec<EngineHash>;

/// The non-full groups and the full-attention chain's links.
#[derive(Debug, Default)]
pub struct Windows {
    groups: HashMap<i64, Group, RandomState>,
    links: HashMap<EngineHash, Link, RandomState>,
}

impl Windows {
    /// An empty tracker (a hybrid model was seen).
    pub fn new() -> Self {
        Self::default()
    }

    /// Window blocks held, over every non-full group.
    pub fn held_blocks(&self) -> usize {
        self.groups.values().map(|g| g.held.len()).sum()
    }

    /// Forgets every held window block (links stay): no block is a valid
    /// end until window blocks are stored again.
    pub fn forget_held(&mut self) {
        for g in self.groups.values_mut() {
            g.held.clear();
        }
    }

    /// Forgets every held block and link (an engine restart or clear); the
    /// groups' rules stay.
    pub fn reset(&mut self) {
        for g in self.groups.values_mut() {
            g.held.clear();
        }
        self.links.clear();
    }

    /// A full-attention block `hash` (child of `parent`) is held by one
    /// more full-attention group (`new`: the group did not hold it before).
    pub fn link(&mut self, hash: &EngineHash, parent: Option<&EngineHash>, new: bool) {
        let link = self.links.entry(hash.clone()).or_default();
        if new {
            link.refs = link.refs.saturating_add(1);
        }
        if !link.known {
            link.known = true;
            link.parent = parent.cloned();
            if let Some(p) = parent {
                self.links
                    .entry(p.clone())
                    .or_default()
                    .children
                    .push(hash.clone());
            }
        }
    }

    /// A full-attention group no longer holds block `hash`; its link goes
    /// with the last one.
    pub fn unlink(&mut self, hash: &EngineHash) {
        let Some(link) = self.links.get_mut(hash) else {
            return;
        };
        link.refs = link.refs.saturating_sub(1);
        if link.refs > 0 {
            return;
        }
        // A block with linked children stays as their placeholder (their
        // windows walk through it) until the last of them goes.
        if !link.children.is_empty() {
            return;
        }
        let parent = link.parent.clone();
        self.links.remove(hash);
        if let Some(p) = parent {
            self.drop_child(&p, hash);
        }
    }

    fn drop_child(&mut self, parent: &EngineHash, child: &EngineHash) {
        let Some(link) = self.links.get_mut(parent) else {
            return;
        };
        link.children.retain(|c| c != child);
        if link.refs == 0 && link.children.is_empty() {
            let grand = link.parent.clone();
            self.links.remove(parent);
            if let Some(g) = grand {
                self.drop_child(&g, parent);
            }
        }
    }

    /// `group` is a non-full group with `rule` (from its store event).
    pub fn declare(&mut self, group: i64, rule: Rule) {
        self.group(group, rule);
    }

    fn group(&mut self, group: i64, rule: Rule) -> &mut Group {
        let g = self.groups.entry(group).or_insert_with(|| Group {
            rule,
            held: HashMap::default(),
        });
        g.rule = rule;
        g
    }

    /// Window blocks stored in `group` (`rule` from its event): the hashes
    /// whose validity may have changed.
    pub fn store(&mut self, group: i64, rule: Rule, hashes: &[EngineHash]) -> Affected {
        let g = self.group(group, rule);
        for h in hashes {
            let n = g.held.entry(h.clone()).or_insert(0);
            *n = n.saturating_add(1);
        }
        self.affected(hashes.iter())
    }

    /// Window blocks removed from `group` (one physical copy each): the
    /// hashes whose validity may have changed. `None` when `group` is not
    /// a non-full group this tracker knows.
    pub fn remove(&mut self, group: i64, hashes: &[EngineHash]) -> Option<Affected> {
        let g = self.groups.get_mut(&group)?;
        let mut gone = Vec::new();
        for h in hashes {
            if let Some(n) = g.held.get_mut(h) {
                *n -= 1;
                if *n == 0 {
                    g.held.remove(h);
                    gone.push(h);
                }
            }
        }
        Some(self.affected(gone.into_iter()))
    }

    /// Whether `group` is a non-full group this tracker knows.
    pub fn knows(&self, group: i64) -> bool {
        self.groups.contains_key(&group)
    }

    /// Each of `hashes` and its descendants within `n - 1` levels, for the
    /// widest window `n`.
    fn affected<'h>(&self, hashes: impl Iterator<Item = &'h EngineHash>) -> Affected {
        let depth = self.widest().saturating_sub(1);
        let mut out = Vec::new();
        let mut level: Vec<EngineHash> = hashes.cloned().collect();
        out.extend(level.iter().cloned());
        for _ in 0..depth {
            let next: Vec<EngineHash> = level
                .iter()
                .filter_map(|h| self.links.get(h))
                .flat_map(|l| l.children.iter().cloned())
                .collect();
            if next.is_empty() {
                break;
            }
            out.extend(next.iter().cloned());
            level = next;
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    fn widest(&self) -> usize {
        self.groups
            .values()
            .map(|g| match g.rule {
                Rule::Window(n) => n,
                Rule::Never => 1,
            })
            .max()
            .unwrap_or(0)
    }

    /// Whether a match may end at full-attention block `hash`: every
    /// non-full group holds the blocks its rule needs up to it.
    pub fn valid_end(&self, hash: &EngineHash) -> bool {
        let widest = self.widest();
        // The block and its ancestors, nearest first, as far as any window
        // reaches; `rooted` when the walk reached the chain's start.
        let mut chain: Vec<&EngineHash> = Vec::with_capacity(widest.min(64));
        let mut cur = Some(hash);
        let mut rooted = false;
        while let Some(h) = cur {
            if chain.len() == widest {
                break;
            }
            chain.push(h);
            match self.links.get(h) {
                Some(l) if l.known => {
                    cur = l.parent.as_ref();
                    rooted = cur.is_none();
                }
                _ => cur = None,
            }
        }
        self.groups.values().all(|g| match g.rule {
            Rule::Never => false,
            Rule::Window(n) => {
                let enough = chain.len() >= n || rooted;
                enough && chain.iter().take(n).all(|h| g.held.contains_key(*h))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn h(i: u64) -> EngineHash {
        EngineHash::Uint(i)
    }

    /// A chain of full-attention blocks `0..n` (hash = index).
    fn chain(w: &mut Windows, n: u64) {
        for i in 0..n {
            w.link(&h(i), i.checked_sub(1).map(h).as_ref(), true);
        }
    }

    #[test]
    fn rules_by_kind() {
        let ev = |kind: Option<&str>, window: Option<i64>| BlockStored {
            kv_cache_spec_kind: kind.map(str::to_owned),
            kv_cache_spec_sliding_window: window,
            block_size: 32,
            ..BlockStored::default()
        };
        assert_eq!(Rule::of(&ev(None, None)), None);
        assert_eq!(Rule::of(&ev(Some("full_attention"), None)), None);
        assert_eq!(Rule::of(&ev(Some("mla_attention"), None)), None);
        assert_eq!(Rule::of(&ev(Some("sink_full_attention"), None)), None);
        // Window 64 over 32-token blocks: the two blocks before the end.
        assert_eq!(
            Rule::of(&ev(Some("sliding_window"), Some(64))),
            Some(Rule::Window(2))
        );
        assert_eq!(
            Rule::of(&ev(Some("sliding_window"), Some(65))),
            Some(Rule::Window(2))
        );
        assert_eq!(
            Rule::of(&ev(Some("sliding_window"), Some(66))),
            Some(Rule::Window(3))
        );
        assert_eq!(
            Rule::of(&ev(Some("sliding_window_mla"), Some(128))),
            Some(Rule::Window(4))
        );
        assert_eq!(
            Rule::of(&ev(Some("sliding_window"), None)),
            Some(Rule::Never)
        );
        assert_eq!(Rule::of(&ev(Some("mamba"), None)), Some(Rule::Window(1)));
        assert_eq!(
            Rule::of(&ev(Some("chunked_local_attention"), None)),
            Some(Rule::Never)
        );
        assert_eq!(
            Rule::of(&ev(Some("cross_attention"), None)),
            Some(Rule::Never)
        );
    }

    #[test]
    fn the_window_needs_the_blocks_just_before_the_end() {
        let mut w = Windows::new();
        chain(&mut w, 10);
        // A long prefill: the window group keeps blocks 7, 8, 9.
        w.store(1, Rule::Window(2), &[h(7), h(8), h(9)]);
        let valid: Vec<u64> = (0..10).filter(|&i| w.valid_end(&h(i))).collect();
        // End at block 8 (9 blocks) needs 7, 8; at 9 needs 8, 9.
        assert_eq!(valid, [8, 9]);
        // Short prefixes need every block from the root.
        w.store(1, Rule::Window(2), &[h(0)]);
        assert!(w.valid_end(&h(0)));
        assert!(!w.valid_end(&h(1)));
        // A second group must agree.
        w.store(2, Rule::Window(2), &[h(8), h(9)]);
        let valid: Vec<u64> = (0..10).filter(|&i| w.valid_end(&h(i))).collect();
        assert_eq!(valid, [9]);
    }

    #[test]
    fn removals_and_copies() {
        let mut w = Windows::new();
        chain(&mut w, 4);
        w.store(1, Rule::Window(2), &[h(2), h(3)]);
        w.store(1, Rule::Window(2), &[h(2)]);
        assert!(w.valid_end(&h(3)));
        // One of two copies of block 2 goes: still valid.
        let a = w.remove(1, &[h(2)]).unwrap();
        assert!(a.is_empty());
        assert!(w.valid_end(&h(3)));
        // The last copy: block 2 and its child 3 are affected.
        let a = w.remove(1, &[h(2)]).unwrap();
        assert_eq!(a, [h(2), h(3)]);
        assert!(!w.valid_end(&h(3)));
        assert!(w.remove(7, &[h(2)]).is_none(), "unknown group");
    }

    #[test]
    fn never_rule_and_unlinked_ancestors_are_not_ends() {
        let mut w = Windows::new();
        chain(&mut w, 3);
        w.store(1, Rule::Window(3), &[h(0), h(1), h(2)]);
        assert!(w.valid_end(&h(2)));
        // Block 1's full-attention copy went: kept as its child's
        // placeholder, so the child's window still walks through it.
        w.unlink(&h(1));
        assert!(w.valid_end(&h(2)));
        // The child went too: both links go.
        w.unlink(&h(2));
        assert!(!w.links.contains_key(&h(1)) && !w.links.contains_key(&h(2)));
        // Block 2 back without its parent linked: its window cannot be
        // checked back to the root, so not an end.
        w.link(&h(2), Some(&h(1)), true);
        assert!(!w.valid_end(&h(2)));
        w.store(3, Rule::Never, &[h(0)]);
        assert!(!w.valid_end(&h(0)));
    }

    proptest! {
        /// Against vLLM's rule on one chain: a match of `e` blocks may end
        /// at block `e - 1` iff every group holds blocks
        /// `max(0, e - n) .. e`.
        #[test]
        fn valid_ends_follow_the_window_rule(
            len in 1u64..24,
            windows in proptest::collection::vec(1usize..5, 1..3),
            held in proptest::collection::vec(proptest::collection::vec(any::<bool>(), 24), 3),
        ) {
            let mut w = Windows::new();
            chain(&mut w, len);
            for (g, &n) in windows.iter().enumerate() {
                let hs: Vec<EngineHash> = (0..len).filter(|&i| held[g][i as usize]).map(h).collect();
                w.store(g as i64, Rule::Window(n), &hs);
            }
            for e in 1..=len {
                let want = windows.iter().enumerate().all(|(g, &n)| {
                    (e.saturating_sub(n as u64)..e).all(|i| held[g][i as usize])
                });
                prop_assert_eq!(w.valid_end(&h(e - 1)), want, "end {}", e);
            }
        }
    }
}

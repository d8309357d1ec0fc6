//! The chain walk (§2.6.3): every replica's longest leading run of fresh
//! blocks, with its weakest-link `last_seen` and coldest tier.
//!
//! A request whose blocks are all 8 bytes long (every engine's) is walked
//! by the chain-run arena (`arena/walk.rs`: one probe per stored run). Any
//! other request is walked block by block through the entry facade, each
//! block's holders merge-joined against the live runs (both sorted by
//! replica id); runs that end are dropped at once, and the walk stops as
//! soon as no run is left.
//!
//! A run's depth is final once the walk ends; it then backs off to the
//! deepest block its replica reported as a valid match end (hybrid models,
//! `endpoints.rs`; nothing to do, one load, elsewhere). Both rankings walk
//! here, so both see it.

use crate::arena::RunMatch;
use crate::entries::Entries;
use crate::entries::holder::Holder;
use crate::key::KeyRef;
use crate::types::Tier;
use std::cell::RefCell;

/// One replica's leading run: the arena's own answer type, so the arena's
/// walk hands its result to the ranking without a copy.
pub(crate) type Run = RunMatch;

/// Per-thread buffers, reused by every lookup on the thread.
#[derive(Default)]
struct Scratch {
    live: Vec<Run>,
    ended: Vec<Run>,
    /// The arena's answer.
    matches: Vec<RunMatch>,
    holders: Vec<Holder>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Walk the chain of `part` and hand `out` every replica whose run has at
/// least the first block, in replica-id order.
pub(crate) fn walk<H: AsRef<[u8]>, T>(
    entries: &Entries,
    part: u32,
    hashes: &[H],
    counts: &[i32],
    now: i64,
    ttl: i64,
    out: impl FnOnce(&[Run]) -> T,
) -> T {
    if ttl <= 0 || hashes.is_empty() {
        return out(&[]);
    }
    // `now - last_seen < ttl` (saturating, as in `ranking::freshness`) is
    // exactly `last_seen >= now - ttl + 1` computed without overflow; below
    // `i64::MIN` every entry is fresh.
    let lo = i128::from(now) - i128::from(ttl) + 1;
    let cutoff = i64::try_from(lo).unwrap_or(i64::MIN);
    let walker = |s: &mut Scratch| {
        s.live.clear();
        s.ended.clear();
        if hashes.iter().all(|h| h.as_ref().len() == 8) {
            // Already in replica order.
            let key = |i: usize| hashes[i].as_ref().try_into().map_or(0, u64::from_le_bytes);
            let arena = entries.arena();
            arena.walk_by(part, hashes.len(), key, counts, cutoff, &mut s.matches);
            // Each run's depth is final here: back off to a valid end.
            entries
                .endpoints
                .back_off(part, |i| Some(key(i)), counts, &mut s.matches);
            return out(&s.matches);
        }
        walk_mixed(entries, part, hashes, counts, cutoff, s);
        let key = |i: usize| hashes[i].as_ref().try_into().ok().map(u64::from_le_bytes);
        if s.ended.is_empty() {
            // Every run went on to the end: `live` kept its replica order.
            entries.endpoints.back_off(part, key, counts, &mut s.live);
            return out(&s.live);
        }
        s.ended.append(&mut s.live);
        s.ended.sort_unstable_by_key(|r| r.replica);
        entries.endpoints.back_off(part, key, counts, &mut s.ended);
        out(&s.ended)
    };
    crate::scratch::with(&SCRATCH, walker)
}

/// A request whose blocks are not all 8 bytes long: its blocks may live in
/// both stores, so each is read through the facade (no engine sends such a
/// chain; this keeps such a request correct, not fast).
fn walk_mixed<H: AsRef<[u8]>>(
    entries: &Entries,
    part: u32,
    hashes: &[H],
    counts: &[i32],
    cutoff: i64,
    s: &mut Scratch,
) {
    for (i, (h, &count)) in hashes.iter().zip(counts).enumerate() {
        s.holders.clear();
        entries.holders(&KeyRef::new(part, h.as_ref()), |held| {
            s.holders.extend_from_slice(held)
        });
        if i == 0 {
            s.live.extend(
                s.holders
                    .iter()
                    .filter(|h| h.last_seen >= cutoff)
                    .map(|h| Run {
                        replica: h.replica(),
                        matched: count,
                        oldest: h.last_seen,
                        tier: h.tier(),
                        blocks: 1,
                    }),
            );
        } else {
            extend(&mut s.live, &mut s.ended, &s.holders, count, cutoff);
        }
        if s.live.is_empty() {
            break;
        }
    }
}

/// Extend the live runs by one block (a merge-join: both lists are sorted by
/// replica id); runs without a fresh holder move to `ended`.
#[inline]
fn extend(live: &mut Vec<Run>, ended: &mut Vec<Run>, holders: &[Holder], count: i32, cutoff: i64) {
    // Fast path: the block is held, fresh, by exactly the live replicas (a
    // prefix-closed cache's usual shape), so every run goes on in lockstep.
    if holders.len() == live.len()
        && holders
            .iter()
            .zip(live.iter())
            .all(|(h, r)| h.replica() == r.replica && h.last_seen >= cutoff)
    {
        for (r, h) in live.iter_mut().zip(holders) {
            r.matched = r.matched.wrapping_add(count);
            r.oldest = r.oldest.min(h.last_seen);
            r.tier = Tier::worst(r.tier, h.tier());
            r.blocks += 1;
        }
        return;
    }
    let mut kept = 0;
    let mut j = 0;
    for k in 0..live.len() {
        let run = live[k];
        while j < holders.len() && holders[j].replica() < run.replica {
            j += 1;
        }
        match holders.get(j) {
            Some(h) if h.replica() == run.replica && h.last_seen >= cutoff => {
                live[kept] = Run {
                    replica: run.replica,
                    matched: run.matched.wrapping_add(count),
                    oldest: run.oldest.min(h.last_seen),
                    tier: Tier::worst(run.tier, h.tier()),
                    blocks: run.blocks + 1,
                };
                kept += 1;
                j += 1;
            }
            _ => ended.push(run),
        }
    }
    live.truncate(kept);
}

//! The chain walk (§2.6.3): every replica's longest leading run of fresh
//! blocks, with its weakest-link `last_seen` and coldest tier.
//!
//! The request's blocks are read in windows (2, 16, 32, then 64 blocks). For
//! a window, the read locks of every shard its blocks live in are taken once,
//! in ascending shard order (so two lookups can never wait on each other
//! through a queued writer), and released before the next window: a lookup
//! pays about one lock per distinct shard instead of one per block. All the
//! probes of a window run before any merge, in passes that start every
//! block's bucket load, then every block's slot load, before any result is
//! needed, so their cache misses overlap. Runs that end are dropped from the candidate list at once, and the
//! walk stops as soon as no run is left.

use crate::arena::RunMatch;
use crate::entries::Entries;
use crate::holder::Holder;
use crate::key::{KeyRef, key_hash};
use crate::shard::Shards;
use crate::types::Tier;
use arrayvec::ArrayVec;
use std::cell::RefCell;

/// One replica's leading run: the arena's own answer type, so the arena's
/// walk hands its result to the ranking without a copy.
pub(crate) type Run = RunMatch;

/// The first window is short because most lookups end in it: the median
/// `bench/peers` lookup matches its first block and misses its second, so
/// a first window of 2 blocks is exactly the blocks it needs (2 shard
/// locks, 4 misses); 4 blocks cost it two more locks and four more misses
/// (p50 10 % higher at scale 16), 8 blocks 10-13 % more again, and 1 block a
/// second round trip for the miss (p50 +50 %). The second window jumps to 16
/// so a long chain needs no more windows than with 8, 16, 32, 64.
const FIRST_WINDOW: usize = 2;
const SECOND_WINDOW: usize = 16;
const MAX_WINDOW: usize = 64;

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
        match entries.arena() {
            None => walk_with(
                &entries.slots,
                part,
                hashes,
                counts,
                cutoff,
                &mut s.ended,
                &mut s.live,
            ),
            Some(arena) => {
                if hashes.iter().all(|h| h.as_ref().len() == 8) {
                    // Already in replica order.
                    let key =
                        |i: usize| hashes[i].as_ref().try_into().map_or(0, u64::from_le_bytes);
                    arena.walk_by(part, hashes.len(), key, counts, cutoff, &mut s.matches);
                    return out(&s.matches);
                }
                walk_mixed(entries, part, hashes, counts, cutoff, s);
            }
        }
        if s.ended.is_empty() {
            // Every run went on to the end: `live` kept its replica order.
            return out(&s.live);
        }
        s.ended.append(&mut s.live);
        s.ended.sort_unstable_by_key(|r| r.replica);
        out(&s.ended)
    };
    crate::scratch::with(&SCRATCH, walker)
}

/// A request whose blocks are not all 8 bytes long, with the arena on: its
/// blocks live in both stores, so each is read through the facade (no
/// engine mixes hash lengths in one chain; this only keeps such a request
/// correct).
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
            s.holders.extend(
                held.iter()
                    .map(|h| Holder::new(h.replica(), h.tokens, h.tier(), h.last_seen)),
            )
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

/// `ended` receives the runs that ended, `live` keeps the ones still going.
fn walk_with<H: AsRef<[u8]>>(
    shards: &Shards,
    part: u32,
    hashes: &[H],
    counts: &[i32],
    cutoff: i64,
    ended: &mut Vec<Run>,
    live: &mut Vec<Run>,
) {
    let n = hashes.len().min(counts.len());
    let (hashes, counts) = (&hashes[..n], &counts[..n]);
    // Reset per window up to its length only (a 512-byte memset of `at`
    // every window was ~4 % of a short lookup).
    let mut key_hashes = [0u64; MAX_WINDOW];
    let mut at = [usize::MAX; MAX_WINDOW];
    let mut start = 0;
    let mut window = FIRST_WINDOW;
    while start < n {
        let end = (start + window).min(n);
        window = if window < SECOND_WINDOW {
            SECOND_WINDOW
        } else {
            (window * 2).min(MAX_WINDOW)
        };
        let blocks = &hashes[start..end];
        let m = blocks.len();
        for (k, h) in key_hashes.iter_mut().zip(blocks) {
            *k = key_hash(part, h.as_ref());
        }
        // The window's shards read-locked once each, then the bucket and
        // slot passes (`ReadSet::touch`), then a third pass confirms the
        // keys and collects the holders.
        let set = shards.read_set(&key_hashes[..m]);
        at[..m].fill(usize::MAX);
        set.touch(&key_hashes[..m], &mut at[..m]);
        let mut found: ArrayVec<&[Holder], MAX_WINDOW> = ArrayVec::new();
        for ((h, &k), &i) in blocks.iter().zip(&key_hashes).zip(&at) {
            let key = KeyRef {
                part,
                bytes: h.as_ref(),
                hash: k,
            };
            let held = match set.get(k) {
                Some(g) if i != usize::MAX => g.get_at(i, &key).unwrap_or(&[]),
                _ => &[],
            };
            found.push(held);
        }
        let mut rest = found.iter().zip(&counts[start..end]);
        if start == 0 {
            if let Some((&holders, &count)) = rest.next() {
                live.extend(
                    holders
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
            }
        }
        for (&holders, &count) in rest {
            if live.is_empty() {
                break;
            }
            extend(live, ended, holders, count, cutoff);
        }
        drop(found);
        drop(set);
        if live.is_empty() {
            break;
        }
        start = end;
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

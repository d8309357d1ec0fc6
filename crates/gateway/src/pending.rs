//! Prefixes the gateway has routed and the index has not confirmed yet.
//!
//! The index learns an engine holds a prefix from the engine's KV events,
//! which arrive after the engine scheduled the request (end of its step, the
//! subscriber's report window, the index's apply). Routers that keep their
//! own prefix tree (sglang-router, vllm-router's `cache_aware`) know the
//! moment they route. Under concurrency that gap matters: a second request
//! for a new system prompt arrives while the first is still prefilling, the
//! index has nothing, and the load signal sends it to the other engine,
//! which then prefills (and caches) the same prefix a second time.
//!
//! So each engine keeps the block chain of every request routed to it
//! (the content fingerprint chain of the prompt's whole blocks, rooted in model, adapter and
//! salt, the things that separate KV caches) from dispatch until shortly
//! after its first output byte: vLLM caches a prompt's full blocks when it
//! schedules it, so a later request can reuse them as soon as they exist,
//! and once the first token is out the engine's events reach the index
//! within [`CONFIRM_GRACE`]. A request that fails or is abandoned before
//! its first byte takes its entries back. Entries are bounded per engine.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a routed prefix stays after the engine's first output byte: the
/// engine's KV events reach the index well within it (a step, the
/// subscriber's 10 ms window, the apply), after which the hint says it.
pub const CONFIRM_GRACE: Duration = Duration::from_secs(2);

/// Longest a prefix counts while its request has not produced a byte (a
/// request stuck longer than this is not a prefix anyone should wait on).
pub const MAX_UNCONFIRMED: Duration = Duration::from_secs(30);

/// Most block hashes kept per engine (one 1,536-token prompt with 32-token
/// blocks is 48); past it expired entries are swept, then the oldest
/// owner's entries go.
pub const MAX_ENTRIES: usize = 1 << 16;

/// The block chain of a prompt: `chain[k]` identifies its first `k + 1`
/// whole blocks.
pub fn chain(tokens: &[u32], block_size: u32, namespace: &[&str]) -> Vec<u64> {
    use inferencecache_client::fingerprint::{ExtraKeys, prefix_hashes_from, with_extra_keys};
    // The namespace is the chain's root: each part is a tagged,
    // length-prefixed key, so ("ab", "") and ("a", "b") differ; the blocks
    // chain onto it with the content fingerprint the index uses.
    let mut keys = ExtraKeys::new();
    for part in namespace {
        keys.push_str(part);
    }
    let root = with_extra_keys(0, &keys);
    prefix_hashes_from(tokens, block_size.max(1) as usize, Some(root))
}

/// One block hash: how many routed requests hold it unconfirmed, and until
/// when it stands on its own (after a first byte).
#[derive(Debug, Clone, Copy)]
struct Entry {
    refs: u32,
    /// The latest unconfirmed holder's dispatch.
    since: Instant,
    /// Set by a holder's first byte.
    grace_until: Option<Instant>,
}

impl Entry {
    fn live(&self, now: Instant) -> bool {
        (self.refs > 0 && now < self.since + MAX_UNCONFIRMED)
            || self.grace_until.is_some_and(|t| now < t)
    }
}

/// One engine's routed-but-unconfirmed block chains.
#[derive(Debug, Default)]
pub struct Pending {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    blocks: HashMap<u64, Entry>,
    /// Unconfirmed holders, oldest first, and their chains (to release or
    /// confirm them without scanning the map).
    owners: Vec<(u64, Vec<u64>)>,
    last_sweep: Option<Instant>,
}

impl Pending {
    /// Whole blocks of `chain` this engine was sent and has not confirmed.
    pub fn matched_blocks(&self, chain: &[u64], now: Instant) -> usize {
        let Ok(inner) = self.inner.lock() else {
            return 0;
        };
        if inner.blocks.is_empty() {
            return 0;
        }
        // Entries are inserted per whole prefix, so the longest live one is
        // the match.
        (0..chain.len())
            .rev()
            .find(|&k| inner.blocks.get(&chain[k]).is_some_and(|e| e.live(now)))
            .map_or(0, |k| k + 1)
    }

    /// `owner` sent `chain` here.
    pub fn insert(&self, owner: u64, chain: &[u64], now: Instant) {
        if chain.is_empty() {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        // Confirmed entries expire in place; sweep them now and then so the
        // map stays the size of the recent traffic.
        let due = inner
            .last_sweep
            .is_none_or(|t| now.saturating_duration_since(t) >= CONFIRM_GRACE);
        if due || inner.blocks.len() + chain.len() > MAX_ENTRIES {
            inner.sweep(now);
            inner.last_sweep = Some(now);
        }
        while inner.blocks.len() + chain.len() > MAX_ENTRIES && !inner.owners.is_empty() {
            let (_, c) = inner.owners.remove(0);
            inner.drop_holder(&c, None);
        }
        if inner.blocks.len() + chain.len() > MAX_ENTRIES {
            inner.blocks.clear();
        }
        for h in chain {
            let e = inner.blocks.entry(*h).or_insert(Entry {
                refs: 0,
                since: now,
                grace_until: None,
            });
            e.refs += 1;
            e.since = now;
        }
        inner.owners.push((owner, chain.to_vec()));
    }

    /// `owner`'s request produced its first byte: its blocks exist on the
    /// engine; they stay [`CONFIRM_GRACE`] longer, for the events to land.
    pub fn confirm(&self, owner: u64, now: Instant) {
        self.end(owner, Some(now + CONFIRM_GRACE));
    }

    /// `owner`'s request failed or was abandoned before its first byte.
    pub fn release(&self, owner: u64) {
        self.end(owner, None);
    }

    fn end(&self, owner: u64, grace_until: Option<Instant>) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if let Some(i) = inner.owners.iter().position(|(o, _)| *o == owner) {
            let (_, c) = inner.owners.remove(i);
            inner.drop_holder(&c, grace_until);
        }
    }

    /// Block hashes held (a gauge; tests).
    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |i| i.blocks.len())
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Inner {
    fn drop_holder(&mut self, chain: &[u64], grace_until: Option<Instant>) {
        for h in chain {
            let Some(e) = self.blocks.get_mut(h) else {
                continue;
            };
            e.refs = e.refs.saturating_sub(1);
            if grace_until.is_some() {
                e.grace_until = e.grace_until.max(grace_until);
            }
            if e.refs == 0 && e.grace_until.is_none() {
                self.blocks.remove(h);
            }
        }
    }

    fn sweep(&mut self, now: Instant) {
        self.blocks.retain(|_, e| e.live(now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_share_prefixes_and_separate_namespaces() {
        let a: Vec<u32> = (0..100).collect();
        let mut b = a.clone();
        b[70] = 9999;
        let ca = chain(&a, 32, &["m", "", ""]);
        let cb = chain(&b, 32, &["m", "", ""]);
        assert_eq!(ca.len(), 3);
        assert_eq!(ca[..2], cb[..2]);
        assert_ne!(ca[2], cb[2]);
        assert_ne!(chain(&a, 32, &["m", "", "salt"])[0], ca[0]);
        assert_ne!(chain(&a, 32, &["m", "lora", ""])[0], ca[0]);
    }

    #[test]
    fn routed_prefixes_match_until_confirmed_and_expired_or_released() {
        let p = Pending::default();
        let t0 = Instant::now();
        let sys: Vec<u32> = (0..96).collect();
        let first = chain(&sys, 32, &["m"]);
        p.insert(1, &first, t0);
        // A second request with the same 3-block system prompt and its own
        // question sees the three blocks.
        let mut second: Vec<u32> = sys.clone();
        second.extend(500..540);
        assert_eq!(p.matched_blocks(&chain(&second, 32, &["m"]), t0), 3);
        // Another model's request does not.
        assert_eq!(p.matched_blocks(&chain(&second, 32, &["x"]), t0), 0);
        // Still pending while the first request prefills, up to the cap.
        let later = t0 + Duration::from_secs(10);
        assert_eq!(p.matched_blocks(&first, later), 3);
        assert_eq!(p.matched_blocks(&first, t0 + MAX_UNCONFIRMED), 0);
        // Its first byte: a grace period for the events, then gone.
        p.confirm(1, later);
        assert_eq!(p.matched_blocks(&first, later + CONFIRM_GRACE / 2), 3);
        assert_eq!(p.matched_blocks(&first, later + CONFIRM_GRACE), 0);
        // A request that fails before its first byte takes its blocks back,
        // but not those another request still holds.
        let other = chain(&sys, 32, &["other"]);
        p.insert(2, &other[..1], t0);
        p.insert(3, &other, t0);
        p.release(3);
        assert_eq!(p.matched_blocks(&other, t0), 1);
        p.release(2);
        assert_eq!(p.matched_blocks(&other, t0), 0);
    }

    #[test]
    fn entries_are_bounded() {
        let p = Pending::default();
        let t0 = Instant::now();
        for owner in 0..(MAX_ENTRIES as u64 / 100 + 10) {
            let c: Vec<u64> = (0..100).map(|i| owner * 1000 + i).collect();
            p.insert(owner, &c, t0);
        }
        assert!(p.len() <= MAX_ENTRIES);
    }
}

//! Tentative holdings (approximate mode): what the server believes a replica
//! is about to hold because it has just sent it a request.
//!
//! When a hint is delivered in the estimated-TTFT ranking, the request's chain
//! is recorded on the chosen replica with a short TTL (CachePolicy v8
//! `routing.tentativeTTLSeconds`, default 120 s). A follow-up request that
//! arrives before the engine's KV events (or from an engine that publishes
//! none) then matches the replica it was sent to.
//!
//! Two lifetimes, chosen by what else the server knows about the replica:
//! - on a replica that **publishes KV events** (any real upsert, eviction or
//!   clear ever ingested from it), a holding only has to cover the sidecar's
//!   batching delay until the real report replaces it: the short TTL above;
//! - on a replica that **has never published one**, the holdings are the
//!   server's only source of truth about its cache, so they live as long as
//!   a real entry would (the tenant's TTL, at least the short one), bounded
//!   like everything else by the overlay's cap. A conversation's next turn
//!   typically comes minutes later (median gap 123 s on the Mooncake trace,
//!   BENCHMARKS.md), past the 120 s default.
//!
//! Every holding carries both expiries; which one counts is decided on read,
//! so a replica that starts publishing falls back to the short one at once.
//!
//! Rules, each tested:
//! - a tentative holding counts in the estimated-TTFT ranking only (never in
//!   the contract ranking, the serving scope, the miss classifier, quotas, the
//!   cap, aggregates or `prefixCount`); it is counted separately
//!   (`/snapshot` `tentativeCount` / `tentativeEntries`, metrics);
//! - it expires after its TTL (checked on read, removed by the sweep);
//! - a real report of the same (key, replica) replaces it (the real entry
//!   carries the engine's own tier and timestamps);
//! - a real removal (`PREFIX_EVICTED` of that key, `ALL_CLEARED` of the
//!   replica) removes it too, so it never outlives what the engine says;
//! - the overlay is bounded (as many holdings as the index's entry cap): past the bound new
//!   holdings are dropped and counted, never grown.
//!
//! # One record per delivered chain
//!
//! A delivered hint writes **one record**: the chain's keys past the
//! replica's real run (the index's 64-bit entry hash of (partition, hash
//! bytes); a collision would only make an approximate holding slightly more
//! approximate), the position of its first key, the replica and both
//! expiries. It is filed under its first key and its (partition, replica):
//! two map writes per delivery, whatever the chain's length. Each file is a
//! list threaded through the records (the map holds the newest), so filing
//! and dropping allocate nothing, and a record's keys and bits are one
//! buffer that dropped records hand on to new ones. The same chain
//! delivered again to the same replica renews (or extends) its record; it
//! is found in the list of its first key.
//!
//! A lookup reads the records as it goes down the request's chain: one probe
//! per position up to the deepest real run, each finding the records that
//! begin there with the request's key; a record counts for its replica from
//! the end of the replica's real run, for as long as its keys equal the
//! request's (block hashes identify their whole prefix, so equal keys at one
//! position mean equal chains up to it) and are still held. The cost grows
//! with the request and the records that match it, not with the fleet.
//!
//! A real report or removal of a key marks it gone in the replica's records
//! that hold it (a per-record bit filter skips most records without reading
//! their keys); a record with nothing left held is dropped. Counts (stored,
//! confirmed, removed, expired, `tentativeCount`) are of held positions, as
//! when every block was its own holding; a block delivered within two
//! overlapping chains (different real runs at delivery) counts in each.

use crate::hashing::FoldBuild;
use crate::sync::{read, write};
use std::collections::{HashMap, HashSet};
use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Both expiries of a holding (Unix ns): on a replica that publishes KV
/// events, on one that never has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expiry {
    /// Replica publishes events: the policy's `tentativeTTLSeconds`.
    pub(crate) publishing: i64,
    /// Replica never published: the tenant's TTL.
    pub(crate) silent: i64,
}

impl Expiry {
    fn of(&self, publishes: bool) -> i64 {
        if publishes {
            self.publishing
        } else {
            self.silent
        }
    }
}

/// No record (the end of a list).
const NONE: u32 = u32::MAX;

/// Spare record buffers kept for reuse (a delivery then allocates nothing).
const MAX_SPARES: usize = 4_096;

/// One delivered chain on one replica.
struct Record {
    part: u32,
    replica: u32,
    /// Chain position of `keys()[0]`.
    from: u32,
    /// Keys in the record.
    n: u32,
    /// Words of gone bits.
    gone_words: u32,
    /// Keys still held.
    live: u32,
    /// One buffer, recycled through [`Overlay::spare`]: the keys; then one
    /// bit per key, no longer held (confirmed by a real report or
    /// removed); then a one-hash bit filter of the keys (16 bits per key):
    /// a removal reads the keys of the records whose filter has its bit
    /// only.
    buf: Vec<u64>,
    expires: Expiry,
    /// Next record of the same head (partition, first key).
    next_head: u32,
    /// Neighbours among the records of the same (partition, replica).
    prev_owner: u32,
    next_owner: u32,
}

impl Record {
    fn new(
        part: u32,
        replica: u32,
        from: u32,
        keys: &[u64],
        expires: Expiry,
        mut buf: Vec<u64>,
    ) -> Self {
        let n = keys.len();
        let gone_words = n.div_ceil(64);
        let len = n + gone_words + (n * 16).div_ceil(64).max(1);
        buf.clear();
        // Recycled buffers come in every size: rounded up, most fit the
        // next record without a reallocation.
        buf.reserve(len.next_power_of_two().max(64));
        buf.extend_from_slice(keys);
        buf.resize(len, 0);
        let mut r = Self {
            part,
            replica,
            from,
            n: n as u32,
            gone_words: gone_words as u32,
            live: n as u32,
            buf,
            expires,
            next_head: NONE,
            prev_owner: NONE,
            next_owner: NONE,
        };
        for i in 0..n {
            let (w, b) = r.filter_bit(r.buf[i]);
            r.filter_mut()[w] |= b;
        }
        r
    }

    fn keys(&self) -> &[u64] {
        &self.buf[..self.n as usize]
    }

    fn gone(&self) -> &[u64] {
        let n = self.n as usize;
        &self.buf[n..n + self.gone_words as usize]
    }

    fn gone_mut(&mut self) -> &mut [u64] {
        let n = self.n as usize;
        &mut self.buf[n..n + self.gone_words as usize]
    }

    fn filter(&self) -> &[u64] {
        &self.buf[self.n as usize + self.gone_words as usize..]
    }

    fn filter_mut(&mut self) -> &mut [u64] {
        let at = self.n as usize + self.gone_words as usize;
        &mut self.buf[at..]
    }

    fn filter_bit(&self, key: u64) -> (usize, u64) {
        // The key is a hash already: its high bits scaled to the filter
        // (a multiply, where a modulo was a division per key).
        let bits = self.filter().len() as u64 * 64;
        let bit = ((u128::from(key) * u128::from(bits)) >> 64) as u64;
        ((bit / 64) as usize, 1 << (bit % 64))
    }

    fn may_hold(&self, key: u64) -> bool {
        let (w, b) = self.filter_bit(key);
        self.filter()[w] & b != 0
    }

    fn held(&self, i: usize) -> bool {
        self.gone()[i / 64] & (1 << (i % 64)) == 0
    }

    /// How many keys from position `from` on are held, up to `max`: a
    /// scan of the gone bits a word at a time.
    fn held_from(&self, from: usize, max: usize) -> usize {
        let end = from + max;
        let mut j = from;
        while j < end {
            let w = self.gone().get(j / 64).map_or(0, |w| w >> (j % 64));
            if w != 0 {
                return (j + w.trailing_zeros() as usize).min(end) - from;
            }
            j = (j / 64 + 1) * 64;
        }
        max
    }

    /// Marks every held position of `key` gone; returns how many.
    fn take(&mut self, key: u64) -> u32 {
        if !self.may_hold(key) {
            return 0;
        }
        let mut n = 0;
        for i in 0..self.n as usize {
            if self.buf[i] == key && self.held(i) {
                self.gone_mut()[i / 64] |= 1 << (i % 64);
                n += 1;
            }
        }
        self.live -= n;
        n
    }
}

thread_local! {
    /// Per replica id, its entry in a [`Tentative::runs`] answer (1-based;
    /// 0: none), reset after each call.
    static FOUND_AT: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Slots of [`Overlay::heads`].
const HEAD_SLOTS: usize = 1 << 16;

/// The slot of a record head (partition, first key) in [`Overlay::heads`].
fn head_slot(part: u32, key: u64) -> usize {
    ((key ^ u64::from(part).wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> 48) as usize
}

/// The records and their files. Lists are threaded through the records
/// (`next_head`, `prev_owner` / `next_owner`), so filing a record is one
/// map entry per file and no list of its own: a delivery writes two
/// entries, and neither allocates once the maps have grown.
#[derive(Default)]
struct Overlay {
    /// Records whose head falls in each slot (saturating; a saturated
    /// slot is never decremented): a lookup probes `by_head` only at
    /// positions whose slot is not empty, one load instead of a map probe
    /// at every position of a long matched chain.
    heads: Vec<u8>,
    records: Vec<Option<Record>>,
    free: Vec<u32>,
    /// Buffers of dropped records, for the next ones.
    spare: Vec<Vec<u64>>,
    /// (partition, first key) → the newest record of that head; the list
    /// goes on through `next_head`. A delivery finds the record of its
    /// chain (same replica, same start, one a prefix of the other, so the
    /// same first key) in this list.
    by_head: HashMap<(u32, u64), u32, FoldBuild>,
    /// (partition, replica) → its newest record; the list goes on through
    /// `next_owner`.
    by_owner: HashMap<(u32, u32), u32, FoldBuild>,
}

impl Overlay {
    fn record(&self, id: u32) -> Option<&Record> {
        self.records.get(id as usize).and_then(Option::as_ref)
    }

    /// The ids of a list, from `first` on through `next`.
    fn list(&self, first: Option<u32>, next: fn(&Record) -> u32) -> impl Iterator<Item = u32> + '_ {
        let mut id = first.unwrap_or(NONE);
        std::iter::from_fn(move || {
            let r = self.record(id)?;
            let this = id;
            id = next(r);
            Some(this)
        })
    }

    fn head_list(&self, part: u32, key: u64) -> impl Iterator<Item = u32> + '_ {
        self.list(self.by_head.get(&(part, key)).copied(), |r| r.next_head)
    }

    fn owner_list(&self, part: u32, replica: u32) -> impl Iterator<Item = u32> + '_ {
        self.list(self.by_owner.get(&(part, replica)).copied(), |r| {
            r.next_owner
        })
    }

    /// A spare buffer, or a new one.
    fn buffer(&mut self) -> Vec<u64> {
        self.spare.pop().unwrap_or_default()
    }

    fn add(&mut self, mut r: Record) -> u32 {
        let (head, owner) = ((r.part, r.keys()[0]), (r.part, r.replica));
        let id = self.free.pop().unwrap_or(self.records.len() as u32);
        r.next_head = self.by_head.insert(head, id).unwrap_or(NONE);
        r.next_owner = self.by_owner.insert(owner, id).unwrap_or(NONE);
        r.prev_owner = NONE;
        if let Some(next) = self
            .records
            .get_mut(r.next_owner as usize)
            .and_then(Option::as_mut)
        {
            next.prev_owner = id;
        }
        if id as usize == self.records.len() {
            self.records.push(Some(r));
        } else {
            self.records[id as usize] = Some(r);
        }
        if self.heads.is_empty() {
            self.heads = vec![0; HEAD_SLOTS];
        }
        let slot = &mut self.heads[head_slot(head.0, head.1)];
        *slot = slot.saturating_add(1);
        id
    }

    /// Puts `r` in the place of record `id` (same head, same owner).
    fn replace(&mut self, id: u32, mut r: Record) {
        let Some(old) = self.records.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        r.next_head = old.next_head;
        r.prev_owner = old.prev_owner;
        r.next_owner = old.next_owner;
        let old = std::mem::replace(old, r);
        self.recycle(old.buf);
    }

    fn recycle(&mut self, buf: Vec<u64>) {
        if self.spare.len() < MAX_SPARES {
            self.spare.push(buf);
        }
    }

    /// Drops record `id`; returns its held keys.
    fn drop_record(&mut self, id: u32) -> u64 {
        let Some(r) = self.records.get_mut(id as usize).and_then(Option::take) else {
            return 0;
        };
        self.free.push(id);
        let head = (r.part, r.keys()[0]);
        if let Some(slot) = self.heads.get_mut(head_slot(head.0, head.1)) {
            if *slot != u8::MAX {
                *slot = slot.saturating_sub(1);
            }
        }
        // Out of its head's list (short: the records that begin with one
        // key in one partition).
        if self.by_head.get(&head) == Some(&id) {
            if r.next_head == NONE {
                self.by_head.remove(&head);
            } else {
                self.by_head.insert(head, r.next_head);
            }
        } else {
            let mut at = self.by_head.get(&head).copied().unwrap_or(NONE);
            while let Some(x) = self.records.get_mut(at as usize).and_then(Option::as_mut) {
                if x.next_head == id {
                    x.next_head = r.next_head;
                    break;
                }
                at = x.next_head;
            }
        }
        // Out of its owner's list.
        let owner = (r.part, r.replica);
        match self
            .records
            .get_mut(r.prev_owner as usize)
            .and_then(Option::as_mut)
        {
            Some(prev) => prev.next_owner = r.next_owner,
            None => {
                if r.next_owner == NONE {
                    self.by_owner.remove(&owner);
                } else {
                    self.by_owner.insert(owner, r.next_owner);
                }
            }
        }
        if let Some(next) = self
            .records
            .get_mut(r.next_owner as usize)
            .and_then(Option::as_mut)
        {
            next.prev_owner = r.prev_owner;
        }
        let live = u64::from(r.live);
        self.recycle(r.buf);
        live
    }
}

/// The tentative overlay. Lock order: never taken while a shard lock is held
/// by the same thread except after it (shard → tentative), like the counters.
pub(crate) struct Tentative {
    overlay: RwLock<Overlay>,
    /// Replicas that have published at least one KV event.
    publishers: RwLock<HashSet<u32, FoldBuild>>,
    /// Held keys over all records.
    len: AtomicUsize,
    cap: usize,
}

impl Tentative {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            overlay: RwLock::new(Overlay::default()),
            publishers: RwLock::new(HashSet::default()),
            len: AtomicUsize::new(0),
            cap: cap.max(1),
        }
    }

    /// Holdings stored (expired ones included until the next sweep).
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// True when anything is stored: the ingest and event hooks skip all
    /// work otherwise.
    pub(crate) fn active(&self) -> bool {
        self.len() > 0
    }

    /// The replica published a KV event (upsert, eviction or clear): its
    /// holdings count with their short expiry from now on.
    pub(crate) fn mark_publisher(&self, replica: u32) {
        if !read(&self.publishers).contains(&replica) {
            write(&self.publishers).insert(replica);
        }
    }

    /// Drops everything known about a released replica id (its publisher
    /// mark and any expired holdings left), so an id reused for another
    /// replica starts as a silent one with nothing (`replicas.rs`).
    pub(crate) fn forget_replica(&self, replica: u32) {
        write(&self.publishers).remove(&replica);
        let mut o = write(&self.overlay);
        let parts: Vec<u32> = o
            .by_owner
            .keys()
            .filter(|(_, r)| *r == replica)
            .map(|(p, _)| *p)
            .collect();
        let mut removed = 0;
        for p in parts {
            let ids: Vec<u32> = o.owner_list(p, replica).collect();
            removed += ids.into_iter().map(|id| o.drop_record(id)).sum::<u64>();
        }
        self.len.fetch_sub(removed as usize, Ordering::Relaxed);
    }

    /// Whether the replica has ever published a KV event.
    #[cfg(test)]
    pub(crate) fn publishes(&self, replica: u32) -> bool {
        read(&self.publishers).contains(&replica)
    }

    /// Records the chain `keys` (chain positions `from..`) on `replica` until
    /// `expires`: one record, or the renewal of the record of the same chain.
    /// Returns (keys stored or renewed, keys dropped at the cap).
    pub(crate) fn insert(
        &self,
        part: u32,
        replica: u32,
        from: u32,
        keys: &[u64],
        expires: Expiry,
    ) -> (u64, u64) {
        if keys.is_empty() {
            return (0, 0);
        }
        let mut o = write(&self.overlay);
        let room = self.cap.saturating_sub(self.len());
        // The same chain (same replica and start, one a prefix of the
        // other) again: the oldest such record (lists run newest first).
        let same = o
            .head_list(part, keys[0])
            .filter(|&id| {
                o.record(id).is_some_and(|r| {
                    let n = r.keys().len().min(keys.len());
                    r.replica == replica && r.from == from && r.keys()[..n] == keys[..n]
                })
            })
            .last();
        if let Some(id) = same {
            let spare = o.buffer();
            let Some(r) = o.records[id as usize].as_mut() else {
                return (0, 0);
            };
            let before = r.live as usize;
            // Held again: what the new delivery covers, plus the rest of the
            // record as it was.
            let covered = keys.len().min(r.keys().len());
            let regained = (0..covered).filter(|&i| !r.held(i)).count();
            let grow = keys.len().saturating_sub(r.keys().len());
            let allowed = (regained + grow).min(room);
            let dropped = (regained + grow - allowed) as u64;
            let (mut regain_left, grow_kept) =
                (allowed.min(regained), allowed.saturating_sub(regained));
            for i in 0..covered {
                if regain_left > 0 && !r.held(i) {
                    r.gone_mut()[i / 64] &= !(1 << (i % 64));
                    regain_left -= 1;
                }
            }
            let mut longer = None;
            if grow_kept > 0 {
                let old_n = r.keys().len();
                let mut l = Record::new(
                    part,
                    replica,
                    from,
                    &keys[..old_n + grow_kept],
                    expires,
                    spare,
                );
                // Keep what is gone in the old part.
                for i in 0..old_n {
                    if !r.held(i) {
                        l.gone_mut()[i / 64] |= 1 << (i % 64);
                        l.live -= 1;
                    }
                }
                l.expires = r.expires;
                longer = Some(l);
            } else {
                r.live = (0..r.keys().len()).filter(|&i| r.held(i)).count() as u32;
                o.recycle(spare);
            }
            if let Some(l) = longer {
                o.replace(id, l);
            }
            let Some(r) = o.records[id as usize].as_mut() else {
                return (0, 0);
            };
            r.expires.publishing = r.expires.publishing.max(expires.publishing);
            r.expires.silent = r.expires.silent.max(expires.silent);
            let after = r.live as usize;
            self.len.fetch_add(after - before, Ordering::Relaxed);
            return (
                covered as u64 - dropped.min(covered as u64) + grow_kept as u64,
                dropped,
            );
        }
        let kept = keys.len().min(room);
        let dropped = (keys.len() - kept) as u64;
        if kept == 0 {
            return (0, dropped);
        }
        let buf = o.buffer();
        o.add(Record::new(
            part,
            replica,
            from,
            &keys[..kept],
            expires,
            buf,
        ));
        self.len.fetch_add(kept, Ordering::Relaxed);
        (kept as u64, dropped)
    }

    /// Whether a record may start at a position `0..=upper` of a chain of
    /// `blocks` blocks whose key at position `i` is `key_at(i)`: false
    /// means [`Tentative::runs`] with `deepest <= upper` finds nothing.
    pub(crate) fn may_start(
        &self,
        part: u32,
        blocks: usize,
        upper: usize,
        key_at: impl Fn(usize) -> u64,
    ) -> bool {
        let o = read(&self.overlay);
        !o.by_head.is_empty()
            && (0..blocks.min(upper.saturating_add(1))).any(|p| {
                o.heads
                    .get(head_slot(part, key_at(p)))
                    .is_some_and(|&c| c != 0)
            })
    }

    /// Each replica's tentative run over the request's chain of `blocks`
    /// blocks from `start_of(replica)`, the end of its real run: one
    /// `(replica, start, blocks)` in `found` per replica with a run.
    /// Positions `0..=deepest` are probed (`deepest`: the deepest real run).
    /// `keys` holds the chain's keys (the partition's key hashes) as far as
    /// they were needed; `key_at(i)` makes the one at position `i` (most
    /// lookups need the first few only).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn runs(
        &self,
        part: u32,
        blocks: usize,
        keys: &mut Vec<u64>,
        key_at: impl Fn(usize) -> u64,
        deepest: usize,
        start_of: impl Fn(u32) -> usize,
        now: i64,
        found: &mut Vec<(u32, usize, usize)>,
    ) {
        found.clear();
        keys.clear();
        let o = read(&self.overlay);
        if o.by_head.is_empty() || blocks == 0 {
            return;
        }
        let fill = |keys: &mut Vec<u64>, upto: usize| {
            let upto = upto.min(blocks);
            while keys.len() < upto {
                keys.push(key_at(keys.len()));
            }
        };
        let publishers = read(&self.publishers);
        crate::scratch::with(&FOUND_AT, |at: &mut Vec<u32>| {
            for p in 0..blocks.min(deepest.saturating_add(1)) {
                fill(keys, p + 1);
                let key = keys[p];
                if o.heads[head_slot(part, key)] == 0 {
                    continue;
                }
                for id in o.head_list(part, key) {
                    let Some(r) = o.record(id) else {
                        continue;
                    };
                    let s = start_of(r.replica);
                    if r.from as usize != p
                        || s < p
                        || s >= p + r.keys().len()
                        || r.expires.of(publishers.contains(&r.replica)) <= now
                    {
                        continue;
                    }
                    // The record agrees with the request for `eq` keys from
                    // the replica's real run on; of those, the leading held.
                    let j0 = s - p;
                    fill(keys, p + r.keys().len());
                    let eq = r.keys()[j0..]
                        .iter()
                        .zip(&keys[s..])
                        .take_while(|(a, b)| a == b)
                        .count();
                    let n = r.held_from(j0, eq);
                    if n == 0 {
                        continue;
                    }
                    // One entry per replica, found by id (a fleet whose
                    // every replica has a record of the chain made this
                    // search quadratic).
                    let i = r.replica as usize;
                    if at.len() <= i {
                        at.resize((i + 1).next_power_of_two(), 0);
                    }
                    match at[i] {
                        0 => {
                            found.push((r.replica, s, n));
                            at[i] = found.len() as u32;
                        }
                        k => {
                            let f = &mut found[k as usize - 1];
                            f.2 = f.2.max(n);
                        }
                    }
                }
            }
            for f in found.iter() {
                at[f.0 as usize] = 0;
            }
        });
    }

    /// Real reports of `(part, key)` by `replica` replace the tentative ones.
    pub(crate) fn confirm(&self, replica: u32, keys: &[(u32, u64)]) -> u64 {
        self.remove_many(replica, keys)
    }

    /// A real removal of `(part, key)` on `replica` removes the tentative one.
    pub(crate) fn remove_many(&self, replica: u32, keys: &[(u32, u64)]) -> u64 {
        if keys.is_empty() {
            return 0;
        }
        // Most reports come from replicas without records: a read first.
        {
            let o = read(&self.overlay);
            if !keys
                .iter()
                .any(|(p, _)| o.by_owner.contains_key(&(*p, replica)))
            {
                return 0;
            }
        }
        let mut o = write(&self.overlay);
        let mut n = 0u64;
        let mut emptied: Vec<u32> = Vec::new();
        for &(part, key) in keys {
            let mut id = o.by_owner.get(&(part, replica)).copied().unwrap_or(NONE);
            while let Some(r) = o.records.get_mut(id as usize).and_then(Option::as_mut) {
                n += u64::from(r.take(key));
                if r.live == 0 && !emptied.contains(&id) {
                    emptied.push(id);
                }
                id = r.next_owner;
            }
        }
        for id in emptied {
            o.drop_record(id);
        }
        self.len.fetch_sub(n as usize, Ordering::Relaxed);
        n
    }

    /// `ALL_CLEARED`: every holding of `replica` in the given partitions.
    pub(crate) fn clear(&self, parts_of: &[u32], replica: u32) -> u64 {
        let mut o = write(&self.overlay);
        let mut n = 0;
        for p in parts_of {
            let ids: Vec<u32> = o.owner_list(*p, replica).collect();
            n += ids.into_iter().map(|id| o.drop_record(id)).sum::<u64>();
        }
        self.len.fetch_sub(n as usize, Ordering::Relaxed);
        n
    }

    /// Removes expired holdings; returns how many.
    pub(crate) fn sweep(&self, now: i64) -> u64 {
        if !self.active() {
            return 0;
        }
        let publishers = read(&self.publishers).clone();
        let mut o = write(&self.overlay);
        let expired: Vec<u32> = o
            .records
            .iter()
            .enumerate()
            .filter_map(|(id, r)| {
                let r = r.as_ref()?;
                (r.expires.of(publishers.contains(&r.replica)) <= now).then_some(id as u32)
            })
            .collect();
        let n: u64 = expired.into_iter().map(|id| o.drop_record(id)).sum();
        self.len.fetch_sub(n as usize, Ordering::Relaxed);
        n
    }

    /// Unexpired holdings per (partition, replica).
    pub(crate) fn counts(&self, now: i64) -> Vec<(u32, u32, u64)> {
        let publishers = read(&self.publishers).clone();
        let o = read(&self.overlay);
        let mut out = Vec::new();
        for &(p, r) in o.by_owner.keys() {
            let publishes = publishers.contains(&r);
            let n: u64 = o
                .owner_list(p, r)
                .filter_map(|id| o.record(id))
                .filter(|x| x.expires.of(publishes) > now)
                .map(|x| u64::from(x.live))
                .sum();
            if n > 0 {
                out.push((p, r, n));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_keys_are_counted_across_words_of_gone_bits() {
        let mut r = Record::new(
            0,
            1,
            0,
            &(0..150).collect::<Vec<u64>>(),
            both(10),
            Vec::new(),
        );
        assert_eq!(r.held_from(3, 140), 140);
        for gone in [70, 130] {
            r.gone_mut()[gone / 64] |= 1 << (gone % 64);
        }
        let naive = |r: &Record, from: usize, max: usize| {
            (from..from + max).take_while(|&i| r.held(i)).count()
        };
        for from in [0, 5, 63, 64, 69, 70, 71, 128, 131] {
            for max in [0, 1, 6, 60, 150 - from] {
                assert_eq!(r.held_from(from, max), naive(&r, from, max), "{from} {max}");
            }
        }
    }

    fn both(at: i64) -> Expiry {
        Expiry {
            publishing: at,
            silent: at,
        }
    }

    fn run(t: &Tentative, replica: u32, keys: &[u64], start: usize, now: i64) -> usize {
        let mut found = Vec::new();
        t.runs(
            1,
            keys.len(),
            &mut Vec::new(),
            |i| keys[i],
            start,
            |r| if r == replica { start } else { usize::MAX },
            now,
            &mut found,
        );
        found.iter().find(|f| f.0 == replica).map_or(0, |f| f.2)
    }

    #[test]
    fn cap_drops_and_counts() {
        let t = Tentative::new(3);
        assert_eq!(t.insert(1, 7, 0, &[1, 2, 3, 4], both(100)), (3, 1));
        assert_eq!(t.len(), 3);
        // Renewing the same chain is not growth.
        assert_eq!(t.insert(1, 7, 0, &[1], both(200)), (1, 0));
        assert_eq!(t.len(), 3);
        assert_eq!(run(&t, 7, &[1, 2, 3, 4], 0, 150), 3);
        assert_eq!(run(&t, 7, &[1, 2, 3, 4], 1, 150), 2);
        assert_eq!(run(&t, 7, &[1, 2, 9], 0, 150), 2);
        assert_eq!(run(&t, 7, &[1, 2, 3, 4], 0, 200), 0);
        assert_eq!(t.remove_many(7, &[(1, 2)]), 1);
        assert_eq!(run(&t, 7, &[1, 2, 3, 4], 0, 150), 1);
        assert_eq!(t.sweep(250), 2);
        assert_eq!(t.len(), 0);
        assert!(!t.active());
    }

    #[test]
    fn a_longer_delivery_of_the_same_chain_extends_its_record() {
        let t = Tentative::new(100);
        assert_eq!(t.insert(1, 7, 2, &[3, 4], both(100)), (2, 0));
        assert_eq!(t.insert(1, 7, 2, &[3, 4, 5], both(100)), (3, 0));
        assert_eq!(t.len(), 3);
        assert_eq!(run(&t, 7, &[1, 2, 3, 4, 5, 6], 2, 50), 3);
        // Confirmed blocks are no longer tentative; the rest still count
        // from the end of the (now longer) real run.
        assert_eq!(t.confirm(7, &[(1, 3)]), 1);
        assert_eq!(run(&t, 7, &[1, 2, 3, 4, 5, 6], 3, 50), 2);
        assert_eq!(t.clear(&[1], 7), 2);
        assert!(!t.active());
    }

    #[test]
    fn a_publishing_replica_reads_the_short_expiry() {
        let t = Tentative::new(10);
        let e = Expiry {
            publishing: 100,
            silent: 1_000,
        };
        t.insert(1, 7, 0, &[1, 2], e);
        t.insert(1, 8, 0, &[1, 2], e);
        // Neither has published: both hold until the long expiry.
        assert_eq!(run(&t, 7, &[1, 2], 0, 500), 2);
        assert_eq!(t.counts(500).len(), 2);
        // 7 starts publishing: its holdings fall back to the short expiry.
        t.mark_publisher(7);
        assert!(t.publishes(7) && !t.publishes(8));
        assert_eq!(run(&t, 7, &[1, 2], 0, 500), 0);
        assert_eq!(run(&t, 8, &[1, 2], 0, 500), 2);
        assert_eq!(t.counts(500), vec![(1, 8, 2)]);
        assert_eq!(t.sweep(500), 2);
        assert_eq!(t.sweep(1_000), 2);
        assert!(!t.active());
    }
}

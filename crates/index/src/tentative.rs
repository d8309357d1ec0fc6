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
//! expiries. It is filed in the slot of its first key in a table of record
//! ids (a chained hash table, at least a slot per record, doubled as it
//! fills) and in its replica's list (by replica id): two array writes per
//! delivery, no map, whatever the chain's length. Each file is a list
//! threaded through the records (the table holds the newest), so filing
//! and dropping allocate nothing, and a record's keys and bits are one
//! buffer that dropped records hand on to new ones. The same chain
//! delivered again to the same replica renews (or extends) its record; it
//! is found in the list of its first key.
//!
//! Filing waits for a reader (issue 36, session 46): most records are never
//! read, so a delivery whose head no record shares only appends the record's
//! fields and keys to a pending log and counts its head; the first reader of
//! the records (a probe that finds a head, a report, a clear, the sweep, the
//! counts, a release, a delivery that may renew) files every pending record,
//! oldest first, so each reader sees what filing at delivery made (a
//! property test holds the two to the same answers).
//!
//! A lookup reads the records as it goes down the request's chain: one
//! byte per position up to the deepest real run (64 K counts of the heads
//! by slot, small enough to stay in cache: a sparser table with fewer false
//! hits fell out of L2 and cost more, docs/decisions.md, issue 36 session
//! 44), and where it is not zero the table's records that begin there with
//! the request's key; a record counts for its replica from
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
use std::collections::HashSet;
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
    /// Whether the holding is live at `now`, asking `publishes` only when
    /// the answer depends on it (both expiries ahead, or both past, decide
    /// alone). The probe reads every record of a chain per lookup; a set
    /// lookup for each was ~2 % of the default path at 64 nested replicas
    /// (issue 36, session 48).
    fn alive(&self, now: i64, publishes: impl FnOnce() -> bool) -> bool {
        if self.publishing > now && self.silent > now {
            return true;
        }
        if self.publishing <= now && self.silent <= now {
            return false;
        }
        self.of(publishes()) > now
    }

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

/// `a == b` for slices of one length, without a branch per key (the
/// compiler vectorises the fold) and without a library call.
fn same_keys(a: &[u64], b: &[u64]) -> bool {
    debug_assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0u64, |d, (x, y)| d | (x ^ y)) == 0
}

/// Spare record buffers kept for reuse (a delivery then allocates nothing).
const MAX_SPARES: usize = 4_096;

/// Size classes of spare buffers (capacity `64 << class` words; larger
/// ones share the last class).
const SPARE_CLASSES: usize = 8;

/// The spare class of a buffer of `capacity` words.
fn spare_class(capacity: usize) -> usize {
    ((capacity.max(64) / 64).ilog2() as usize).min(SPARE_CLASSES - 1)
}

/// One delivered chain on one replica.
struct Record {
    part: u32,
    replica: u32,
    /// Chain position of `keys()[0]`.
    from: u32,
    /// `keys()[0]`, inline: a walk of a head slot compares it without
    /// reading the buffer.
    head: u64,
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
    /// When it was filed (a renewal keeps it): the head table's growth
    /// refiles records in this order.
    seq: u64,
    /// Next record in the same head slot.
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
        let len = Self::words(n);
        // Recycled buffers come by size class (`Overlay::buffer`): the
        // class of `len` never reallocates (a grown buffer copied its old
        // contents, a fifth of a delivery's record).
        buf.clear();
        buf.reserve(Self::capacity(n));
        buf.extend_from_slice(keys);
        buf.resize(len, 0);
        // The keys' filter bits, straight into the buffer.
        let (head, filter) = buf.split_at_mut(n + gone_words);
        let bits = filter.len() as u64 * 64;
        for &key in &head[..n] {
            let bit = ((u128::from(key) * u128::from(bits)) >> 64) as u64;
            filter[(bit / 64) as usize] |= 1 << (bit % 64);
        }
        Self {
            part,
            replica,
            from,
            head: keys.first().copied().unwrap_or(0),
            n: n as u32,
            gone_words: gone_words as u32,
            live: n as u32,
            buf,
            expires,
            seq: 0,
            next_head: NONE,
            prev_owner: NONE,
            next_owner: NONE,
        }
    }

    /// Words of a record of `n` keys: the keys, the gone bits, the filter.
    fn words(n: usize) -> usize {
        n + n.div_ceil(64) + (n * 16).div_ceil(64).max(1)
    }

    /// Capacity a record of `n` keys is given: rounded up to a power of
    /// two, at least 64 words, so most buffers fit the next record.
    fn capacity(n: usize) -> usize {
        Self::words(n).next_power_of_two().max(64)
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

/// Fewest slots of [`Overlay::heads`] (the table doubles as records come).
const MIN_HEAD_BITS: u32 = 12;

/// Slots of [`Overlay::heads`] per filed record, at least.
const SLOTS_PER_RECORD: usize = 1;

/// Slots of [`Overlay::present`].
const PRESENT_SLOTS: usize = 1 << 16;

/// Per-slot counts of record heads ([`Overlay::present`]).
#[derive(Clone)]
struct Present(std::sync::Arc<[std::sync::atomic::AtomicU8]>);

impl Default for Present {
    fn default() -> Self {
        Self(
            (0..PRESENT_SLOTS)
                .map(|_| std::sync::atomic::AtomicU8::new(0))
                .collect(),
        )
    }
}

impl Present {
    fn get(&self, slot: usize) -> u8 {
        self.0.get(slot).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// One more head (saturating). Under the overlay's write lock.
    fn up(&self, slot: usize) {
        if let Some(c) = self.0.get(slot) {
            c.store(
                c.load(Ordering::Relaxed).saturating_add(1),
                Ordering::Relaxed,
            );
        }
    }

    /// One head less (a saturated count stays). Under the write lock.
    fn down(&self, slot: usize) {
        if let Some(c) = self.0.get(slot) {
            let v = c.load(Ordering::Relaxed);
            if v != u8::MAX {
                c.store(v.saturating_sub(1), Ordering::Relaxed);
            }
        }
    }
}

/// A head's slot in [`Overlay::present`].
fn present_slot(part: u32, key: u64) -> usize {
    head_slot(part, key, 16)
}

/// The slot of a record head (partition, first key) in a table of
/// `1 << bits` slots: the key is a hash already, its high bits (mixed with
/// the partition's) pick the slot.
fn head_slot(part: u32, key: u64, bits: u32) -> usize {
    ((key ^ u64::from(part).wrapping_mul(0x9E37_79B9_7F4A_7C15)) >> (64 - bits)) as usize
}

/// The records and their files, with no map: a record is filed in its
/// head's slot of [`Overlay::heads`] (a chained hash table whose lists run
/// through the records, `next_head`) and in its replica's list
/// ([`Overlay::by_owner`], by replica id, `prev_owner` / `next_owner`). A
/// delivery's filing is two array writes and a lookup's probe of a
/// position one array read; neither allocates once the table has grown.
#[derive(Default)]
struct Overlay {
    /// Per slot, the newest record whose head (partition, first key) falls
    /// there (`NONE`: empty); the list goes on through `next_head` and
    /// holds the slot's records of every head. `1 << head_bits` slots, at
    /// least [`SLOTS_PER_RECORD`] per record (doubled and refiled past
    /// that).
    heads: Vec<u32>,
    /// Records whose head falls in each of 64 K slots (saturating; a
    /// saturated slot is never decremented): a lookup's position reads one
    /// byte of a table that stays in cache, and the head table only where
    /// this is not zero. Written under the overlay's write lock, read
    /// without a lock too ([`Tentative::may_start`]; shared with
    /// [`Tentative::present`]).
    present: Present,
    head_bits: u32,
    /// Records filed (for the table's growth).
    filed: usize,
    /// Records added so far (their [`Record::seq`]).
    seq: u64,
    records: Vec<Option<Record>>,
    free: Vec<u32>,
    /// Buffers of dropped records, for the next ones, by size class
    /// ([`spare_class`]).
    spare: [Vec<Vec<u64>>; SPARE_CLASSES],
    /// Buffers in `spare`.
    spares: usize,
    /// Per replica id, its newest record in any partition (`NONE`: none);
    /// the list goes on through `next_owner`.
    by_owner: Vec<u32>,
    /// Deliveries not filed yet, oldest first (their keys in
    /// `pending_keys`): a delivery whose head no record shares appends
    /// here, and the first reader of the records files them all
    /// ([`Overlay::file_pending`]); their heads count in `present` and
    /// their keys in [`Tentative::len`] from the append on.
    pending: Vec<Pending>,
    pending_keys: Vec<u64>,
}

/// A delivery appended and not yet filed ([`Overlay::pending`]).
struct Pending {
    part: u32,
    replica: u32,
    from: u32,
    /// Its keys: `pending_keys[at..at + n]`.
    at: u32,
    n: u32,
    expires: Expiry,
}

impl Overlay {
    fn record(&self, id: u32) -> Option<&Record> {
        self.records.get(id as usize).and_then(Option::as_ref)
    }

    /// The ids of a list, from `first` on through `next`.
    fn list(&self, first: u32, next: fn(&Record) -> u32) -> impl Iterator<Item = u32> + '_ {
        let mut id = first;
        std::iter::from_fn(move || {
            let r = self.record(id)?;
            let this = id;
            id = next(r);
            Some(this)
        })
    }

    /// The head slot of (part, key), when the table exists.
    fn slot(&self, part: u32, key: u64) -> Option<usize> {
        (!self.heads.is_empty()).then(|| head_slot(part, key, self.head_bits))
    }

    /// Whether a record may begin with (part, key): false means none does.
    fn may_head(&self, part: u32, key: u64) -> bool {
        self.present.get(present_slot(part, key)) != 0
    }

    /// The records that begin with (part, key), newest first.
    fn head_list(&self, part: u32, key: u64) -> impl Iterator<Item = u32> + '_ {
        // The presence counts first: the head table and its records only
        // where some head may be (each record read is a cache miss or two).
        let first = if self.may_head(part, key) {
            self.slot(part, key).map_or(NONE, |s| self.heads[s])
        } else {
            NONE
        };
        self.list(first, |r| r.next_head).filter(move |&id| {
            self.record(id)
                .is_some_and(|r| r.part == part && r.head == key)
        })
    }

    /// Every record of `replica` (all partitions), newest first.
    fn owner_list(&self, replica: u32) -> impl Iterator<Item = u32> + '_ {
        let first = self.by_owner.get(replica as usize).copied().unwrap_or(NONE);
        self.list(first, |r| r.next_owner)
    }

    /// A spare buffer that holds a record of `n` keys without growing, or
    /// a new one.
    fn buffer(&mut self, n: usize) -> Vec<u64> {
        let need = Record::capacity(n);
        let class = spare_class(need);
        for c in class..SPARE_CLASSES {
            let fits = self.spare[c].last().is_some_and(|b| b.capacity() >= need);
            if fits {
                self.spares -= 1;
                return self.spare[c].pop().unwrap_or_default();
            }
        }
        Vec::with_capacity(need)
    }

    /// Doubles the head table (or makes it) and refiles every record,
    /// oldest first, so each head's records stay newest first (the order a
    /// renewal's search relies on).
    fn grow_heads(&mut self) {
        let bits = (self.head_bits + 1).max(MIN_HEAD_BITS);
        self.heads.clear();
        self.heads.resize(1 << bits, NONE);
        self.head_bits = bits;
        let mut ids: Vec<(u64, u32)> = self
            .records
            .iter()
            .enumerate()
            .filter_map(|(id, r)| r.as_ref().map(|r| (r.seq, id as u32)))
            .collect();
        ids.sort_unstable();
        for (_, id) in ids {
            let Some(r) = self.records[id as usize].as_mut() else {
                continue;
            };
            let s = head_slot(r.part, r.head, bits);
            r.next_head = std::mem::replace(&mut self.heads[s], id);
        }
    }

    /// Appends a delivery of `keys` (non-empty) for filing later: its
    /// head counts in `present` now.
    fn append(&mut self, part: u32, replica: u32, from: u32, keys: &[u64], expires: Expiry) {
        self.present.up(present_slot(part, keys[0]));
        self.pending.push(Pending {
            part,
            replica,
            from,
            at: self.pending_keys.len() as u32,
            n: keys.len() as u32,
            expires,
        });
        self.pending_keys.extend_from_slice(keys);
    }

    /// Files every appended delivery, oldest first: afterwards the records
    /// and their lists are what filing each at its delivery made.
    fn file_pending(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let pending = std::mem::take(&mut self.pending);
        let keys = std::mem::take(&mut self.pending_keys);
        for p in &pending {
            let k = &keys[p.at as usize..(p.at + p.n) as usize];
            let buf = self.buffer(k.len());
            // `append` counted its head already.
            self.add_counted(Record::new(p.part, p.replica, p.from, k, p.expires, buf));
        }
        self.pending = pending;
        self.pending.clear();
        self.pending_keys = keys;
        self.pending_keys.clear();
    }

    fn add(&mut self, r: Record) -> u32 {
        self.present.up(present_slot(r.part, r.head));
        self.add_counted(r)
    }

    /// Files `r` whose head `present` counts already.
    fn add_counted(&mut self, mut r: Record) -> u32 {
        if self.filed * SLOTS_PER_RECORD >= self.heads.len() {
            self.grow_heads();
        }
        let (part, key, replica) = (r.part, r.head, r.replica);
        let id = self.free.pop().unwrap_or(self.records.len() as u32);
        self.seq += 1;
        r.seq = self.seq;
        let s = head_slot(part, key, self.head_bits);
        r.next_head = std::mem::replace(&mut self.heads[s], id);
        let o = replica as usize;
        if self.by_owner.len() <= o {
            self.by_owner.resize((o + 1).next_power_of_two(), NONE);
        }
        r.next_owner = std::mem::replace(&mut self.by_owner[o], id);
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
        self.filed += 1;
        id
    }

    /// Puts `r` in the place of record `id` (same head, same owner).
    fn replace(&mut self, id: u32, mut r: Record) {
        let Some(old) = self.records.get_mut(id as usize).and_then(Option::as_mut) else {
            return;
        };
        r.next_head = old.next_head;
        r.seq = old.seq;
        r.prev_owner = old.prev_owner;
        r.next_owner = old.next_owner;
        let old = std::mem::replace(old, r);
        self.recycle(old.buf);
    }

    fn recycle(&mut self, buf: Vec<u64>) {
        if self.spares < MAX_SPARES && buf.capacity() > 0 {
            self.spares += 1;
            self.spare[spare_class(buf.capacity())].push(buf);
        }
    }

    /// Drops record `id`; returns its held keys.
    fn drop_record(&mut self, id: u32) -> u64 {
        let Some(r) = self.records.get_mut(id as usize).and_then(Option::take) else {
            return 0;
        };
        self.free.push(id);
        self.filed -= 1;
        // Out of its slot's list (short: about one record a slot).
        let s = head_slot(r.part, r.head, self.head_bits);
        if self.heads[s] == id {
            self.heads[s] = r.next_head;
        } else {
            let mut at = self.heads[s];
            while let Some(x) = self.records.get_mut(at as usize).and_then(Option::as_mut) {
                if x.next_head == id {
                    x.next_head = r.next_head;
                    break;
                }
                at = x.next_head;
            }
        }
        self.present.down(present_slot(r.part, r.head));
        // Out of its owner's list.
        match self
            .records
            .get_mut(r.prev_owner as usize)
            .and_then(Option::as_mut)
        {
            Some(prev) => prev.next_owner = r.next_owner,
            None => {
                if let Some(o) = self.by_owner.get_mut(r.replica as usize) {
                    *o = r.next_owner;
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
    /// The overlay's head counts, read without its lock.
    present: Present,
    /// Deliveries appended and not filed (`Overlay::pending`), written
    /// under the overlay's write lock: a reader that finds none reads
    /// under the read lock, else files them first.
    pending: AtomicUsize,
    /// Deliveries are appended for filing later (false: filed at once,
    /// the model the property test holds the lazy filing to).
    lazy: bool,
    cap: usize,
}

/// The overlay with every delivery filed: a write guard (it filed them)
/// or a read guard (there were none).
enum Filed<'a> {
    Read(std::sync::RwLockReadGuard<'a, Overlay>),
    Write(std::sync::RwLockWriteGuard<'a, Overlay>),
}

impl std::ops::Deref for Filed<'_> {
    type Target = Overlay;
    fn deref(&self) -> &Overlay {
        match self {
            Self::Read(g) => g,
            Self::Write(g) => g,
        }
    }
}

impl Tentative {
    pub(crate) fn new(cap: usize) -> Self {
        let overlay = Overlay::default();
        Self {
            present: overlay.present.clone(),
            overlay: RwLock::new(overlay),
            publishers: RwLock::new(HashSet::default()),
            len: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
            lazy: true,
            cap: cap.max(1),
        }
    }

    /// An overlay that files every delivery at once (the property test's
    /// model of the lazy one).
    #[cfg(test)]
    fn eager(cap: usize) -> Self {
        Self {
            lazy: false,
            ..Self::new(cap)
        }
    }

    /// The overlay write-locked, every appended delivery filed.
    fn write_filed(&self) -> std::sync::RwLockWriteGuard<'_, Overlay> {
        let mut o = write(&self.overlay);
        o.file_pending();
        self.pending.store(0, Ordering::Release);
        o
    }

    /// The overlay with every appended delivery filed: read-locked when
    /// there are none (the common case), else write-locked once filed.
    fn read_filed(&self) -> Filed<'_> {
        if self.pending.load(Ordering::Acquire) == 0 {
            Filed::Read(read(&self.overlay))
        } else {
            Filed::Write(self.write_filed())
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
        let mut o = self.write_filed();
        let ids: Vec<u32> = o.owner_list(replica).collect();
        let removed: u64 = ids.into_iter().map(|id| o.drop_record(id)).sum();
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
        if self.lazy && !o.may_head(part, keys[0]) {
            // No record, filed or appended, begins with this head, so
            // none renews: appended, filed by the next reader (a delivery
            // writes a few hot lines instead of a record, its buffer and
            // its lists; most records are never read, docs/decisions.md).
            let kept = keys.len().min(room);
            let dropped = (keys.len() - kept) as u64;
            if kept == 0 {
                return (0, dropped);
            }
            o.append(part, replica, from, &keys[..kept], expires);
            self.pending.store(o.pending.len(), Ordering::Release);
            self.len.fetch_add(kept, Ordering::Relaxed);
            return (kept as u64, dropped);
        }
        o.file_pending();
        self.pending.store(0, Ordering::Release);
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
            let spare = o.buffer(keys.len());
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
        let buf = o.buffer(kept);
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
    /// The keys it made are left in `keys` (cleared first) for
    /// [`Tentative::runs`].
    pub(crate) fn may_start(
        &self,
        part: u32,
        blocks: usize,
        upper: usize,
        keys: &mut Vec<u64>,
        key_at: impl Fn(usize) -> u64,
    ) -> bool {
        keys.clear();
        // No lock: the head counts are atomics, written before the write
        // lock that files or appends their record is released, so a
        // delivery that returned before this lookup began is counted.
        let mut any = false;
        for p in 0..blocks.min(upper.saturating_add(1)) {
            let key = key_at(p);
            keys.push(key);
            any |= self.present.get(present_slot(part, key)) != 0;
        }
        any
    }

    /// Each replica's tentative run over the request's chain of `blocks`
    /// blocks from `start_of(replica)`, the end of its real run: one
    /// `(replica, start, blocks)` in `found` per replica with a run.
    /// Positions `0..=deepest` are probed (`deepest`: the deepest real run).
    /// `keys` holds the chain's keys (the partition's key hashes) as far as
    /// they were made (by [`Tentative::may_start`]; they are extended as
    /// needed); `key_at(i)` makes the one at position `i` (most lookups need
    /// the first few only).
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
        let o = self.read_filed();
        if o.filed == 0 || blocks == 0 {
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
                if !o.may_head(part, key) {
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
                        || !r.expires.alive(now, || publishers.contains(&r.replica))
                    {
                        continue;
                    }
                    // The record agrees with the request for `eq` keys from
                    // the replica's real run on; of those, the leading held.
                    let j0 = s - p;
                    fill(keys, p + r.keys().len());
                    // Most records that agree agree to their end: one
                    // branch-free compare of the whole run (a `memcmp`
                    // call per record was ~4 % of the default path at 64
                    // nested replicas, issue 36 session 48); else key by
                    // key to the first difference.
                    let (ours, req) = (&r.keys()[j0..], &keys[s..]);
                    let eq = if req.len() >= ours.len() && same_keys(ours, &req[..ours.len()]) {
                        ours.len()
                    } else {
                        ours.iter().zip(req).take_while(|(a, b)| a == b).count()
                    };
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
        if self
            .read_filed()
            .by_owner
            .get(replica as usize)
            .is_none_or(|&first| first == NONE)
        {
            return 0;
        }
        let mut o = self.write_filed();
        let mut n = 0u64;
        let mut emptied: Vec<u32> = Vec::new();
        let first = o.by_owner.get(replica as usize).copied().unwrap_or(NONE);
        for &(part, key) in keys {
            let mut id = first;
            while let Some(r) = o.records.get_mut(id as usize).and_then(Option::as_mut) {
                if r.part == part {
                    n += u64::from(r.take(key));
                    if r.live == 0 && !emptied.contains(&id) {
                        emptied.push(id);
                    }
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
        let mut o = self.write_filed();
        let ids: Vec<u32> = o
            .owner_list(replica)
            .filter(|&id| o.record(id).is_some_and(|r| parts_of.contains(&r.part)))
            .collect();
        let n: u64 = ids.into_iter().map(|id| o.drop_record(id)).sum();
        self.len.fetch_sub(n as usize, Ordering::Relaxed);
        n
    }

    /// Removes expired holdings; returns how many.
    pub(crate) fn sweep(&self, now: i64) -> u64 {
        if !self.active() {
            return 0;
        }
        let publishers = read(&self.publishers).clone();
        let mut o = self.write_filed();
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
        let o = self.read_filed();
        let mut out: Vec<(u32, u32, u64)> = Vec::new();
        for r in 0..o.by_owner.len() as u32 {
            let publishes = publishers.contains(&r);
            // This replica's rows, one per partition (few: a linear find).
            let from = out.len();
            for x in o.owner_list(r).filter_map(|id| o.record(id)) {
                if x.expires.of(publishes) <= now || x.live == 0 {
                    continue;
                }
                match out[from..].iter_mut().find(|e| e.0 == x.part) {
                    Some(e) => e.2 += u64::from(x.live),
                    None => out.push((x.part, r, u64::from(x.live))),
                }
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
    fn the_head_table_grows_and_keeps_each_heads_records_newest_first() {
        let t = Tentative::new(1 << 20);
        // Two records of one head on one replica, the older first; a
        // delivery of their common prefix renews the older one.
        t.insert(1, 7, 0, &[1, 2, 3], both(100));
        t.insert(1, 7, 0, &[1, 2, 4], both(100));
        // Enough other heads to double the table several times (keys are
        // hashes: spread over the slots).
        let key = |i: u64| (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        for i in 0..20_000u64 {
            t.insert(1, 8, 0, &[key(i), i], both(100));
        }
        assert!(t.write_filed().heads.len() >= 20_000);
        t.insert(1, 7, 0, &[1, 2], both(200));
        // The older record was renewed (the newer one, expired, agrees
        // with [1, 2, 4] through the renewed one's prefix only).
        assert_eq!(run(&t, 7, &[1, 2, 3], 0, 150), 3);
        assert_eq!(run(&t, 7, &[1, 2, 4], 0, 150), 2);
        assert_eq!(run(&t, 7, &[1, 2, 4], 0, 50), 3);
        assert_eq!(run(&t, 8, &[key(5), 5], 0, 50), 2);
        // Dropping records empties their slots again.
        assert_eq!(t.sweep(150), 20_000 * 2 + 3);
        assert_eq!(run(&t, 7, &[1, 2, 3], 0, 150), 3);
        assert_eq!(t.sweep(250), 3);
        assert!(!t.active());
        assert!((0..PRESENT_SLOTS).all(|i| t.present.get(i) == 0));
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

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u32, u32, u32, Vec<u64>, i64),
        Runs(u32, Vec<u64>, [usize; 3], i64),
        Remove(u32, Vec<(u32, u64)>),
        Clear(u32),
        Sweep(i64),
        Counts(i64),
        Forget(u32),
        Publish(u32),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        // Few keys, replicas and starts: heads, chains and renewals collide.
        let keys = || proptest::collection::vec(1u64..6, 1..6);
        prop_oneof![
            4 => (1u32..3, 0u32..3, 0u32..3, keys(), 1i64..40)
                .prop_map(|(p, r, f, k, e)| Op::Insert(p, r, f, k, e)),
            4 => (1u32..3, keys(), [0usize..5, 0usize..5, 0usize..5], 0i64..40)
                .prop_map(|(p, k, s, now)| Op::Runs(p, k, s, now)),
            2 => (0u32..3, proptest::collection::vec((1u32..3, 1u64..6), 1..4))
                .prop_map(|(r, k)| Op::Remove(r, k)),
            1 => (0u32..3).prop_map(Op::Clear),
            1 => (0i64..40).prop_map(Op::Sweep),
            1 => (0i64..40).prop_map(Op::Counts),
            1 => (0u32..3).prop_map(Op::Forget),
            1 => (0u32..3).prop_map(Op::Publish),
        ]
    }

    /// What one op answers: the lazy overlay must answer alike.
    fn apply(t: &Tentative, op: &Op) -> Vec<u64> {
        match op {
            Op::Insert(p, r, f, k, e) => {
                let e = Expiry {
                    publishing: *e,
                    silent: e + 20,
                };
                let (a, b) = t.insert(*p, *r, *f, k, e);
                vec![a, b]
            }
            Op::Runs(p, k, s, now) => {
                let mut found = Vec::new();
                // A real run ends inside the request.
                let s = s.map(|x| x.min(k.len()));
                let deepest = s.iter().copied().max().unwrap_or(0);
                t.runs(
                    *p,
                    k.len(),
                    &mut Vec::new(),
                    |i| k[i],
                    deepest,
                    |r| s.get(r as usize).copied().unwrap_or(usize::MAX),
                    *now,
                    &mut found,
                );
                found.sort_unstable();
                found
                    .into_iter()
                    .flat_map(|(r, a, n)| [u64::from(r), a as u64, n as u64])
                    .collect()
            }
            Op::Remove(r, k) => vec![t.remove_many(*r, k)],
            Op::Clear(r) => vec![t.clear(&[1, 2], *r)],
            Op::Sweep(now) => vec![t.sweep(*now)],
            Op::Counts(now) => {
                let mut c = t.counts(*now);
                c.sort_unstable();
                c.into_iter()
                    .flat_map(|(p, r, n)| [u64::from(p), u64::from(r), n])
                    .collect()
            }
            Op::Forget(r) => {
                t.forget_replica(*r);
                Vec::new()
            }
            Op::Publish(r) => {
                t.mark_publisher(*r);
                Vec::new()
            }
        }
    }

    proptest::proptest! {
        /// Deliveries appended and filed by the next reader answer every
        /// operation as deliveries filed at once (with a cap that bites).
        #[test]
        fn appended_deliveries_answer_as_filed_ones(
            ops in proptest::collection::vec(op(), 1..60),
            cap in 4usize..40,
        ) {
            let (lazy, eager) = (Tentative::new(cap), Tentative::eager(cap));
            for op in &ops {
                proptest::prop_assert_eq!(apply(&lazy, op), apply(&eager, op), "{:?}", op);
                proptest::prop_assert_eq!(lazy.len(), eager.len());
            }
        }
    }
}

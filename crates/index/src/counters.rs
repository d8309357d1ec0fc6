//! Counters maintained in lockstep with the shards (updated while the shard
//! write lock is held; lock order is always shard → counters).

use crate::catalog::Partition;
use std::sync::atomic::Ordering;

/// Per serving scope: how many keys each replica holds (indexed by interned
/// replica id, so the per-entry update is one array slot, not a map probe)
/// and how many replicas hold at least one.
#[derive(Default, Clone)]
pub(crate) struct ScopeCounts {
    held: Vec<u64>,
    serving: usize,
}

impl ScopeCounts {
    fn add(&mut self, replica: u32, holders: u64) {
        let n = slot(&mut self.held, replica);
        if *n == 0 && holders > 0 {
            self.serving += 1;
        }
        *n += holders;
    }

    fn remove(&mut self, replica: u32) {
        if let Some(n) = self.held.get_mut(replica as usize) {
            if *n == 1 {
                self.serving = self.serving.saturating_sub(1);
            }
            dec(n);
        }
    }

    /// Keys held by `replica` in this scope.
    pub(crate) fn held(&self, replica: u32) -> u64 {
        self.held.get(replica as usize).copied().unwrap_or(0)
    }

    /// Number of replicas holding at least one key.
    pub(crate) fn len(&self) -> usize {
        self.serving
    }

    /// Replicas holding at least one key, by id.
    pub(crate) fn replicas(&self) -> impl Iterator<Item = u32> + '_ {
        self.held
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(r, _)| r as u32)
    }
}

/// Holders one replica added to one partition, counted while its upserts
/// run and applied to the [`Counters`] in one step (one lock per chain
/// instead of one per block).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Adds {
    /// New holders.
    pub(crate) holders: u64,
    /// Those of them that made a new key.
    pub(crate) keys: u64,
    /// The largest block (tokens) among the entries stored: the engine's
    /// block size, once a full block is seen (0: none seen).
    pub(crate) block_tokens: u32,
}

/// What the index knows of one replica's KV pool, for the tie's room rule
/// (`fleet.rs` [`crate::fleet::room_bucket`]): its capacity from the last
/// load report and its block size from the chains it stores, so that the
/// entries it holds can be read as a fraction of the pool.
#[derive(Debug, Default, Clone)]
pub(crate) struct Pool {
    capacity_tokens: u64,
    block_tokens: u32,
    /// Blocks of requests hinted here whose stores have not been reported
    /// yet, as (delivered at, blocks), oldest first: the producer's report
    /// window (100 ms) is longer than a client takes to send its next
    /// request, so without them sequential new prompts all read the same
    /// room (issue 33). Taken off by the replica's next stores, dropped
    /// after [`PENDING_NS`].
    pending: Vec<(i64, u64)>,
}

/// How long a delivered request's blocks count as held before its stores
/// are reported (a request that never reaches the engine stops counting).
pub(crate) const PENDING_NS: i64 = 2_000_000_000;

/// Deliveries pending per replica at most (past it the oldest goes).
const MAX_PENDING: usize = 64;

impl Pool {
    fn pending_blocks(&self) -> u64 {
        self.pending.iter().map(|p| p.1).sum()
    }

    /// Drops deliveries older than [`PENDING_NS`] at `now`.
    fn prune(&mut self, now: i64) {
        let old = self
            .pending
            .iter()
            .take_while(|p| now.saturating_sub(p.0) > PENDING_NS)
            .count();
        self.pending.drain(..old);
    }

    /// `n` blocks stored: the oldest pending deliveries' first.
    fn stored(&mut self, mut n: u64) {
        while n > 0 {
            let Some(first) = self.pending.first_mut() else {
                return;
            };
            let take = first.1.min(n);
            first.1 -= take;
            n -= take;
            if first.1 == 0 {
                self.pending.remove(0);
            }
        }
    }
}

/// Index-wide counters, indexed by interned ids.
#[derive(Default)]
pub(crate) struct Counters {
    /// (key, replica) pairs — the cap unit.
    pub(crate) total_entries: u64,
    /// Subset of `total_entries` under reserved tenants.
    pub(crate) reserved_entries: u64,
    /// Distinct keys (all tenants) — the cold-start test.
    pub(crate) total_keys: u64,
    /// Distinct keys per tenant id.
    pub(crate) keys_by_tenant: Vec<u64>,
    /// Distinct keys per (tenant, model) id.
    pub(crate) keys_by_tm: Vec<u64>,
    /// Distinct keys per model id, non-reserved tenants only (gauge source).
    pub(crate) keys_by_model: Vec<u64>,
    /// Per scope id: keys held per replica.
    pub(crate) serving: Vec<ScopeCounts>,
    /// Per replica id: entries held across every scope (0 = the replica
    /// holds nothing and may be released, see `replicas.rs`).
    pub(crate) held_by_replica: Vec<u64>,
    /// Per replica id: its pool as far as known (the held room).
    pub(crate) pools: Vec<Pool>,
}

fn slot<T: Default>(v: &mut Vec<T>, i: u32) -> &mut T {
    let i = i as usize;
    if v.len() <= i {
        v.resize_with(i + 1, T::default);
    }
    &mut v[i]
}

fn dec(v: &mut u64) {
    *v = v.saturating_sub(1);
}

impl Counters {
    /// `a.holders` new holders of `p` by `replica`, `a.keys` of them on new
    /// keys: one update for a run of upserts (a chain store).
    pub(crate) fn on_add(&mut self, p: &Partition, replica: u32, a: Adds) {
        if a.holders == 0 {
            return;
        }
        let room = self.held_room_bucket(replica);
        if let Some(pool) = self.pools.get_mut(replica as usize) {
            pool.stored(a.holders);
        }
        if a.block_tokens > 0 {
            let pool = slot(&mut self.pools, replica);
            pool.block_tokens = pool.block_tokens.max(a.block_tokens);
        }
        self.total_entries += a.holders;
        *slot(&mut self.held_by_replica, replica) += a.holders;
        self.room_changed_from(replica, room);
        if p.reserved {
            self.reserved_entries += a.holders;
        }
        let scope = slot(&mut self.serving, p.scope_id);
        let before = scope.len();
        scope.add(replica, a.holders);
        if scope.len() != before {
            crate::cold_sets::fleet_changed();
        }
        publish_serving(p, scope.len());
        if a.keys > 0 {
            self.total_keys += a.keys;
            *slot(&mut self.keys_by_tenant, p.tenant_id) += a.keys;
            *slot(&mut self.keys_by_tm, p.tm_id) += a.keys;
            if !p.reserved {
                *slot(&mut self.keys_by_model, p.model_id) += a.keys;
            }
        }
    }

    pub(crate) fn on_remove(&mut self, p: &Partition, replica: u32, key_removed: bool) {
        let room = self.held_room_bucket(replica);
        dec(&mut self.total_entries);
        dec(slot(&mut self.held_by_replica, replica));
        self.room_changed_from(replica, room);
        if p.reserved {
            dec(&mut self.reserved_entries);
        }
        let scope = slot(&mut self.serving, p.scope_id);
        let before = scope.len();
        scope.remove(replica);
        if scope.len() != before {
            crate::cold_sets::fleet_changed();
        }
        publish_serving(p, scope.len());
        if key_removed {
            dec(&mut self.total_keys);
            dec(slot(&mut self.keys_by_tenant, p.tenant_id));
            dec(slot(&mut self.keys_by_tm, p.tm_id));
            if !p.reserved {
                dec(slot(&mut self.keys_by_model, p.model_id));
            }
        }
    }

    /// Notes `replica`'s KV pool capacity from a stats report (0: unknown,
    /// or no load reported).
    pub(crate) fn set_capacity(&mut self, replica: u32, capacity_tokens: u64, now: i64) {
        let same = self
            .pools
            .get(replica as usize)
            .map_or(capacity_tokens == 0, |p| {
                p.capacity_tokens == capacity_tokens
                    && p.pending
                        .first()
                        .is_none_or(|d| now.saturating_sub(d.0) <= PENDING_NS)
            });
        if same {
            return;
        }
        let room = self.held_room_bucket(replica);
        let pool = slot(&mut self.pools, replica);
        pool.capacity_tokens = capacity_tokens;
        pool.prune(now);
        self.room_changed_from(replica, room);
    }

    /// Whether `replica`'s pool size is known (deliveries are then noted).
    pub(crate) fn knows_pool(&self, replica: u32) -> bool {
        self.pools
            .get(replica as usize)
            .is_some_and(|p| p.capacity_tokens > 0)
    }

    /// A request was hinted to `replica` at `now` with `blocks` blocks it
    /// does not hold, of at most `block_tokens` tokens each: they count as
    /// held until its stores are reported (or [`PENDING_NS`] passes).
    pub(crate) fn note_intake(&mut self, replica: u32, blocks: u64, block_tokens: u32, now: i64) {
        if blocks == 0 {
            return;
        }
        let room = self.held_room_bucket(replica);
        let pool = slot(&mut self.pools, replica);
        pool.prune(now);
        if pool.pending.len() >= MAX_PENDING {
            pool.pending.remove(0);
        }
        pool.pending.push((now, blocks));
        pool.block_tokens = pool.block_tokens.max(block_tokens);
        self.room_changed_from(replica, room);
    }

    /// Forgets a released replica id's pool (the id is reused).
    pub(crate) fn forget_pool(&mut self, replica: u32) {
        if let Some(p) = self.pools.get_mut(replica as usize) {
            *p = Pool::default();
        }
    }

    /// The fraction of `replica`'s pool its entries fill (blocks held, and
    /// pending from requests just hinted there, over capacity / block size,
    /// at most 1), when both are known. vLLM's own
    /// `kv_cache_usage_perc` counts blocks in use by running requests only
    /// (an idle engine reads 0 % whatever it caches); this counts what it
    /// caches, as the index sees it.
    pub(crate) fn held_usage(&self, replica: u32) -> Option<f32> {
        let p = self.pools.get(replica as usize)?;
        let blocks = p.capacity_tokens.checked_div(u64::from(p.block_tokens))?;
        if blocks == 0 {
            return None;
        }
        let held = self
            .held_by_replica
            .get(replica as usize)
            .copied()
            .unwrap_or(0)
            .saturating_add(p.pending_blocks());
        Some((held.min(blocks) as f64 / blocks as f64) as f32)
    }

    /// The room the tie reads for `replica`: the larger of the engine's
    /// reported usage and the fraction its entries fill.
    pub(crate) fn room_usage(&self, replica: u32, reported: f32) -> f32 {
        self.held_usage(replica)
            .map_or(reported, |h| reported.max(h))
    }

    fn held_room_bucket(&self, replica: u32) -> Option<i32> {
        self.held_usage(replica).and_then(crate::fleet::room_bucket)
    }

    /// The fleet sets order replicas by room (`cold_sets.rs`): one whose
    /// held room moved to another bucket rebuilds them.
    #[inline]
    fn room_changed_from(&self, replica: u32, before: Option<i32>) {
        if self.held_room_bucket(replica) != before {
            crate::cold_sets::fleet_changed();
        }
    }

    pub(crate) fn tenant_keys(&self, id: u32) -> u64 {
        self.keys_by_tenant.get(id as usize).copied().unwrap_or(0)
    }

    pub(crate) fn tm_keys(&self, id: u32) -> u64 {
        self.keys_by_tm.get(id as usize).copied().unwrap_or(0)
    }

    pub(crate) fn scope(&self, id: u32) -> Option<&ScopeCounts> {
        self.serving.get(id as usize)
    }

    pub(crate) fn scope_len(&self, id: u32) -> usize {
        self.scope(id).map_or(0, ScopeCounts::len)
    }

    pub(crate) fn serves(&self, scope: u32, replica: u32) -> bool {
        self.scope(scope).is_some_and(|s| s.held(replica) > 0)
    }
}

/// Mirrors a scope's serving count into its partitions' shared atomic,
/// written only when it changed: every lookup reads that line, and an
/// unchanged store would still take it from the reader's cache on each
/// write batch (the count changes only when a replica joins or leaves).
#[inline]
fn publish_serving(p: &Partition, n: usize) {
    if p.serving.load(Ordering::Relaxed) != n {
        p.serving.store(n, Ordering::Relaxed);
    }
}

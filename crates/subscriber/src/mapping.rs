//! Engine block hash → content fingerprint, per replica.
//!
//! Engine hashes are process-private (vLLM seeded them with `os.urandom`), so
//! they are never index keys. Each stored block is keyed by the shared content
//! fingerprint instead (`server.md` §9): the XXH3 content hash of its tokens,
//! chained onto its parent's prefix hash. The map remembers, per engine hash,
//! that prefix hash, the cumulative token count, the adapter and the media
//! holding the block, so that later events naming only engine hashes
//! (children, removals) can be translated.
//!
//! Rules that differ from the reference on purpose:
//! - **Unknown parent → held back, never a fresh root.** Keying a suffix as a
//!   root would produce fingerprints that match unrelated prompts. The event
//!   waits in a bounded pending set; it is applied as soon as its parent is
//!   stored (for instance by a replay) and dropped, counted, by
//!   [`Mapping::drop_pending`] once the caller knows no replay can help, or by
//!   the bound.
//! - **Tiers come from `medium`.** A block in GPU memory is T1; a block held
//!   only in a colder medium (CPU, CPU_TIER1/2, disk, or any other named
//!   medium) is T2; a block held only in SGLang's `EXTERNAL` medium (a
//!   shared or remote pool) is T3. Removing the GPU copy of a block still
//!   held elsewhere re-reports it at its colder tier instead of evicting it. When the engine sends no
//!   medium, `ignore_block_removed` selects the reference's two behaviours
//!   (evict, or re-report at T2 and forget).
//! - **Duplicates are counted.** The engine can hold two physical GPU blocks
//!   under one hash (a miss re-stores a block it already has); each GPU
//!   store counts a copy and a GPU removal drops one, so the block leaves the
//!   index only with its last copy. (vLLM's per-request
//!   `kv_cache_report_mode="full"` re-announces reused blocks as stores; with
//!   it a block would outlive its removal here, so leave it at its
//!   default, `incremental`.)
//! - **Bounded.** At most `max_tracked_blocks` engine blocks are tracked.
//!   Overflow policy: the least recently stored block is forgotten and an
//!   eviction is emitted for it, so the server never keeps a key this
//!   subscriber can no longer retract; each one is counted and logged
//!   (first time, then at every power of two).
//! - **Hybrid models.** Blocks of a KV-cache group whose spec is not full
//!   attention (sliding window, Mamba, local/linear attention) are not a
//!   reusable prefix by themselves and are not reported; they are tracked
//!   ([`crate::window`]) to decide, per full-attention block, whether a
//!   match may end there (vLLM reuses a prefix only up to a point where
//!   every sliding-window group holds the blocks its window needs). Each
//!   report says so ([`PrefixReport::no_match_end`]), and a block whose
//!   answer changes is re-reported. Keys include the group index, so groups
//!   never overwrite each other's entries.
//!
//! Memory: about 130–170 bytes per tracked block with integer hashes (map
//! entry, key, store-order queue), plus 32 bytes per key for 32-byte `bin`
//! hashes; the pending set holds at most `max_pending_blocks` blocks of held
//! events (tokens included). A hybrid model adds a link per full-attention
//! block (its parent and children) and a set entry per window block (at most
//! `max_tracked_blocks` of them).
//!
//! - **Extra keys are part of the fingerprint.** A block the engine keys by
//!   more than its tokens (a `cache_salt`, multimodal identifiers, prompt
//!   embeddings: vLLM's `extra_keys`, SGLang's `cache_salt`) folds those keys
//!   into its content hash ([`inferencecache_fingerprint::with_extra_keys`]),
//!   so only a lookup carrying the same salt matches it, and image blocks
//!   match no token lookup at all; unsalted blocks hash as before. The LoRA
//!   name is keyed by the adapter partition instead.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use foldhash::fast::RandomState;
use inferencecache_fingerprint::{ExtraKeys, chain_step, content_hash, to_wire, with_extra_keys};

use crate::event::{BlockRemoved, BlockStored, EngineEvent, Medium};
use crate::hash::EngineHash;
use crate::lora::AdapterResolver;
use crate::window::{Rule, Windows};

/// Default for `--max-tracked-blocks`: ~40 MiB of map at the sizes above,
/// inside the sidecar's 128 MiB limit, and more blocks than a typical GPU
/// prefix cache holds.
pub const DEFAULT_MAX_TRACKED_BLOCKS: usize = 262_144;

/// Default bound on blocks held back for an unknown parent.
pub const DEFAULT_MAX_PENDING_BLOCKS: usize = 8_192;

/// Cache tier, numbered like the proto's `CacheTier`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tier {
    /// GPU-resident (proto `T1 = 1`).
    T1,
    /// Held in a colder medium, reloadable (proto `T2 = 2`).
    T2,
    /// Held only in a shared or remote pool (SGLang `EXTERNAL`; proto `T3 = 3`).
    T3,
}

impl Tier {
    /// The proto `CacheTier` value.
    pub fn as_proto(self) -> i32 {
        match self {
            Tier::T1 => 1,
            Tier::T2 => 2,
            Tier::T3 => 3,
        }
    }
}

/// Mapping settings (the CLI's flags).
#[derive(Debug, Clone)]
pub struct MappingConfig {
    /// `--max-tracked-blocks`: engine blocks remembered at most (min 1).
    pub max_tracked_blocks: usize,
    /// Blocks held back for an unknown parent at most (0 drops at once).
    pub max_pending_blocks: usize,
    /// `--ignore-block-removed`: for a `BlockRemoved` without `medium`,
    /// re-report at T2 (an L2 tier keeps the block) instead of evicting.
    pub ignore_block_removed: bool,
    /// `--lora-adapter-names`, parsed by
    /// [`parse_lora_adapter_names`](crate::lora::parse_lora_adapter_names).
    pub lora_adapter_names: HashMap<i64, String>,
}

impl Default for MappingConfig {
    fn default() -> Self {
        Self {
            max_tracked_blocks: DEFAULT_MAX_TRACKED_BLOCKS,
            max_pending_blocks: DEFAULT_MAX_PENDING_BLOCKS,
            ignore_block_removed: false,
            lora_adapter_names: HashMap::new(),
        }
    }
}

/// A block to report (`ReportCacheState` legacy `PrefixEntry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixReport {
    /// Positional content fingerprint of the block.
    pub prefix_hash: u64,
    /// Tokens from the start of the sequence through this block.
    pub token_count: i32,
    /// Where the block lives now.
    pub tier: Tier,
    /// LoRA adapter name; `""` for the base model.
    pub adapter: Arc<str>,
    /// Tokens per block of the engine that stored it (`BlockStored.block_size`).
    pub block_size: u32,
    /// A hybrid model's sliding-window (or other non-full) groups do not
    /// hold what a match ending at this block needs: the engine would
    /// recompute from an earlier block (`PrefixEntry.no_match_end`).
    pub no_match_end: bool,
}

impl PrefixReport {
    /// `PrefixEntry.prefix_hash`: 8 bytes, big-endian.
    pub fn prefix_hash_wire(&self) -> [u8; 8] {
        to_wire(self.prefix_hash)
    }
}

/// A block gone from every medium (`PublishEvent(PREFIX_EVICTED)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixEviction {
    /// Positional content fingerprint of the block.
    pub prefix_hash: u64,
    /// Tokens from the start of the sequence through this block.
    pub token_count: i32,
    /// LoRA adapter name; `""` for the base model.
    pub adapter: Arc<str>,
}

impl PrefixEviction {
    /// `CacheEvent.prefix_hash`: 8 bytes, big-endian.
    pub fn prefix_hash_wire(&self) -> [u8; 8] {
        to_wire(self.prefix_hash)
    }
}

/// What to tell the server, in order. Send order matters: flush buffered
/// reports before sending an eviction, and send a T2 re-report from a removal
/// as its own update with that batch's timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// A stored block, or a block whose tier changed.
    Report(PrefixReport),
    /// A block the replica no longer holds anywhere.
    Evict(PrefixEviction),
    /// The engine cleared its whole cache (`PublishEvent(ALL_CLEARED)`).
    AllCleared,
}

/// Counters for the subscriber's `/metrics`. Block counts unless noted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MappingStats {
    /// Blocks stored or re-stored and reported.
    pub blocks_stored: u64,
    /// Blocks evicted because no medium holds them any more.
    pub blocks_evicted: u64,
    /// Blocks re-reported at T2 after leaving the GPU.
    pub blocks_downgraded: u64,
    /// Removals naming a block this map does not know.
    pub removed_unknown: u64,
    /// Blocks dropped because `token_ids` did not hold exactly one full block
    /// per hash (and they were not already known).
    pub dropped_token_mismatch: u64,
    /// Blocks dropped because their `lora_id` has no configured name.
    pub dropped_unmapped_lora: u64,
    /// Events held back for an unknown parent.
    pub held_back_events: u64,
    /// Held events applied after their parent appeared.
    pub resolved_events: u64,
    /// Held blocks dropped because their parent never appeared (or the
    /// pending bound was hit).
    pub dropped_unknown_parent: u64,
    /// Blocks forgotten (and evicted) by the `max_tracked_blocks` bound.
    pub overflow_evicted: u64,
    /// Blocks of non-prefix KV-cache groups (sliding window, Mamba) in a
    /// medium other than the GPU, ignored (the window rule counts the
    /// engine's own prefix cache).
    pub skipped_non_prefix_group: u64,
    /// `AllBlocksCleared` events.
    pub clears: u64,
    /// Stores of a hash the GPU already held (a second physical copy).
    pub duplicate_blocks: u64,
    /// GPU removals of one copy of a hash still held by another copy.
    pub removed_duplicates: u64,
    /// Blocks stored in non-full groups (sliding window, Mamba), tracked
    /// for the window rule, not reported.
    pub window_blocks: u64,
    /// Re-reports of a block whose validity as a match end changed.
    pub end_changes: u64,
}

// Residency bits: one per medium, so a block in several media is removed
// from each independently.
const GPU: u8 = 1;

fn medium_bit(m: Option<&Medium>) -> u8 {
    match m {
        None | Some(Medium::Gpu) => GPU,
        Some(Medium::Cpu) => 1 << 1,
        Some(Medium::CpuTier1) => 1 << 2,
        Some(Medium::CpuTier2) => 1 << 3,
        Some(Medium::Disk) => 1 << 4,
        Some(Medium::Other(_)) => 1 << 5,
        Some(Medium::External) => EXTERNAL,
    }
}

const EXTERNAL: u8 = 1 << 6;

fn tier_of(residency: u8) -> Tier {
    if residency & GPU != 0 {
        Tier::T1
    } else if residency & !EXTERNAL != 0 {
        Tier::T2
    } else {
        Tier::T3
    }
}

/// Whether a KV-cache group holds reusable prefix blocks (full attention).
#[cfg(test)]
fn is_prefix_group(ev: &BlockStored) -> bool {
    Rule::of(ev).is_none()
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BlockKey {
    group: i64,
    hash: EngineHash,
}

#[derive(Debug)]
struct Entry {
    prefix: u64,
    tokens: i32,
    adapter: Arc<str>,
    residency: u8,
    block_size: u32,
    /// Physical GPU blocks the engine holds under this hash: a miss can
    /// re-store a block it already has, and each copy is removed on its own.
    copies: u32,
    /// Not a valid match end (hybrid models), as last reported.
    no_end: bool,
    stamp: u64,
}

#[derive(Debug)]
struct Pending {
    id: u64,
    event: BlockStored,
    adapter: Arc<str>,
    bit: u8,
}

/// The per-replica engine-hash map. Single-owner, synchronous, no I/O.
#[derive(Debug)]
pub struct Mapping {
    max_tracked: usize,
    max_pending: usize,
    ignore_block_removed: bool,
    adapters: AdapterResolver,
    blocks: HashMap<BlockKey, Entry, RandomState>,
    // Store order for the overflow policy; entries whose stamp no longer
    // matches the map are stale and skipped (lazy deletion).
    order: VecDeque<(BlockKey, u64)>,
    next_stamp: u64,
    // Held events by the parent they wait for, plus arrival order for the bound.
    pending: HashMap<BlockKey, Vec<Pending>, RandomState>,
    pending_order: VecDeque<(BlockKey, u64)>,
    pending_blocks: usize,
    next_pending_id: u64,
    non_prefix_groups: HashSet<i64>,
    /// Full-attention groups seen (one for most models).
    prefix_groups: Vec<i64>,
    /// The window rule's state, once a non-full group was seen.
    windows: Option<Windows>,
    block_size: u32,
    stats: MappingStats,
}

impl Mapping {
    /// An empty map.
    pub fn new(config: MappingConfig) -> Self {
        Self {
            max_tracked: config.max_tracked_blocks.max(1),
            max_pending: config.max_pending_blocks,
            ignore_block_removed: config.ignore_block_removed,
            adapters: AdapterResolver::new(config.lora_adapter_names),
            blocks: HashMap::default(),
            order: VecDeque::new(),
            next_stamp: 0,
            pending: HashMap::default(),
            pending_order: VecDeque::new(),
            pending_blocks: 0,
            next_pending_id: 0,
            non_prefix_groups: HashSet::new(),
            prefix_groups: Vec::new(),
            windows: None,
            block_size: 0,
            stats: MappingStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> &MappingStats {
        &self.stats
    }

    /// Engine blocks currently tracked.
    pub fn tracked_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Tokens per block of the engine's prefix blocks, once it stored one
    /// (0 before).
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Blocks held back for an unknown parent.
    pub fn pending_blocks(&self) -> usize {
        self.pending_blocks
    }

    /// Applies every event of a decoded batch, appending updates to `out`.
    pub fn apply_all<'e>(
        &mut self,
        events: impl IntoIterator<Item = &'e EngineEvent> + Clone,
        out: &mut Vec<Update>,
    ) {
        // A step's events for every group arrive in one batch, the
        // full-attention group's possibly first: know the batch's window
        // groups before its first blocks are reported.
        for ev in events.clone() {
            if let EngineEvent::BlockStored(s) = ev {
                if let Some(rule) = Rule::of(s) {
                    let w = self.windows.get_or_insert_with(Windows::new);
                    w.declare(s.group_idx.unwrap_or(0), rule);
                }
            }
        }
        for ev in events {
            self.apply(ev, out);
        }
    }

    /// Window blocks tracked (hybrid models; 0 otherwise).
    pub fn window_blocks(&self) -> usize {
        self.windows.as_ref().map_or(0, Windows::held_blocks)
    }

    /// Applies one event, appending what to tell the server to `out`.
    pub fn apply(&mut self, event: &EngineEvent, out: &mut Vec<Update>) {
        match event {
            EngineEvent::BlockStored(ev) => self.stored(ev, out),
            EngineEvent::BlockRemoved(ev) => self.removed(ev, out),
            EngineEvent::AllBlocksCleared => {
                self.reset();
                self.stats.clears += 1;
                out.push(Update::AllCleared);
            }
        }
    }

    /// Forgets everything (blocks and held events) without emitting anything:
    /// for an engine restart, where the caller sends `ALL_CLEARED` itself.
    pub fn reset(&mut self) {
        if let Some(w) = self.windows.as_mut() {
            w.reset();
        }
        self.blocks.clear();
        self.order.clear();
        self.pending.clear();
        self.pending_order.clear();
        self.pending_blocks = 0;
    }

    /// Drops every held event (their parent is not coming: the replay, if
    /// any, is over). Returns the number of blocks dropped, also counted.
    pub fn drop_pending(&mut self) -> usize {
        let dropped = self.pending_blocks;
        if dropped > 0 {
            tracing::warn!(
                blocks = dropped,
                "dropping blocks whose parent block is unknown (not keyed as fresh roots)"
            );
        }
        self.stats.dropped_unknown_parent += dropped as u64;
        self.pending.clear();
        self.pending_order.clear();
        self.pending_blocks = 0;
        dropped
    }

    /// The current state as reports, e.g. to re-seed a restarted server.
    pub fn current_reports(&self) -> impl Iterator<Item = PrefixReport> + '_ {
        self.blocks.values().map(report_of)
    }

    fn stored(&mut self, ev: &BlockStored, out: &mut Vec<Update>) {
        let group = ev.group_idx.unwrap_or(0);
        if let Some(rule) = Rule::of(ev) {
            self.non_prefix_groups.insert(group);
            if medium_bit(ev.medium.as_ref()) != GPU {
                self.stats.skipped_non_prefix_group += ev.block_hashes.len() as u64;
                return;
            }
            self.stats.window_blocks += ev.block_hashes.len() as u64;
            let w = self.windows.get_or_insert_with(Windows::new);
            let affected = w.store(group, rule, &ev.block_hashes);
            if w.held_blocks() > self.max_tracked {
                // Removals were lost (the engine holds far fewer window
                // blocks): forget them all, so nothing is a valid end until
                // the engine stores window blocks again (missed hints,
                // never false ones).
                tracing::warn!(
                    max_tracked_blocks = self.max_tracked,
                    "window blocks over the tracked-block bound: forgetting them"
                );
                w.forget_held();
                let all: Vec<EngineHash> = self.blocks.keys().map(|k| k.hash.clone()).collect();
                self.revalidate(&all, out);
                return;
            }
            self.revalidate(&affected, out);
            return;
        }
        if !self.prefix_groups.contains(&group) {
            self.prefix_groups.push(group);
        }
        if ev.block_size > 0 {
            self.block_size = ev.block_size;
        }
        let Some(adapter) = self.adapters.resolve(ev) else {
            self.stats.dropped_unmapped_lora += ev.block_hashes.len() as u64;
            return;
        };
        let bit = medium_bit(ev.medium.as_ref());
        let mut newly_known = Vec::new();
        if let Err(held) = self.store_chain(ev, &adapter, bit, out, &mut newly_known) {
            self.hold(held, ev.clone(), adapter, bit);
        }
        self.resolve_pending(newly_known, out);
        self.enforce_bound(out);
    }

    /// Stores one event's chain. `Err(parent key)` when the parent is unknown.
    fn store_chain(
        &mut self,
        ev: &BlockStored,
        adapter: &Arc<str>,
        bit: u8,
        out: &mut Vec<Update>,
        newly_known: &mut Vec<BlockKey>,
    ) -> Result<(), BlockKey> {
        let group = ev.group_idx.unwrap_or(0);
        let bs = ev.block_size as usize;
        let n = ev.block_hashes.len();
        let tokens_match = bs > 0 && ev.token_ids.len() / bs == n;
        if !tokens_match {
            // A known block can still change residency (e.g. offloaded to CPU
            // by an event that carries no tokens); an unknown one cannot be
            // fingerprinted.
            let all_known = ev.block_hashes.iter().all(|h| {
                self.blocks.contains_key(&BlockKey {
                    group,
                    hash: h.clone(),
                })
            });
            if !all_known || n == 0 {
                if n > 0 {
                    tracing::debug!(
                        blocks = n,
                        tokens = ev.token_ids.len(),
                        block_size = bs,
                        "BlockStored with missing or mismatched token_ids: dropped"
                    );
                }
                self.stats.dropped_token_mismatch += n as u64;
                return Ok(());
            }
        }
        let (mut prev, mut tokens) = match &ev.parent_block_hash {
            // Residency-only updates need no parent.
            _ if !tokens_match => (None, 0i32),
            None => (None, 0i32),
            Some(p) => {
                let key = BlockKey {
                    group,
                    hash: p.clone(),
                };
                match self.blocks.get(&key) {
                    Some(e) => (Some(e.prefix), e.tokens),
                    None => return Err(key),
                }
            }
        };
        let step = i32::try_from(bs).unwrap_or(i32::MAX);
        for (i, h) in ev.block_hashes.iter().enumerate() {
            let key = BlockKey {
                group,
                hash: h.clone(),
            };
            let stamp = self.next_stamp;
            self.next_stamp += 1;
            let report = if tokens_match {
                let block = ev.token_ids.get(i * bs..(i + 1) * bs).unwrap_or_default();
                let content = with_extra_keys(content_hash(block), &extra_keys(ev, i, adapter));
                let prefix = prev.map_or(content, |p| chain_step(p, content));
                tokens = tokens.saturating_add(step);
                prev = Some(prefix);
                let no_end = match self.windows.as_mut() {
                    Some(w) => {
                        let parent = if i == 0 {
                            ev.parent_block_hash.as_ref()
                        } else {
                            ev.block_hashes.get(i - 1)
                        };
                        w.link(h, parent, !self.blocks.contains_key(&key));
                        !w.valid_end(h)
                    }
                    None => false,
                };
                let entry = self.blocks.entry(key.clone()).or_insert_with(|| Entry {
                    prefix,
                    tokens,
                    adapter: adapter.clone(),
                    residency: 0,
                    block_size: ev.block_size,
                    copies: 0,
                    no_end,
                    stamp,
                });
                entry.block_size = ev.block_size;
                entry.no_end = no_end;
                if bit == GPU {
                    if entry.residency & GPU != 0 {
                        self.stats.duplicate_blocks += 1;
                    }
                    entry.copies = entry.copies.saturating_add(1);
                }
                entry.prefix = prefix;
                entry.tokens = tokens;
                entry.adapter = adapter.clone();
                entry.residency |= bit;
                entry.stamp = stamp;
                report_of(entry)
            } else {
                let Some(entry) = self.blocks.get_mut(&key) else {
                    continue;
                };
                entry.residency |= bit;
                entry.stamp = stamp;
                report_of(entry)
            };
            self.order.push_back((key.clone(), stamp));
            self.stats.blocks_stored += 1;
            out.push(Update::Report(report));
            // Only held events wait for keys; with none held, skip the work.
            if !self.pending.is_empty() {
                newly_known.push(key);
            }
        }
        Ok(())
    }

    fn hold(&mut self, parent: BlockKey, event: BlockStored, adapter: Arc<str>, bit: u8) {
        let blocks = event.block_hashes.len();
        self.stats.held_back_events += 1;
        if blocks > self.max_pending {
            self.stats.dropped_unknown_parent += blocks as u64;
            return;
        }
        let id = self.next_pending_id;
        self.next_pending_id += 1;
        self.pending_blocks += blocks;
        self.pending_order.push_back((parent.clone(), id));
        self.pending.entry(parent).or_default().push(Pending {
            id,
            event,
            adapter,
            bit,
        });
        while self.pending_blocks > self.max_pending {
            let Some((key, id)) = self.pending_order.pop_front() else {
                break;
            };
            if let Some(list) = self.pending.get_mut(&key) {
                if let Some(pos) = list.iter().position(|p| p.id == id) {
                    let p = list.remove(pos);
                    let n = p.event.block_hashes.len();
                    self.pending_blocks -= n;
                    self.stats.dropped_unknown_parent += n as u64;
                }
                if list.is_empty() {
                    self.pending.remove(&key);
                }
            }
        }
        if self.pending_order.len() > 2 * self.pending.len() + 64 {
            let live: HashSet<u64> = self.pending.values().flatten().map(|p| p.id).collect();
            self.pending_order.retain(|(_, id)| live.contains(id));
        }
    }

    fn resolve_pending(&mut self, mut work: Vec<BlockKey>, out: &mut Vec<Update>) {
        if self.pending.is_empty() {
            return;
        }
        while let Some(key) = work.pop() {
            let Some(list) = self.pending.remove(&key) else {
                continue;
            };
            for p in list {
                self.pending_blocks -= p.event.block_hashes.len();
                self.stats.resolved_events += 1;
                if let Err(parent) = self.store_chain(&p.event, &p.adapter, p.bit, out, &mut work) {
                    self.hold(parent, p.event, p.adapter, p.bit);
                }
            }
        }
    }

    fn enforce_bound(&mut self, out: &mut Vec<Update>) {
        while self.blocks.len() > self.max_tracked {
            let Some((key, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.blocks.get(&key).is_some_and(|e| e.stamp == stamp) {
                if let Some(e) = self.blocks.remove(&key) {
                    self.unlink(&key);
                    self.stats.overflow_evicted += 1;
                    let n = self.stats.overflow_evicted;
                    if n.is_power_of_two() {
                        tracing::warn!(
                            overflow_evicted = n,
                            max_tracked_blocks = self.max_tracked,
                            "tracked-block bound reached: forgetting the least recently stored block and evicting it at the server"
                        );
                    }
                    out.push(Update::Evict(eviction_of(&e)));
                }
            }
        }
        // Stale order entries come from re-stores and removals; compact when
        // they dominate so the queue stays O(tracked blocks).
        if self.order.len() > 2 * self.blocks.len() + 1024 {
            let mut live: Vec<(BlockKey, u64)> = self
                .blocks
                .iter()
                .map(|(k, e)| (k.clone(), e.stamp))
                .collect();
            live.sort_unstable_by_key(|(_, s)| *s);
            self.order = live.into();
        }
    }

    fn removed(&mut self, ev: &BlockRemoved, out: &mut Vec<Update>) {
        let group = ev.group_idx.unwrap_or(0);
        if self.non_prefix_groups.contains(&group) {
            if medium_bit(ev.medium.as_ref()) == GPU {
                let affected = self
                    .windows
                    .as_mut()
                    .and_then(|w| w.remove(group, &ev.block_hashes));
                if let Some(affected) = affected {
                    self.revalidate(&affected, out);
                }
            }
            return;
        }
        for h in &ev.block_hashes {
            let key = BlockKey {
                group,
                hash: h.clone(),
            };
            let Some(entry) = self.blocks.get_mut(&key) else {
                if !self.non_prefix_groups.contains(&group) {
                    self.stats.removed_unknown += 1;
                }
                continue;
            };
            if medium_bit(ev.medium.as_ref()) == GPU && entry.copies > 1 {
                // Another physical copy of this hash is still cached.
                entry.copies -= 1;
                self.stats.removed_duplicates += 1;
                continue;
            }
            if medium_bit(ev.medium.as_ref()) == GPU {
                entry.copies = 0;
            }
            match &ev.medium {
                None if self.ignore_block_removed => {
                    // Reference L2 mode: the block lives on in an unnamed
                    // colder tier; report it there and stop tracking it.
                    let mut report = report_of(entry);
                    report.tier = Tier::T2;
                    self.blocks.remove(&key);
                    self.unlink(&key);
                    self.stats.blocks_downgraded += 1;
                    out.push(Update::Report(report));
                }
                None => self.evict(&key, out),
                Some(m) => {
                    let before = tier_of(entry.residency);
                    entry.residency &= !medium_bit(Some(m));
                    if entry.residency == 0 {
                        self.evict(&key, out);
                    } else if tier_of(entry.residency) != before {
                        let report = report_of(entry);
                        self.stats.blocks_downgraded += 1;
                        out.push(Update::Report(report));
                    }
                }
            }
        }
    }

    fn evict(&mut self, key: &BlockKey, out: &mut Vec<Update>) {
        if let Some(e) = self.blocks.remove(key) {
            self.unlink(key);
            self.stats.blocks_evicted += 1;
            out.push(Update::Evict(eviction_of(&e)));
        }
    }

    /// A full-attention block left the map: its window link goes with it.
    fn unlink(&mut self, key: &BlockKey) {
        if let Some(w) = self.windows.as_mut() {
            w.unlink(&key.hash);
        }
    }

    /// Re-reports every full-attention block of `hashes` whose validity as
    /// a match end changed.
    fn revalidate(&mut self, hashes: &[EngineHash], out: &mut Vec<Update>) {
        let Some(w) = self.windows.as_ref() else {
            return;
        };
        for h in hashes {
            for &group in &self.prefix_groups {
                let key = BlockKey {
                    group,
                    hash: h.clone(),
                };
                let Some(entry) = self.blocks.get_mut(&key) else {
                    continue;
                };
                let no_end = !w.valid_end(h);
                if entry.no_end != no_end {
                    entry.no_end = no_end;
                    self.stats.end_changes += 1;
                    out.push(Update::Report(report_of(entry)));
                }
            }
        }
    }

    #[cfg(test)]
    fn insert_known(&mut self, group: i64, hash: EngineHash, prefix: u64, tokens: i32) {
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        self.blocks.insert(
            BlockKey {
                group,
                hash: hash.clone(),
            },
            Entry {
                prefix,
                tokens,
                adapter: Arc::from(""),
                residency: GPU,
                block_size: 16,
                copies: 1,
                no_end: false,
                stamp,
            },
        );
        self.order.push_back((BlockKey { group, hash }, stamp));
    }
}

/// What block `i` of `ev` is keyed by besides its tokens: vLLM's
/// `extra_keys` (a cache salt on a salted request's first block, multimodal
/// `(identifier, offset)` pairs, prompt-embedding digests) and SGLang's
/// `cache_salt` (on a chain's root; the chain carries it on). The LoRA name
/// vLLM lists first is left out: the adapter partition already keys it.
fn extra_keys(ev: &BlockStored, i: usize, adapter: &str) -> ExtraKeys {
    let mut keys = ExtraKeys::new();
    if let Some(Some(v)) = ev.extra_keys.as_ref().and_then(|k| k.get(i)) {
        let items = match v {
            rmpv::Value::Array(a) => a.as_slice(),
            other => std::slice::from_ref(other),
        };
        for (j, key) in items.iter().enumerate() {
            match key {
                rmpv::Value::Nil => {}
                rmpv::Value::String(s)
                    if j == 0 && !adapter.is_empty() && s.as_str() == Some(adapter) => {}
                rmpv::Value::String(s) => match s.as_str() {
                    Some(text) => keys.push_str(text),
                    None => keys.push_encoded(s.as_bytes()),
                },
                other => {
                    let mut buf = Vec::new();
                    // Writing to a Vec cannot fail.
                    let _ = rmpv::encode::write_value(&mut buf, other);
                    keys.push_encoded(&buf);
                }
            }
        }
    }
    if i == 0 && ev.parent_block_hash.is_none() {
        if let Some(salt) = ev.cache_salt.as_deref().filter(|s| !s.is_empty()) {
            keys.push_str(salt);
        }
    }
    keys
}

fn report_of(e: &Entry) -> PrefixReport {
    PrefixReport {
        prefix_hash: e.prefix,
        token_count: e.tokens,
        tier: tier_of(e.residency),
        adapter: e.adapter.clone(),
        block_size: e.block_size,
        no_match_end: e.no_end,
    }
}

fn eviction_of(e: &Entry) -> PrefixEviction {
    PrefixEviction {
        prefix_hash: e.prefix,
        token_count: e.tokens,
        adapter: e.adapter.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferencecache_fingerprint::prefix_hashes_from;

    /// The golden `parent_chain` vector needs a parent whose prefix is
    /// 0xDEADBEEF, which no token sequence produces; seed it directly.
    #[test]
    fn golden_parent_chain_vector() {
        let mut m = Mapping::new(MappingConfig::default());
        m.insert_known(0, EngineHash::Uint(1), 0xDEAD_BEEF, 16);
        let ev = EngineEvent::BlockStored(BlockStored {
            block_hashes: vec![EngineHash::Uint(2), EngineHash::Uint(3)],
            parent_block_hash: Some(EngineHash::Uint(1)),
            token_ids: (50..82).collect(),
            block_size: 16,
            ..BlockStored::default()
        });
        let mut out = Vec::new();
        m.apply(&ev, &mut out);
        let got: Vec<u64> = out
            .iter()
            .map(|u| match u {
                Update::Report(r) => r.prefix_hash,
                other => panic!("{other:?}"),
            })
            .collect();
        let want = prefix_hashes_from(&(50..82).collect::<Vec<u32>>(), 16, Some(0xDEAD_BEEF));
        assert_eq!(got, want);
        assert_eq!(got.len(), 2);
    }

    #[test]
    fn group_kinds() {
        let ev = |kind: Option<&str>, window: Option<i64>| BlockStored {
            kv_cache_spec_kind: kind.map(str::to_owned),
            kv_cache_spec_sliding_window: window,
            ..BlockStored::default()
        };
        assert!(is_prefix_group(&ev(None, None)));
        assert!(is_prefix_group(&ev(Some("full_attention"), None)));
        assert!(is_prefix_group(&ev(Some("mla_attention"), None)));
        assert!(!is_prefix_group(&ev(Some("sliding_window"), None)));
        assert!(!is_prefix_group(&ev(Some("mamba"), None)));
        assert!(!is_prefix_group(&ev(Some("full_attention"), Some(4096))));
    }
}

//! The discrete-event loop: replays a trace against N simulated replicas under
//! one policy at a time.
//!
//! Time is virtual (µs since the first arrival, after `--speedup`), so an
//! hour of trace runs as fast as the lookups allow. At each arrival the loop
//! first publishes, in time order, every engine batch that became visible by
//! then (its prefill finished `--event-delay` ago; through the real subscriber
//! mapping to the server) and every stats scrape due (`--stats-interval`),
//! waits for the acknowledgements, then routes. Nothing depends on
//! wall-clock time, so a seed gives the same decisions every run.

use crate::backend::{Backend, Op};
use crate::config::{Settings, SimConfig};
use crate::engine::Replica;
use crate::engine_events::{block_removed, block_stored, encode_batch, engine_hash};
use crate::error::SimError;
use crate::policy::{Cursor, PolicyKind, oracle_pick};
use crate::report::{PolicyResult, RequestRecord, SimReport};
use crate::tokens::BlockTokens;
use crate::trace::TraceRequest;
use bytes::Bytes;
use indicatif::{ProgressBar, ProgressStyle};
use inferencecache_proto::v1alpha1::ReplicaStats;
use inferencecache_subscriber::{
    DecodeOptions, Delivery, MappingConfig, ReplicaState, mapping::DEFAULT_MAX_TRACKED_BLOCKS,
};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// A trace prepared for replay: arrival times and fingerprints computed once
/// and shared by every policy.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Label (usually the trace path).
    pub label: String,
    requests: Vec<TraceRequest>,
    arrivals_us: Vec<u64>,
    chains: Vec<Vec<u64>>,
    tokens: BlockTokens,
}

impl Workload {
    /// Prepares `requests` (in arrival order) under `settings`.
    pub fn new(label: impl Into<String>, requests: Vec<TraceRequest>, settings: &Settings) -> Self {
        let mut tokens = BlockTokens::new(settings.seed, settings.block_size);
        let t0 = requests.first().map_or(0, |r| r.timestamp);
        let arrivals_us = requests
            .iter()
            .map(|r| ((r.timestamp - t0) as f64 * 1000.0 / settings.speedup).round() as u64)
            .collect();
        let chains = requests.iter().map(|r| tokens.prefix_hashes(r)).collect();
        Self {
            label: label.into(),
            requests,
            arrivals_us,
            chains,
            tokens,
        }
    }

    /// Requests in the trace.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// True for an empty trace.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Simulated span, seconds.
    pub fn span_seconds(&self) -> f64 {
        self.arrivals_us.last().copied().unwrap_or(0) as f64 / 1e6
    }
}

/// Runs every configured policy on `workload` and collects the report.
pub async fn simulate(config: &SimConfig, workload: &Workload) -> Result<SimReport, SimError> {
    config.settings.validate()?;
    if workload.is_empty() {
        return Err(SimError::EmptyTrace);
    }
    if config.policies.is_empty() {
        return Err(SimError::Config("no policy to run".into()));
    }
    if config.settings.server.is_some() && config.policies.iter().any(|p| p.needs_in_process()) {
        return Err(crate::backend::remote_knob_error());
    }
    let total = (workload.len() * config.policies.len()) as u64;
    let bar = if config.progress {
        let bar = ProgressBar::new(total);
        if let Ok(style) = ProgressStyle::with_template(
            "{spinner} {prefix:>18} [{bar:30}] {pos}/{len} requests, {per_sec}, eta {eta}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut policies = Vec::new();
    for &policy in &config.policies {
        bar.set_prefix(policy.name());
        policies.push(run_policy(&config.settings, workload, policy, &bar).await?);
    }
    bar.finish_and_clear();
    Ok(SimReport {
        trace: workload.label.clone(),
        requests: workload.len() as u64,
        trace_seconds: workload.span_seconds(),
        settings: config.settings.clone(),
        policies,
    })
}

/// Engine batches waiting for their prefill to finish, keyed by (virtual
/// time, sequence) so they are published in time order.
type Pending = BTreeMap<(u64, u64), (usize, Vec<u8>)>;

/// Per-replica side of the server-backed policies.
struct Reporting {
    backend: Backend,
    mappings: Vec<ReplicaState>,
    pending: Pending,
    seq: u64,
    /// Virtual time of the next stats scrape.
    next_stats_us: u64,
}

fn replica_stats(
    id: &str,
    depth: usize,
    settings: &Settings,
    cached: u64,
    prompt: u64,
    blocks: usize,
) -> ReplicaStats {
    ReplicaStats {
        replica_id: id.to_owned(),
        // One block's KV for an 8B-class model (128 KiB per token) — only
        // shown in snapshots.
        cache_memory_bytes: (blocks * settings.block_size * 131_072) as i64,
        hit_rate: if prompt == 0 {
            0.0
        } else {
            (cached as f64 / prompt as f64) as f32
        },
        pressure: (depth as f32 / settings.max_queue as f32).min(1.0),
        client_version: concat!("inferencecache-simulator/", env!("CARGO_PKG_VERSION")).into(),
        ..Default::default()
    }
}

async fn run_policy(
    settings: &Settings,
    workload: &Workload,
    policy: PolicyKind,
    bar: &ProgressBar,
) -> Result<PolicyResult, SimError> {
    let started = Instant::now();
    let n = settings.replicas;
    let ids: Vec<String> = (0..n).map(|i| format!("sim-{i:02}")).collect();
    let index_of: HashMap<&str, usize> = ids
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str(), i))
        .collect();
    let mut replicas: Vec<Replica> = (0..n)
        .map(|_| Replica::new(settings.cache_blocks))
        .collect();
    let salts: Vec<u64> = (0..n as u64)
        .map(|i| 0xA5A5_0000_0000_0000 ^ (i * 0x9E37_79B9))
        .collect();
    let mut replica_tokens = vec![(0u64, 0u64); n];
    let mut reporting = if policy.uses_server() {
        let mapping = MappingConfig {
            max_tracked_blocks: DEFAULT_MAX_TRACKED_BLOCKS.max(settings.cache_blocks * 2),
            ..MappingConfig::default()
        };
        Some(Reporting {
            backend: Backend::start(settings, policy, &ids).await?,
            mappings: (0..n)
                .map(|_| ReplicaState::new(mapping.clone(), DecodeOptions::default()))
                .collect(),
            pending: Pending::new(),
            seq: 0,
            next_stats_us: 0,
        })
    } else {
        None
    };
    let mut cursor = Cursor::default();
    let mut records = Vec::with_capacity(workload.len());
    let mut depth = vec![0usize; n];
    for (i, req) in workload.requests.iter().enumerate() {
        let now = workload.arrivals_us[i];
        let chain = &workload.chains[i];
        // Scrapes read queue depths at their own instants: before `now`'s.
        if let Some(rep) = reporting.as_mut() {
            publish_due(rep, now, &ids, settings, &replica_tokens, &mut replicas).await?;
        }
        for (r, replica) in replicas.iter_mut().enumerate() {
            depth[r] = replica.queue_depth(now);
        }
        let mut reason = None;
        let mut lookup_us = None;
        let chosen = match policy {
            PolicyKind::RoundRobin => cursor.next(n),
            PolicyKind::LeastLoaded => cursor.best_by(n, |r| depth[r]),
            PolicyKind::Oracle => {
                let cached: Vec<usize> = replicas
                    .iter()
                    .map(|r| r.cache().cached_prefix(chain))
                    .collect();
                let routed: Vec<u64> = replicas.iter().map(Replica::requests).collect();
                oracle_pick(&mut cursor, &cached, &depth, &routed, settings.max_queue)
            }
            PolicyKind::Hints
            | PolicyKind::HintsContract
            | PolicyKind::HintsApprox
            | PolicyKind::HintsNoAffinity => {
                let rep = reporting
                    .as_mut()
                    .ok_or_else(|| SimError::Config("hint policy without a backend".into()))?;
                rep.backend.set_time(now);
                let lookup = rep
                    .backend
                    .lookup(
                        || workload.tokens.prompt(req),
                        chain,
                        settings.block_size,
                        &ids,
                    )
                    .await;
                reason = Some(lookup.reason);
                lookup_us = Some(lookup.latency_us);
                match index_of.get(lookup.replica_id.as_str()) {
                    Some(&r) => r,
                    None => cursor.next(n),
                }
            }
        };
        let placed = replicas[chosen].place(
            now,
            chain,
            req.input_length,
            req.output_length,
            settings.block_size,
            &settings.service,
        );
        replica_tokens[chosen].0 += u64::from(placed.cached_tokens);
        replica_tokens[chosen].1 += u64::from(req.input_length);
        if let Some(rep) = reporting.as_mut().filter(|_| policy.publishes_events()) {
            let payload = engine_batch(workload, i, chain, &placed, salts[chosen], settings);
            rep.seq += 1;
            // The sidecar forwards the batch after its window.
            let visible = placed.prefill_done_us + settings.event_delay_ms * 1_000;
            rep.pending.insert((visible, rep.seq), (chosen, payload));
        }
        records.push(RequestRecord {
            arrival_us: now,
            replica: chosen,
            prompt_tokens: req.input_length,
            cached_tokens: placed.cached_tokens,
            ttft_us: placed.ttft_us,
            reason,
            lookup_us,
        });
        bar.inc(1);
    }
    if let Some(rep) = reporting {
        rep.backend.finish(&ids).await?;
    }
    Ok(PolicyResult::from_records(
        policy.name(),
        &records,
        n,
        settings.buckets,
        started.elapsed().as_secs_f64(),
    ))
}

/// The vLLM batch a replica publishes when request `i`'s prefill finishes:
/// `BlockStored` for its new blocks (a suffix of the chain, chained onto the
/// last cached one) and `BlockRemoved` for what the LRU evicted.
fn engine_batch(
    workload: &Workload,
    i: usize,
    chain: &[u64],
    placed: &crate::engine::Placement,
    salt: u64,
    settings: &Settings,
) -> Vec<u8> {
    let req = &workload.requests[i];
    let mut events = Vec::new();
    let new = placed.cached_blocks..chain.len();
    if !new.is_empty() {
        let mut tokens = Vec::with_capacity(new.len() * settings.block_size);
        for &id in &req.hash_ids[new.clone()] {
            workload.tokens.extend_block(id, &mut tokens);
        }
        let hashes: Vec<u64> = chain[new.clone()]
            .iter()
            .map(|&h| engine_hash(salt, h))
            .collect();
        let parent = new
            .start
            .checked_sub(1)
            .map(|p| engine_hash(salt, chain[p]));
        events.push(block_stored(&hashes, parent, &tokens, settings.block_size));
    }
    if !placed.evicted.is_empty() {
        let hashes: Vec<u64> = placed
            .evicted
            .iter()
            .map(|&h| engine_hash(salt, h))
            .collect();
        events.push(block_removed(&hashes));
    }
    encode_batch(placed.prefill_done_us as f64 / 1e6, events)
}

/// Publishes, in time order, every engine batch visible by `now` and every
/// stats scrape due by then (all replicas, every `stats_interval_ms`, with
/// the queue depth at the scrape's instant).
async fn publish_due(
    rep: &mut Reporting,
    now: u64,
    ids: &[String],
    settings: &Settings,
    replica_tokens: &[(u64, u64)],
    replicas: &mut [Replica],
) -> Result<(), SimError> {
    let mut ops: Vec<Op> = Vec::new();
    let interval = settings.stats_interval_ms.max(1) * 1_000;
    loop {
        let tick = rep.next_stats_us;
        let event_due = rep
            .pending
            .first_key_value()
            .is_some_and(|(&(at, _), _)| at <= now && at <= tick);
        if event_due {
            let Some(((at, seq), (r, payload))) = rep.pending.pop_first() else {
                break;
            };
            let mut updates = Vec::new();
            rep.mappings[r].handle(
                &Delivery::Apply {
                    rank: 0,
                    seq,
                    payload: Bytes::from(payload),
                },
                &mut updates,
            );
            rep.backend.ops_for(&ids[r], at, updates, &mut ops);
        } else if tick <= now {
            let ts = rep.backend.timestamp_us(tick);
            for (r, id) in ids.iter().enumerate() {
                let depth = replicas[r].queue_depth(tick);
                let s = replica_stats(
                    id,
                    depth,
                    settings,
                    replica_tokens[r].0,
                    replica_tokens[r].1,
                    replicas[r].cache().len(),
                );
                ops.push(Op::Report(rep.backend.update(id, ts, Vec::new(), Some(&s))));
            }
            rep.next_stats_us += interval;
        } else {
            break;
        }
    }
    rep.backend.send(ops).await
}

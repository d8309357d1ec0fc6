//! One replica's state across its data-parallel ranks: turns transport
//! [`Delivery`] values into server [`Update`]s.
//!
//! Each rank is its own engine core with its own cache and hash space, so each
//! gets its own [`Mapping`]. The server knows replicas, not ranks: an
//! `ALL_CLEARED` caused by one rank (engine restart or `AllBlocksCleared`)
//! wipes the whole replica there, so the other ranks' blocks are re-reported
//! right after it.

use std::collections::BTreeMap;

use crate::decode::{DecodeError, DecodeOptions, decode_batch_with};
use crate::event::EngineEvent;
use crate::mapping::{Mapping, MappingConfig, PrefixReport, Update};
use crate::transport::Delivery;

/// Counters for `/metrics` beyond the per-rank [`MappingStats`](crate::MappingStats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// Batches decoded.
    pub batches: u64,
    /// Events that failed to decode (each skipped; the batch went on).
    pub bad_events: u64,
    /// Payloads that failed to decode as a whole.
    pub bad_batches: u64,
    /// Events with an unknown tag, skipped.
    pub unknown_events: u64,
    /// Engine messages lost for good.
    pub lost_messages: u64,
    /// Engine restarts seen.
    pub engine_restarts: u64,
    /// `BlockStored` events decoded.
    pub stored_events: u64,
    /// `BlockRemoved` events decoded.
    pub removed_events: u64,
    /// `AllBlocksCleared` events decoded.
    pub cleared_events: u64,
}

/// Everything the event path of one replica remembers.
#[derive(Debug)]
pub struct ReplicaState {
    config: MappingConfig,
    decode: DecodeOptions,
    ranks: BTreeMap<u32, Mapping>,
    stats: ReplicaStats,
}

impl ReplicaState {
    /// `config` applies to each rank's map (so the memory bound is per rank).
    pub fn new(config: MappingConfig, decode: DecodeOptions) -> Self {
        Self {
            config,
            decode,
            ranks: BTreeMap::new(),
            stats: ReplicaStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> &ReplicaStats {
        &self.stats
    }

    /// Every rank's map, by rank.
    pub fn mappings(&self) -> impl Iterator<Item = (u32, &Mapping)> {
        self.ranks.iter().map(|(r, m)| (*r, m))
    }

    /// A rank's map, once it delivered anything.
    pub fn mapping(&self, rank: u32) -> Option<&Mapping> {
        self.ranks.get(&rank)
    }

    /// The engine's block size (the first rank that stored a block; 0 before).
    pub fn block_size(&self) -> u32 {
        self.ranks
            .values()
            .map(Mapping::block_size)
            .find(|&b| b > 0)
            .unwrap_or(0)
    }

    /// Every tracked block of every rank, e.g. to re-seed a restarted server.
    pub fn current_reports(&self) -> Vec<PrefixReport> {
        self.ranks
            .values()
            .flat_map(Mapping::current_reports)
            .collect()
    }

    /// Handles one delivery, appending what to send to `out` in order. Returns
    /// the batch timestamp (Unix seconds, 0 when unknown) for an applied batch.
    ///
    /// Every [`Update::AllCleared`] must be acknowledged by the server before
    /// anything after it is sent.
    pub fn handle(&mut self, delivery: &Delivery, out: &mut Vec<Update>) -> Option<f64> {
        let start = out.len();
        let (rank, ts) = match delivery {
            Delivery::Apply { rank, seq, payload } => {
                let batch = decode_batch_with(payload, self.decode);
                self.stats.batches += 1;
                self.stats.unknown_events += batch.unknown_events as u64;
                for ev in &batch.events {
                    match ev {
                        EngineEvent::BlockStored(_) => self.stats.stored_events += 1,
                        EngineEvent::BlockRemoved(_) => self.stats.removed_events += 1,
                        EngineEvent::AllBlocksCleared => self.stats.cleared_events += 1,
                    }
                }
                for e in &batch.errors {
                    match e {
                        DecodeError::Event { .. } => self.stats.bad_events += 1,
                        DecodeError::Msgpack(_) | DecodeError::Batch(_) => {
                            self.stats.bad_batches += 1
                        }
                    }
                }
                if let Some(first) = batch.errors.first() {
                    tracing::warn!(rank, seq, errors = batch.errors.len(), %first, "undecodable engine events skipped");
                }
                self.rank(*rank).apply_all(&batch.events, out);
                (*rank, Some(batch.ts))
            }
            Delivery::EngineRestarted { rank } => {
                self.stats.engine_restarts += 1;
                self.rank(*rank).reset();
                out.push(Update::AllCleared);
                (*rank, None)
            }
            Delivery::CaughtUp { rank } => {
                self.rank(*rank).drop_pending();
                (*rank, None)
            }
            Delivery::Lost { from, to, .. } => {
                self.stats.lost_messages += to.saturating_sub(*from) + 1;
                return None;
            }
        };
        if out[start..].contains(&Update::AllCleared) && self.ranks.len() > 1 {
            for (_, m) in self.ranks.iter().filter(|(r, _)| **r != rank) {
                out.extend(m.current_reports().map(Update::Report));
            }
        }
        ts
    }

    fn rank(&mut self, rank: u32) -> &mut Mapping {
        self.ranks
            .entry(rank)
            .or_insert_with(|| Mapping::new(self.config.clone()))
    }
}

//! Forwarding straight to the bus (`subscribe --nats-url`): the same replica
//! state and window compaction as the gRPC path, published to the stream
//! instead of sent to one server.
//!
//! The stream is one ordered log, so the gRPC path's ordering machinery
//! (closing the report stream before evictions, evictions in flight) is not
//! needed: a window's clear, reports and evictions are published in that
//! order, and every replica applies them in that order.
//!
//! **Resync.** At start (a previous sidecar of this replica may have left
//! entries behind) and whenever the producer says something may have been
//! lost (buffer overflow while the bus was down, a failed publish, a replica
//! that found a gap and asked on the control subject), the whole state is
//! re-published: `ALL_CLEARED`, then every tracked block.

use std::sync::Arc;

use inferencecache_bus::{Bus, BusConfig, BusMessage, Producer, ProducerLimits};
use tokio_util::sync::CancellationToken;

use super::{ForwardConfig, Inputs, Outbox};
use crate::error::SidecarError;
use crate::mapping::Update;
use crate::metrics::SidecarMetrics;
use crate::replica::ReplicaState;
use crate::stats::StatsSignal;

/// `--nats-url` settings of the sidecar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BusForward {
    /// Stream layout and URL.
    pub config: BusConfig,
    /// Buffer and in-flight bounds.
    pub limits: ProducerLimits,
}

struct Publisher<'a> {
    config: &'a ForwardConfig,
    producer: Producer,
    metrics: &'a SidecarMetrics,
}

impl Publisher<'_> {
    fn send(&self, m: BusMessage) {
        if !self.producer.try_send(m) {
            // Counted by the producer too; a resync follows.
            self.metrics.send_overflow.inc();
        }
    }

    fn flush(&self, outbox: &mut Outbox) {
        if outbox.is_empty() {
            return;
        }
        let f = outbox.take();
        let id = &self.config.identity;
        if f.clear {
            self.send(BusMessage::Event(id.all_cleared()));
        }
        for chunk in f.reports.chunks(self.config.max_batch.max(1)) {
            self.send(BusMessage::Update(id.update(chunk)));
        }
        for e in &f.evicts {
            self.send(BusMessage::Event(id.evicted(e)));
        }
    }

    /// `ALL_CLEARED`, then every tracked block (none while `withdrawn`:
    /// the engine's metrics are dead, see [`crate::stats`]).
    fn resync(&self, state: &ReplicaState, outbox: &mut Outbox, withdrawn: bool) {
        outbox.discard();
        let id = &self.config.identity;
        self.send(BusMessage::Event(id.all_cleared()));
        let reports = if withdrawn {
            Vec::new()
        } else {
            state.current_reports()
        };
        for chunk in reports.chunks(self.config.max_batch.max(1)) {
            self.send(BusMessage::Update(id.update(chunk)));
        }
        self.metrics.resyncs.inc();
        tracing::info!(blocks = reports.len(), "bus: full state re-published");
    }
}

/// Runs the event path against the bus until `cancel` fires or every
/// transport is gone; the producer then drains its buffer (bounded).
pub async fn run(
    config: ForwardConfig,
    bus: BusForward,
    inputs: Inputs,
    metrics: Arc<SidecarMetrics>,
    cancel: CancellationToken,
) -> Result<(), SidecarError> {
    let b = Bus::connect(bus.config)
        .await
        .map_err(|e| SidecarError::Task(e.to_string()))?;
    let producer_stop = CancellationToken::new();
    let producer = Producer::start(b, bus.limits, producer_stop.clone());
    let mut resyncs = producer.resyncs();
    let Inputs {
        mut state,
        mut deliveries,
        mut stats,
        transports,
    } = inputs;
    let p = Publisher {
        config: &config,
        producer: producer.clone(),
        metrics: &metrics,
    };
    let mut outbox = Outbox::default();
    let mut updates: Vec<Update> = Vec::new();
    let mut tick = tokio::time::interval(config.window);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Whatever a previous sidecar of this replica left on the bus goes.
    p.resync(&state, &mut outbox, false);
    let mut withdrawn = false;
    loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => break,
            changed = resyncs.changed() => {
                if changed.is_err() {
                    break;
                }
                p.resync(&state, &mut outbox, withdrawn);
            }
            d = deliveries.recv() => {
                let Some(d) = d else { break };
                updates.clear();
                state.handle(&d, &mut updates);
                let (tracked, pending) = state.mappings().fold((0, 0), |(t, q), (_, m)| {
                    (t + m.tracked_blocks(), q + m.pending_blocks())
                });
                metrics.sync_totals(
                    state.stats(),
                    state.mappings().map(|(_, m)| m.stats()),
                    tracked,
                    pending,
                );
                // Removals leave at once (a stale block is a false hint);
                // stores wait for the window.
                let urgent = super::has_removal(&updates);
                if withdrawn {
                    // The engine's return resyncs the state instead.
                    continue;
                }
                outbox.push_all(updates.drain(..));
                if urgent || outbox.len() >= config.max_batch {
                    p.flush(&mut outbox);
                }
            }
            _ = tick.tick() => {
                metrics.sync_transports(&transports);
                metrics.set_server_up(producer.is_connected());
                p.flush(&mut outbox);
            }
            Some(signal) = stats.recv() => match signal {
                StatsSignal::EngineDown => {
                    if !withdrawn {
                        withdrawn = true;
                        outbox.discard();
                        outbox.push(Update::AllCleared);
                        p.flush(&mut outbox);
                    }
                }
                StatsSignal::Sample(s) => {
                    if withdrawn {
                        withdrawn = false;
                        p.resync(&state, &mut outbox, false);
                    }
                    p.send(BusMessage::Update(config.identity.stats_update(&s)));
                }
            },
        }
    }
    p.flush(&mut outbox);
    producer_stop.cancel();
    producer.finished().await;
    metrics.set_server_up(false);
    Ok(())
}

//! Evictions waiting for their `PublishEvent`, and the calls in flight.
//!
//! The contract allows one eviction per call, so a full cache's churn means
//! tens of thousands of unary calls per second. They run in the background
//! of the event loop, which goes on decoding engine events and streaming
//! reports meanwhile; a window's flush only enqueues its evictions. That
//! keeps the calls pipelined back to back (a blocking flush left the
//! pipeline idle while the loop decoded the next window) and keeps reports
//! from queueing behind evictions of other keys.
//!
//! Ordering per key is kept by the caller ([`super::Forwarder`]): evictions
//! are enqueued only after every earlier report was acknowledged, and a
//! report of a key whose eviction is still here either takes that eviction
//! back (not sent yet: the re-store supersedes it) or waits for its call to
//! end (in flight).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::link::ServerLink;
use super::outbox::Key;
use super::{Identity, SendFailed};
use crate::mapping::PrefixEviction;
use crate::metrics::SidecarMetrics;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;

type Call = BoxFuture<'static, (Key, Result<(), SendFailed>)>;

pub(super) struct Evictions {
    client: ServerLink,
    identity: Identity,
    timeout: Duration,
    max_in_flight: usize,
    metrics: Arc<SidecarMetrics>,
    /// Send order. A key taken back stays here until popped; `waiting` is
    /// the truth.
    order: VecDeque<Key>,
    /// Each with when its engine batch reached the event loop.
    waiting: HashMap<Key, (PrefixEviction, Instant)>,
    in_flight: HashSet<Key>,
    calls: FuturesUnordered<Call>,
}

impl Evictions {
    pub(super) fn new(
        client: ServerLink,
        identity: Identity,
        timeout: Duration,
        max_in_flight: usize,
        metrics: Arc<SidecarMetrics>,
    ) -> Self {
        Self {
            client,
            identity,
            timeout,
            max_in_flight: max_in_flight.max(1),
            metrics,
            order: VecDeque::new(),
            waiting: HashMap::new(),
            in_flight: HashSet::new(),
            calls: FuturesUnordered::new(),
        }
    }

    /// Evictions not acknowledged yet (waiting or in flight).
    pub(super) fn backlog(&self) -> usize {
        self.waiting.len() + self.in_flight.len()
    }

    /// Queues evictions (their engine batch arrived at `received`) and
    /// starts calls up to the in-flight limit.
    pub(super) fn extend(
        &mut self,
        evicts: impl IntoIterator<Item = PrefixEviction>,
        received: Instant,
    ) {
        for e in evicts {
            let key = (e.prefix_hash, e.adapter.clone());
            if self.waiting.insert(key.clone(), (e, received)).is_none() {
                self.order.push_back(key);
            }
        }
        self.resume();
    }

    /// Starts calls up to the in-flight limit (after a drain, which starts
    /// none).
    pub(super) fn resume(&mut self) {
        self.fill();
        self.sync_gauge();
    }

    /// The backlog gauge follows every change of the backlog: a clear or a
    /// drain can leave nothing in flight whose completion would refresh it.
    fn sync_gauge(&self) {
        self.metrics.eviction_backlog.set(self.backlog() as i64);
    }

    /// A report of `key` is about to be sent. Drops its eviction if it is
    /// still waiting (the re-store supersedes it); returns whether one is in
    /// flight, which the report must wait for.
    pub(super) fn supersede(&mut self, key: &Key) -> bool {
        if self.waiting.remove(key).is_some() {
            self.metrics.evictions_superseded.inc();
            self.sync_gauge();
        }
        self.in_flight.contains(key)
    }

    /// Drops every waiting eviction (an `ALL_CLEARED` supersedes them).
    pub(super) fn supersede_all(&mut self) {
        self.metrics
            .evictions_superseded
            .inc_by(self.waiting.len() as u64);
        self.waiting.clear();
        self.order.clear();
        // Nothing may be in flight to refresh the gauge later.
        self.sync_gauge();
    }

    /// Forgets everything, calls in flight included; returns how many
    /// evictions were dropped (a resync repairs them).
    pub(super) fn discard(&mut self) -> u64 {
        let n = self.backlog() as u64;
        self.order.clear();
        self.waiting.clear();
        self.in_flight.clear();
        self.calls = FuturesUnordered::new();
        self.metrics.eviction_backlog.set(0);
        n
    }

    /// The next call to end, then refills; never resolves with none in
    /// flight (so it can sit in a `select!`).
    pub(super) async fn next(&mut self) -> Result<(), SendFailed> {
        let Some((key, result)) = self.calls.next().await else {
            return std::future::pending().await;
        };
        self.in_flight.remove(&key);
        result?;
        self.resume();
        Ok(())
    }

    /// Waits for every call in flight, starting no new ones.
    pub(super) async fn drain_in_flight(&mut self) -> Result<(), SendFailed> {
        while let Some((key, result)) = self.calls.next().await {
            self.in_flight.remove(&key);
            self.sync_gauge();
            result?;
        }
        Ok(())
    }

    /// Waits until nothing is left (shutdown).
    pub(super) async fn drain_all(&mut self) -> Result<(), SendFailed> {
        while self.backlog() > 0 {
            self.fill();
            self.drain_in_flight().await?;
        }
        Ok(())
    }

    fn fill(&mut self) {
        while self.calls.len() < self.max_in_flight {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            let Some((e, received)) = self.waiting.remove(&key) else {
                continue;
            };
            self.in_flight.insert(key.clone());
            let ev = self.identity.evicted(&e);
            let (call, timeout) = (self.client.publish_event(ev), self.timeout);
            let metrics = Arc::clone(&self.metrics);
            self.calls.push(Box::pin(async move {
                let started = Instant::now();
                let result =
                    super::check_ack("PublishEvent", tokio::time::timeout(timeout, call).await);
                if result.is_ok() {
                    metrics.record_sent("PublishEvent", started);
                    // Acknowledged = applied: lookups no longer see it.
                    metrics
                        .eviction_visible
                        .observe(received.elapsed().as_secs_f64());
                }
                (key, result)
            }));
        }
    }
}

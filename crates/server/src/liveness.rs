//! Producers that went silent: their replicas stop getting hints.
//!
//! A sidecar that says its engine's block size (`CacheStateUpdate.block_size`,
//! our extension) also promises a message at least every 2 s
//! (`inferencecache subscribe` sends an empty update when it has had nothing
//! else to say for that long). A replica whose
//! such producer has said nothing for `--producer-silence` is withdrawn: the
//! server applies `ALL_CLEARED` for it itself, counts and logs it. Its next
//! report is refused with UNAVAILABLE so the producer reconnects and
//! re-reports its full state (the sidecar's resync) instead of adding to an
//! empty replica. Producers that never say a block size (the reference's
//! sidecar) send no heartbeats and are never withdrawn for silence.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default `--producer-silence`: five sidecar heartbeats (2 s each).
pub(crate) const DEFAULT_PRODUCER_SILENCE: Duration = Duration::from_secs(10);

/// The liveness metrics.
#[derive(Debug, Clone, Default)]
pub struct LivenessMetrics {
    /// Replicas withdrawn because their producer went silent.
    pub withdrawn: Counter,
}

impl LivenessMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "inferencecache_silent_producer_withdrawals",
            "Replicas whose heartbeating producer said nothing for --producer-silence, withdrawn (ALL_CLEARED) until it re-reports",
            m.withdrawn.clone(),
        );
        m
    }
}

/// A replica's producer, as a scope key.
pub(crate) type ReplicaKey = (String, String, String);

#[derive(Debug)]
struct Seen {
    last: Instant,
    withdrawn: bool,
}

/// Last word from each heartbeating producer. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub(crate) struct ProducerLiveness {
    silence: Option<Duration>,
    seen: Arc<Mutex<HashMap<ReplicaKey, Seen>>>,
    metrics: LivenessMetrics,
}

impl ProducerLiveness {
    /// `silence`: how long a heartbeating producer may say nothing; `None`
    /// never withdraws.
    pub(crate) fn new(silence: Option<Duration>, metrics: LivenessMetrics) -> Self {
        Self {
            silence,
            seen: Arc::default(),
            metrics,
        }
    }

    /// Records a report from (`tenant`, `model`, `replica`); `heartbeats`
    /// when its producer promises them. True when the replica was withdrawn
    /// for silence: the caller refuses the report so the producer resyncs.
    pub(crate) fn report(
        &self,
        tenant: &str,
        model: &str,
        replica: &str,
        heartbeats: bool,
    ) -> bool {
        if self.silence.is_none() {
            return false;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let key = (tenant.to_owned(), model.to_owned(), replica.to_owned());
        match seen.get_mut(&key) {
            Some(s) => {
                s.last = Instant::now();
                std::mem::take(&mut s.withdrawn)
            }
            None if heartbeats => {
                seen.insert(
                    key,
                    Seen {
                        last: Instant::now(),
                        withdrawn: false,
                    },
                );
                false
            }
            None => false,
        }
    }

    /// Replicas silent past the limit and not yet withdrawn; each is marked
    /// withdrawn, counted and logged, and the caller clears it.
    pub(crate) fn newly_silent(&self, now: Instant) -> Vec<ReplicaKey> {
        let Some(silence) = self.silence else {
            return Vec::new();
        };
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for (key, s) in seen.iter_mut() {
            if !s.withdrawn && now.saturating_duration_since(s.last) > silence {
                s.withdrawn = true;
                self.metrics.withdrawn.inc();
                tracing::warn!(
                    tenant_id = %key.0,
                    model = %key.1,
                    replica_id = %key.2,
                    silent_ms = now.saturating_duration_since(s.last).as_millis() as u64,
                    "producer silent past --producer-silence: the replica's blocks are withdrawn until it reconnects and re-reports"
                );
                out.push(key.clone());
            }
        }
        // A producer gone for good is forgotten after ten silences.
        seen.retain(|_, s| now.saturating_duration_since(s.last) < silence * 10);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_heartbeating_producers_are_withdrawn_once_then_resync() {
        let l = ProducerLiveness::new(Some(Duration::from_millis(10)), LivenessMetrics::default());
        assert!(!l.report("t", "m", "a", true));
        assert!(!l.report("t", "m", "ref", false));
        let later = Instant::now() + Duration::from_millis(50);
        assert_eq!(
            l.newly_silent(later),
            vec![("t".into(), "m".into(), "a".into())]
        );
        assert!(l.newly_silent(later).is_empty(), "withdrawn once");
        assert!(l.report("t", "m", "a", true), "its next report must resync");
        assert!(!l.report("t", "m", "a", true));
        let off = ProducerLiveness::new(None, LivenessMetrics::default());
        assert!(!off.report("t", "m", "a", true));
        assert!(off.newly_silent(later).is_empty());
    }
}

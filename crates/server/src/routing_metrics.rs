//! Metrics of the estimated-TTFT ranking and of approximate mode (additive
//! to the contract's metric set).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// A single `event` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabel {
    /// What happened.
    pub event: String,
}

/// A single `ranking` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RankingLabel {
    /// `ttft` or `contract`.
    pub ranking: String,
}

/// The routing metrics.
#[derive(Debug, Clone, Default)]
pub struct RoutingMetrics {
    /// Tentative holding lifecycle: stored, confirmed (replaced by a real
    /// report), removed (with a real removal or clear), expired, dropped (at
    /// the overlay's bound).
    pub tentative_events: Family<EventLabel, Counter>,
    /// LookupRoute calls by the ranking that answered them.
    pub rankings: Family<RankingLabel, Counter>,
    /// Hints delivered by the estimated-TTFT ranking (they feed the
    /// delivered-hint window).
    pub delivered_hints: Counter,
}

impl RoutingMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "inferencecache_tentative_holding_events",
            "Tentative holdings by event (stored|confirmed|removed|expired|dropped)",
            m.tentative_events.clone(),
        );
        registry.register(
            "inferencecache_lookup_route_rankings",
            "LookupRoute calls by the ranking that answered them (ttft|contract)",
            m.rankings.clone(),
        );
        registry.register(
            "inferencecache_delivered_hints",
            "Hints delivered by the estimated-TTFT ranking (the delivered-hint window's input)",
            m.delivered_hints.clone(),
        );
        m
    }

    /// Adds `n` tentative-holding events (nothing for 0).
    pub fn tentative(&self, event: &str, n: u64) {
        if n > 0 {
            self.tentative_events
                .get_or_create(&EventLabel {
                    event: event.to_owned(),
                })
                .inc_by(n);
        }
    }

    /// Counts one lookup answered by `ranking`.
    pub fn ranked(&self, ranking: &str) {
        self.rankings
            .get_or_create(&RankingLabel {
                ranking: ranking.to_owned(),
            })
            .inc();
    }
}

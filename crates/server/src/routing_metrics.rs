//! Metrics of the estimated-TTFT ranking and of approximate mode (additive
//! to the contract's metric set).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use std::sync::{Arc, OnceLock};

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
    /// Delivered hints whose request another replica was seen to store
    /// (its caller sent it elsewhere): the eviction foresight moved it
    /// (`crate::foresight`).
    pub foresight_moved: Counter,
    /// The series the lookup path counts on every call, resolved on first
    /// use: a `Family` lookup builds a `String` label and takes the
    /// family's lock, which a lookup should not pay (issue 36). Created on
    /// first use, as `get_or_create` did, so a scrape shows the same series.
    hot: Arc<HotSeries>,
}

/// Handles of the per-lookup series (see [`RoutingMetrics`]).
#[derive(Debug, Default)]
struct HotSeries {
    /// `rankings{ranking="contract"}`, `{ranking="ttft"}`.
    ranked: [OnceLock<Counter>; 2],
    /// `tentative_events{event="stored"}`, `{event="dropped"}`.
    stored: OnceLock<Counter>,
    dropped: OnceLock<Counter>,
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
        registry.register(
            "inferencecache_foresight_moved",
            "Hinted requests another replica stored (sent elsewhere than hinted), moved there in the eviction foresight",
            m.foresight_moved.clone(),
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
        let slot = match ranking {
            "contract" => &self.hot.ranked[0],
            "ttft" => &self.hot.ranked[1],
            _ => {
                self.rankings
                    .get_or_create(&RankingLabel {
                        ranking: ranking.to_owned(),
                    })
                    .inc();
                return;
            }
        };
        slot.get_or_init(|| {
            self.rankings
                .get_or_create(&RankingLabel {
                    ranking: ranking.to_owned(),
                })
                .clone()
        })
        .inc();
    }

    /// [`Self::tentative`] for the lookup path's two events (`stored`,
    /// `dropped`), through handles resolved once.
    pub fn delivered(&self, stored: u64, dropped: u64) {
        for (n, slot, event) in [
            (stored, &self.hot.stored, "stored"),
            (dropped, &self.hot.dropped, "dropped"),
        ] {
            if n > 0 {
                slot.get_or_init(|| {
                    self.tentative_events
                        .get_or_create(&EventLabel {
                            event: event.to_owned(),
                        })
                        .clone()
                })
                .inc_by(n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hot_handles_count_into_the_same_series_and_create_them_on_first_use() {
        let mut registry = Registry::default();
        let m = RoutingMetrics::register(&mut registry);
        let scrape = |r: &Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, r).unwrap();
            out
        };
        m.delivered(0, 0);
        assert!(!scrape(&registry).contains("event=\"stored\""));
        m.ranked("ttft");
        m.ranked("ttft");
        m.delivered(3, 0);
        m.tentative("stored", 2);
        m.delivered(0, 1);
        let text = scrape(&registry);
        assert!(
            text.contains("inferencecache_lookup_route_rankings_total{ranking=\"ttft\"} 2"),
            "{text}"
        );
        assert!(!text.contains("ranking=\"contract\""), "{text}");
        assert!(
            text.contains("inferencecache_tentative_holding_events_total{event=\"stored\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("inferencecache_tentative_holding_events_total{event=\"dropped\"} 1"),
            "{text}"
        );
    }
}

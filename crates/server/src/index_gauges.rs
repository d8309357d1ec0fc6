//! The index's size gauges, read from the index when `/metrics` (or
//! StreamMetrics) is scraped rather than recomputed after every ingest,
//! sweep and delivered hint: ingest and lookups pay nothing for them, and a
//! scrape always sees the index as it is.
//!
//! The collector is registered with the metrics before the index exists and
//! bound to it once the core builds it; it holds the index weakly, so
//! metrics outliving their core (tests do this) encode nothing for it.

use inferencecache_index::Index;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;
use std::sync::{Arc, OnceLock, Weak};

/// `inferencecache_index_entries{model}`, `inferencecache_index_replica_entries`,
/// `inferencecache_index_replicas` and `inferencecache_tentative_holdings`.
#[derive(Debug, Default)]
pub struct IndexGauges {
    index: OnceLock<Weak<Index>>,
}

fn gauge(n: u64) -> ConstGauge {
    ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX))
}

impl IndexGauges {
    /// Reads `index` from now on (the first binding wins).
    pub fn bind(&self, index: &Arc<Index>) {
        let _ = self.index.set(Arc::downgrade(index));
    }

    /// Replica x prefix entries held (what the status page shows), 0 before
    /// binding.
    pub fn replica_entries(&self) -> i64 {
        self.bound()
            .map_or(0, |i| i64::try_from(i.total_entries()).unwrap_or(i64::MAX))
    }

    fn bound(&self) -> Option<Arc<Index>> {
        self.index.get()?.upgrade()
    }
}

impl Collector for IndexGauges {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(index) = self.bound() else {
            return Ok(());
        };
        // Help strings end with the period the registry adds to registered
        // metrics, so the exposition reads the same as before.
        {
            let mut family = encoder.encode_descriptor(
                "inferencecache_index_entries",
                "Distinct prefix entries currently held in the cache index, per model.",
                None,
                MetricType::Gauge,
            )?;
            let mut result = Ok(());
            // A model that held entries keeps a series (at 0) after it empties.
            index.report_entry_counts(|model, n| {
                if result.is_ok() {
                    result = family
                        .encode_family(&[("model", &**model)])
                        .and_then(|m| gauge(n).encode(m));
                }
            });
            result?;
        }
        let singles = [
            (
                "inferencecache_index_replica_entries",
                "Replica x prefix entries held in the index (the unit of the global cap).",
                index.total_entries(),
            ),
            (
                "inferencecache_index_replicas",
                "Distinct replica ids the index holds (entries, stats, or reported since the last sweep).",
                index.live_replicas() as u64,
            ),
            (
                "inferencecache_tentative_holdings",
                "Tentative (approximate-mode) replica x prefix holdings stored, not counted in the index entries.",
                index.tentative_entries(),
            ),
        ];
        for (name, help, n) in singles {
            let g = gauge(n);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        Ok(())
    }
}

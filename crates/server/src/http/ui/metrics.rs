//! Metrics of the status page's live feed (`/ui/events`). Registered in the
//! server's registry at startup (with the other edge families, through
//! [`crate::metrics::Metrics::with_subsystems`]) so they appear on the public
//! `/metrics`; the HTTP state keeps the handle.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Live-feed metrics.
#[derive(Debug, Default)]
pub(crate) struct UiMetrics {
    /// Open `/ui/events` streams.
    pub clients: Gauge,
    /// Index-change events not delivered to a `/ui/events` client because
    /// its buffer was full (a slow or stalled browser).
    pub dropped: Counter,
}

impl UiMetrics {
    /// Creates the metrics and registers them.
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "inferencecache_ui_event_clients",
            "Open /ui/events streams (status-page live feeds)",
            m.clients.clone(),
        );
        registry.register(
            "inferencecache_ui_events_dropped",
            "Index-change events dropped for a /ui/events client whose per-client buffer was full",
            m.dropped.clone(),
        );
        m
    }
}

//! Metrics of the template and PD-topology stores and of the two RPCs they
//! serve (RenderTemplate, LookupPDRoute). Registered by [`crate::metrics::Metrics`].

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of `inferencecache_policy_updates_total` and of the template and
/// topology update counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyUpdateLabels {
    /// "http" (a push) or "file" (a file or directory flag).
    pub source: String,
    /// "applied" or "rejected".
    pub result: String,
}

/// A single `reason_code` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonCodeLabel {
    /// The response's reason code.
    pub reason_code: String,
}

/// Template and PD-topology metrics.
#[derive(Debug, Default)]
pub struct StoreMetrics {
    /// RenderTemplate calls by reason code.
    pub render_template_calls: Family<ReasonCodeLabel, Counter>,
    /// LookupPDRoute calls by reason code.
    pub lookup_pd_route_calls: Family<ReasonCodeLabel, Counter>,
    /// Templates in force.
    pub templates: Gauge,
    /// Template pushes and directory reloads by source and result.
    pub template_updates: Family<PolicyUpdateLabels, Counter>,
    /// PD topologies in force.
    pub pd_topologies: Gauge,
    /// Topology pushes and file reloads by source and result.
    pub pd_topology_updates: Family<PolicyUpdateLabels, Counter>,
}

fn bump(family: &Family<ReasonCodeLabel, Counter>, reason_code: &str) {
    family
        .get_or_create(&ReasonCodeLabel {
            reason_code: reason_code.to_owned(),
        })
        .inc();
}

fn update(family: &Family<PolicyUpdateLabels, Counter>, source: &str, result: &str) {
    family
        .get_or_create(&PolicyUpdateLabels {
            source: source.to_owned(),
            result: result.to_owned(),
        })
        .inc();
}

fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl StoreMetrics {
    /// Creates and registers the metrics.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        registry.register(
            "inferencecache_render_template_calls",
            "RenderTemplate calls by reason_code (OK|TEMPLATE_NOT_FOUND|RENDER_ERROR)",
            m.render_template_calls.clone(),
        );
        registry.register(
            "inferencecache_lookup_pd_route_calls",
            "LookupPDRoute calls by reason_code (PREFIX_MATCH|AFFINITY_HINT|NO_HINT)",
            m.lookup_pd_route_calls.clone(),
        );
        registry.register(
            "inferencecache_templates",
            "Prompt templates in force",
            m.templates.clone(),
        );
        registry.register(
            "inferencecache_template_updates",
            "Template pushes (/templates) and --templates-dir reloads, by source (http|file) and result (applied|rejected)",
            m.template_updates.clone(),
        );
        registry.register(
            "inferencecache_pd_topologies",
            "Prefill/decode topologies in force",
            m.pd_topologies.clone(),
        );
        registry.register(
            "inferencecache_pd_topology_updates",
            "Topology pushes (/pd-topologies) and --pd-topology-file reloads, by source (http|file) and result (applied|rejected)",
            m.pd_topology_updates.clone(),
        );
        m
    }

    /// One RenderTemplate answer.
    pub fn render_template_call(&self, reason_code: &str) {
        bump(&self.render_template_calls, reason_code);
    }

    /// One LookupPDRoute answer.
    pub fn lookup_pd_route_call(&self, reason_code: &str) {
        bump(&self.lookup_pd_route_calls, reason_code);
    }

    /// A template set of `n` put in force.
    pub fn templates_applied(&self, source: &str, n: usize) {
        self.templates.set(count(n));
        update(&self.template_updates, source, "applied");
    }

    /// A refused template push or reload.
    pub fn templates_rejected(&self, source: &str) {
        update(&self.template_updates, source, "rejected");
    }

    /// A topology set of `n` put in force.
    pub fn pd_topologies_applied(&self, source: &str, n: usize) {
        self.pd_topologies.set(count(n));
        update(&self.pd_topology_updates, source, "applied");
    }

    /// A refused topology push or reload.
    pub fn pd_topologies_rejected(&self, source: &str) {
        update(&self.pd_topology_updates, source, "rejected");
    }
}

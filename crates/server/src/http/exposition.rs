//! `/metrics` content negotiation. prometheus-client writes both formats from
//! the one registry: the classic Prometheus text format 0.0.4 (what
//! `promtool check metrics`, older scrapers and Go clients expect, and the
//! default) and OpenMetrics for scrapers that ask for it.

/// Media type of the classic text format.
pub(crate) const TEXT_CONTENT_TYPE: &str =
    prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
/// Media type of the OpenMetrics text format.
pub(crate) const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// True when the `Accept` header asks for OpenMetrics.
pub(crate) fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation() {
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(None));
    }
}

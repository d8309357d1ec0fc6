//! Conversion of the OpenMetrics text that prometheus-client writes into the
//! classic Prometheus text format 0.0.4, which `promtool check metrics`, older
//! scrapers and Go clients expect.
//!
//! The two differ only in metadata for our metric types: OpenMetrics names a
//! counter family without `_total` (its samples carry it), adds `# UNIT` lines
//! and ends with `# EOF`. Samples are identical.

/// Media type of the classic text format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Media type of the OpenMetrics text format.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Rewrites an OpenMetrics exposition as classic text.
pub fn openmetrics_to_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut counter_families: Vec<&str> = Vec::new();
    // TYPE follows HELP in OpenMetrics output, so find counter families first.
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counter_families.push(name);
            }
        }
    }
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = line
            .strip_prefix("# HELP ")
            .map(|r| ("# HELP ", r))
            .or_else(|| line.strip_prefix("# TYPE ").map(|r| ("# TYPE ", r)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(prefix);
                out.push_str(name);
                if counter_families.contains(&name) {
                    out.push_str("_total");
                }
                out.push(' ');
                out.push_str(tail);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// True when the `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gain_total_in_metadata_and_eof_goes() {
        let om = "# HELP c Calls.\n# TYPE c counter\nc_total{a=\"b\"} 1\n\
                  # HELP g Up.\n# TYPE g gauge\ng 1\n\
                  # HELP h_seconds Lat.\n# TYPE h_seconds histogram\n# UNIT h_seconds seconds\n\
                  h_seconds_sum 0.0\n# EOF\n";
        let text = openmetrics_to_text(om);
        assert_eq!(
            text,
            "# HELP c_total Calls.\n# TYPE c_total counter\nc_total{a=\"b\"} 1\n\
             # HELP g Up.\n# TYPE g gauge\ng 1\n\
             # HELP h_seconds Lat.\n# TYPE h_seconds histogram\nh_seconds_sum 0.0\n"
        );
    }

    #[test]
    fn accept_negotiation() {
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,text/plain;q=0.5"
        )));
        assert!(!wants_openmetrics(Some("text/plain")));
        assert!(!wants_openmetrics(None));
    }
}

//! Metric samples for StreamMetrics, taken from the same registry `/metrics`
//! encodes, as prometheus-client's typed metric families: nothing is printed
//! and parsed back, and the stream and `/metrics` cannot disagree.
//!
//! A family becomes the samples its classic text exposition shows: one per
//! counter or gauge series, and `_bucket` (with `le`), `_sum` and `_count`
//! per histogram series.

use prometheus_client::encoding::prometheus_protobuf::prometheus_data_model::{
    Metric as Series, MetricFamily, MetricType,
};
use std::collections::HashMap;

/// One sample, in the wire `Metric`'s shape.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Sample name (`_bucket`/`_sum`/`_count` suffixed for histograms).
    pub name: String,
    /// `counter`, `gauge`, `histogram` or `untyped`.
    pub kind: &'static str,
    /// Labels, `le` included for buckets.
    pub labels: HashMap<String, String>,
    /// Value.
    pub value: f64,
}

/// The samples of `families` whose family or sample name is in `names`
/// (all when empty).
pub(crate) fn samples(families: &[MetricFamily], names: &[String]) -> Vec<Sample> {
    let mut out = Vec::new();
    for family in families {
        let wanted = |sample: &str| {
            names.is_empty() || names.iter().any(|n| n == sample || *n == family.name)
        };
        let kind = kind_name(family.r#type);
        for series in &family.metric {
            push_series(&mut out, family, kind, series, &wanted);
        }
    }
    out
}

fn kind_name(t: i32) -> &'static str {
    match MetricType::try_from(t) {
        Ok(MetricType::Counter) => "counter",
        Ok(MetricType::Gauge) => "gauge",
        Ok(MetricType::Histogram) => "histogram",
        Ok(MetricType::Summary) => "summary",
        _ => "untyped",
    }
}

fn push_series(
    out: &mut Vec<Sample>,
    family: &MetricFamily,
    kind: &'static str,
    series: &Series,
    wanted: &dyn Fn(&str) -> bool,
) {
    let labels = || -> HashMap<String, String> {
        series
            .label
            .iter()
            .map(|l| (l.name.clone(), l.value.clone()))
            .collect()
    };
    let mut push = |name: String, labels: HashMap<String, String>, value: f64| {
        if wanted(&name) {
            out.push(Sample {
                name,
                kind,
                labels,
                value,
            });
        }
    };
    if let Some(h) = &series.histogram {
        for bucket in &h.bucket {
            let mut l = labels();
            l.insert("le".to_owned(), go_float(bucket.upper_bound));
            push(
                format!("{}_bucket", family.name),
                l,
                bucket.cumulative_count as f64,
            );
        }
        push(format!("{}_sum", family.name), labels(), h.sample_sum);
        push(
            format!("{}_count", family.name),
            labels(),
            h.sample_count as f64,
        );
        return;
    }
    let value = series
        .counter
        .as_ref()
        .map(|c| c.value)
        .or_else(|| series.gauge.as_ref().map(|g| g.value))
        .or_else(|| series.untyped.as_ref().map(|u| u.value));
    if let Some(v) = value {
        push(family.name.clone(), labels(), v);
    }
}

/// A bucket bound as the classic exposition writes it (Go's
/// `strconv.FormatFloat(v, 'g', -1, 64)`): `+Inf`, plain digits between
/// 1e-4 and 1e21, else a two-digit-minimum exponent.
fn go_float(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    if v.is_nan() {
        return "NaN".to_owned();
    }
    let a = v.abs();
    if a == 0.0 || (1e-4..1e21).contains(&a) {
        return v.to_string();
    }
    let e = format!("{v:e}");
    let Some((mantissa, exp)) = e.split_once('e') else {
        return e;
    };
    let (sign, digits) = match exp.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exp),
    };
    format!("{mantissa}e{sign}{digits:0>2}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::prometheus_protobuf::encode;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Registry;

    fn registry() -> Registry {
        let mut r = Registry::default();
        let calls = Family::<Vec<(String, String)>, Counter>::default();
        calls
            .get_or_create(&vec![("model".into(), "m\"x".into())])
            .inc_by(3);
        r.register("a", "A", calls);
        let up = Gauge::<i64>::default();
        up.set(1);
        r.register("up", "Up", up);
        let h = Histogram::new([0.0001, 1.0]);
        h.observe(0.5);
        h.observe(7.0);
        r.register("h", "H", h);
        r
    }

    #[test]
    fn every_kind_becomes_its_classic_samples() {
        let all = samples(&encode(&registry()).unwrap(), &[]);
        let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "a_total", "up", "h_bucket", "h_bucket", "h_bucket", "h_sum", "h_count"
            ]
        );
        assert_eq!(all[0].kind, "counter");
        assert_eq!(all[0].labels["model"], "m\"x");
        assert_eq!(all[0].value, 3.0);
        assert_eq!(all[1].kind, "gauge");
        let les: Vec<&str> = all[2..5].iter().map(|s| s.labels["le"].as_str()).collect();
        assert_eq!(les, ["0.0001", "1", "+Inf"]);
        assert_eq!(all[3].value, 1.0);
        assert_eq!(all[4].value, 2.0);
        assert_eq!(all[5].value, 7.5);
        assert!(all[2..].iter().all(|s| s.kind == "histogram"));
    }

    #[test]
    fn filters_by_family_or_sample_name() {
        let fams = encode(&registry()).unwrap();
        assert_eq!(samples(&fams, &["up".into()]).len(), 1);
        assert_eq!(samples(&fams, &["h".into()]).len(), 5);
        assert_eq!(samples(&fams, &["h_sum".into()]).len(), 1);
        assert_eq!(samples(&fams, &["a_total".into()]).len(), 1);
        assert!(samples(&fams, &["nope".into()]).is_empty());
    }

    #[test]
    fn bounds_are_written_like_go() {
        assert_eq!(go_float(0.00025), "0.00025");
        assert_eq!(go_float(2.5), "2.5");
        assert_eq!(go_float(1e6), "1000000");
        assert_eq!(go_float(1e-5), "1e-05");
        assert_eq!(go_float(1e21), "1e+21");
        assert_eq!(go_float(f64::INFINITY), "+Inf");
    }
}

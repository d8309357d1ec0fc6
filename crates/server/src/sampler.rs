//! Metric samples for StreamMetrics, read back from the server's own
//! exposition so that the stream and `/metrics` can never disagree.

use inferencecache_proto::v1alpha1::Metric;
use std::collections::HashMap;

/// Parses the classic text exposition into samples, keeping those whose
/// family or sample name is in `names` (all when empty).
pub fn samples(text: &str, names: &[String], timestamp_us: i64) -> Vec<Metric> {
    let mut types: HashMap<&str, &str> = HashMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some((name, kind)) = rest.split_once(' ') {
                types.insert(name, kind);
            }
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let Some((name, labels, value)) = parse_sample(line) else {
            continue;
        };
        let family = family_of(name, &types);
        if !names.is_empty() && !names.iter().any(|n| n == name || n == family) {
            continue;
        }
        out.push(Metric {
            name: name.to_owned(),
            r#type: types.get(family).copied().unwrap_or("untyped").to_owned(),
            labels,
            value,
            timestamp_us,
        });
    }
    out
}

fn family_of<'a>(name: &'a str, types: &HashMap<&str, &str>) -> &'a str {
    if types.contains_key(name) {
        return name;
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types.contains_key(base) {
                return base;
            }
        }
    }
    name
}

fn parse_sample(line: &str) -> Option<(&str, HashMap<String, String>, f64)> {
    let (head, value) = line.rsplit_once(' ')?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let Some((name, rest)) = head.split_once('{') else {
        return Some((head, HashMap::new(), value));
    };
    let body = rest.strip_suffix('}')?;
    Some((name, parse_labels(body)?, value))
}

fn parse_labels(mut s: &str) -> Option<HashMap<String, String>> {
    let mut labels = HashMap::new();
    while !s.is_empty() {
        let (key, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.insert(key.trim_start_matches(',').to_owned(), value);
        s = rest[end + 1..].trim_start_matches(',');
    }
    Some(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP a_total A.\n# TYPE a_total counter\na_total{model=\"m\\\"x\",hint_used=\"true\"} 3\n\
                        # TYPE up gauge\nup 1\n\
                        # TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 0.5\nh_count 2\n";

    #[test]
    fn parses_every_kind_with_labels() {
        let all = samples(TEXT, &[], 7);
        assert_eq!(all.len(), 5);
        assert_eq!(all[0].name, "a_total");
        assert_eq!(all[0].r#type, "counter");
        assert_eq!(all[0].labels["model"], "m\"x");
        assert_eq!(all[0].labels["hint_used"], "true");
        assert_eq!(all[0].value, 3.0);
        assert_eq!(all[2].r#type, "histogram");
        assert_eq!(all[2].labels["le"], "+Inf");
        assert!(all.iter().all(|m| m.timestamp_us == 7));
    }

    #[test]
    fn filters_by_family_or_sample_name() {
        assert_eq!(samples(TEXT, &["up".into()], 0).len(), 1);
        assert_eq!(samples(TEXT, &["h".into()], 0).len(), 3);
        assert_eq!(samples(TEXT, &["h_sum".into()], 0).len(), 1);
        assert!(samples(TEXT, &["nope".into()], 0).is_empty());
    }
}

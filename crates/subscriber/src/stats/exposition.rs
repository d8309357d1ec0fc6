//! A small, forgiving parser for the Prometheus text exposition (0.0.4) and
//! OpenMetrics: only samples are needed, so `# HELP/TYPE/UNIT/EOF` lines are
//! skipped and a line that does not parse is skipped, not fatal.

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name, e.g. `vllm:num_requests_running`.
    pub name: String,
    /// Label pairs in order.
    pub labels: Vec<(String, String)>,
    /// Value (NaN/Inf samples are dropped by [`parse`]).
    pub value: f64,
}

impl Sample {
    /// A label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses every well-formed, finite sample; returns them and the number of
/// lines skipped as malformed.
pub fn parse(body: &str) -> (Vec<Sample>, usize) {
    let mut out = Vec::new();
    let mut bad = 0;
    for line in body.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Some(s) if s.value.is_finite() => out.push(s),
            Some(_) => {}
            None => bad += 1,
        }
    }
    (out, bad)
}

fn parse_line(line: &str) -> Option<Sample> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let (l, after) = parse_labels(r)?;
        labels = l;
        rest = after;
    }
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// Parses `k="v",k2="v2"}`; returns the pairs and what follows the `}`.
fn parse_labels(mut s: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([' ', ',']);
        if let Some(after) = s.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = s.find('=')?;
        let key = s[..eq].trim().trim_matches('"').to_owned();
        s = s[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = s.char_indices();
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
        s = &s[end + 1..];
        labels.push((key, value));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_openmetrics_lines_parse() {
        let body = "# HELP x y\n# TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:prefix_cache_hits_total{model_name=\"a \\\"q\\\"\"} 25 1700000000\n\
            sglang:cache_hit_rate 0.75\n\
            bad line here\n\
            x_nan NaN\n# EOF\n";
        let (s, bad) = parse(body);
        assert_eq!(bad, 1);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].label("model_name"), Some("m"));
        assert_eq!(s[1].label("model_name"), Some("a \"q\""));
        assert_eq!(s[1].value, 25.0);
        assert_eq!(s[2].name, "sglang:cache_hit_rate");
    }

    #[test]
    fn garbage_never_panics() {
        for body in [
            "{", "a{", "a{b", "a{b=", "a{b=\"", "a{b=\"\\", "a{} x", "\u{0}{}",
        ] {
            let _ = parse(body);
        }
    }
}

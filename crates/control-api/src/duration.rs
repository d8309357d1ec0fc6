//! The duration form of every inference-cache flag (`500ms`, `90s`, `30m`,
//! `1h30m`): one parser for the `inferencecache` binary and the benchmark
//! rigs, so a value that works on one works on all.

/// Parses a Go-style duration (`500ms`, `90s`, `30m`, `1h30m`); zero and
/// anything else are refused with a message naming the accepted forms.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("{s:?} is not a duration; use e.g. 500ms, 90s, 30m or 1h30m");
    let mut total = std::time::Duration::ZERO;
    let mut rest = s.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit_len] {
            "ms" => std::time::Duration::from_millis(n),
            "s" => std::time::Duration::from_secs(n),
            "m" => std::time::Duration::from_secs(n * 60),
            "h" => std::time::Duration::from_secs(n * 3600),
            _ => return Err(bad()),
        };
        total += part;
        rest = &rest[unit_len..];
    }
    if total.is_zero() {
        return Err(format!("{s:?}: the duration must be positive"));
    }
    Ok(total)
}

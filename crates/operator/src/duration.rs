//! Go `time.ParseDuration` for `metav1.Duration` fields ("1h30m", "45s",
//! "1.5h", "-2m"), so a CachePolicy's `evictionTTL` means what it means to
//! the reference.

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}")]
pub struct DurationError(pub String);

/// Parses a Go duration into nanoseconds (saturating at the i64 range, as
/// overflow is an error in Go; we report it as one too).
pub fn parse_go_duration(s: &str) -> Result<i64, DurationError> {
    let err = || DurationError(s.to_owned());
    let (neg, mut rest) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err(err());
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(err)?;
        let (num, tail) = rest.split_at(num_len);
        if num.is_empty() || num == "." {
            return Err(err());
        }
        let value: f64 = num.parse().map_err(|_| err())?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, next) = tail.split_at(unit_len);
        let scale = match unit {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(err()),
        };
        total += value * scale;
        rest = next;
    }
    // i64::MAX as f64 rounds up to 2^63, so `>=` rejects every overflow.
    #[allow(clippy::cast_precision_loss)]
    if total >= i64::MAX as f64 {
        return Err(err());
    }
    #[allow(clippy::cast_possible_truncation)]
    let ns = total.round() as i64;
    Ok(if neg { -ns } else { ns })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse_like_time_parse_duration() {
        assert_eq!(parse_go_duration("45m"), Ok(45 * 60 * 1_000_000_000));
        assert_eq!(parse_go_duration("1h30m"), Ok(5400 * 1_000_000_000));
        assert_eq!(parse_go_duration("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_go_duration("300ms"), Ok(300_000_000));
        assert_eq!(parse_go_duration("-2m"), Ok(-120 * 1_000_000_000));
        assert_eq!(parse_go_duration("0"), Ok(0));
        assert_eq!(parse_go_duration("0s"), Ok(0));
        for bad in ["", "5", "m", "1d", "1.2.3s", "forever", "-", "9999999999h"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }
}

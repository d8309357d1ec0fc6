//! Small formatting helpers shared by the tools' readable output.

/// Lowercase hex of a hash, as operators paste it back into `--hashes`.
pub(super) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Parses hex (an optional `0x` prefix is allowed).
pub(super) fn unhex(s: &str) -> Result<Vec<u8>, String> {
    let s = s.trim();
    let digits = s.strip_prefix("0x").unwrap_or(s);
    if digits.is_empty() || digits.len() % 2 != 0 {
        return Err(format!("{s:?} is not an even number of hex digits"));
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| {
            digits
                .get(i..i + 2)
                .and_then(|pair| u8::from_str_radix(pair, 16).ok())
                .ok_or_else(|| format!("{s:?} is not hex"))
        })
        .collect()
}

/// Bytes with a binary unit (KiB, MiB, GiB).
pub(super) fn bytes(n: i64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    #[allow(clippy::cast_precision_loss)] // display only
    let mut v = n as f64;
    let mut unit = 0;
    while v.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// A duration in the unit that reads best (µs below 1 ms).
pub(super) fn latency(d: std::time::Duration) -> String {
    if d.as_micros() < 1000 {
        format!("{} µs", d.as_micros())
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1000.0)
    }
}

/// Left-aligned columns: every cell padded to its column's widest value.
pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        format!("  {}\n", padded.join("  ").trim_end())
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// An f32 as JSON in its shortest round-trip form (0.8, not
/// 0.800000011920929 as widening to f64 would print).
pub(super) fn f32_json(v: f32) -> serde_json::Value {
    v.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(serde_json::Value::Null, serde_json::Value::Number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex(&[0, 0xab, 0xff]), "00abff");
        assert_eq!(unhex("0x00abff"), Ok(vec![0, 0xab, 0xff]));
        assert!(unhex("abc").is_err());
        assert!(unhex("zz").is_err());
        assert!(unhex("").is_err());
    }

    #[test]
    fn sizes_and_tables_read_well() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(latency(std::time::Duration::from_micros(250)), "250 µs");
        let t = table(&["A", "BB"], &[vec!["xyz".into(), "1".into()]]);
        assert_eq!(t, "  A    BB\n  xyz  1\n");
        assert_eq!(f32_json(0.8).to_string(), "0.8");
        assert_eq!(f32_json(f32::NAN), serde_json::Value::Null);
    }
}

//! Mooncake trace reader: one JSON object per line with `timestamp` (ms),
//! `input_length`, `output_length` and `hash_ids` (one id per prompt block of
//! the trace's block size; equal ids at equal positions are the same prefix).

use crate::error::SimError;
use serde::{Deserialize, Serialize};
use std::io::BufRead;
use std::path::Path;

/// One request of a Mooncake trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Arrival time, milliseconds from the start of the trace.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Generated tokens.
    pub output_length: u32,
    /// Prefix block ids, one per (possibly partial) prompt block.
    pub hash_ids: Vec<u64>,
}

/// Reads a trace file; `limit` keeps only the first N requests.
pub fn read_trace(path: &Path, limit: Option<usize>) -> Result<Vec<TraceRequest>, SimError> {
    let file = std::fs::File::open(path).map_err(|source| SimError::TraceIo {
        path: path.to_owned(),
        source,
    })?;
    let name = path.display().to_string();
    parse_trace(std::io::BufReader::new(file), &name, limit)
}

/// Parses trace lines from any reader; `source_name` prefixes error messages.
///
/// Blank lines are skipped. Requests are returned in arrival order (a stable
/// sort, so a trace that is already ordered keeps its order for equal
/// timestamps).
pub fn parse_trace(
    reader: impl BufRead,
    source_name: &str,
    limit: Option<usize>,
) -> Result<Vec<TraceRequest>, SimError> {
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        if limit.is_some_and(|n| out.len() >= n) {
            break;
        }
        let err = |message: String| SimError::TraceLine {
            source_name: source_name.to_owned(),
            line: i + 1,
            message,
        };
        let line = line.map_err(|e| err(format!("read error: {e}")))?;
        if line.trim().is_empty() {
            continue;
        }
        let req: TraceRequest = serde_json::from_str(&line).map_err(|e| {
            err(format!(
                "not a Mooncake request ({{\"timestamp\", \"input_length\", \"output_length\", \"hash_ids\"}}): {e}"
            ))
        })?;
        if req.input_length == 0 {
            return Err(err("input_length is 0".into()));
        }
        if req.hash_ids.is_empty() {
            return Err(err("hash_ids is empty".into()));
        }
        out.push(req);
    }
    if out.is_empty() {
        return Err(SimError::EmptyTrace);
    }
    out.sort_by_key(|r| r.timestamp);
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn parses_and_limits() {
        let text = "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [0, 1]}\n\n{\"timestamp\": 1, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [2]}\n{\"timestamp\": 9, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [3]}\n";
        let all = parse_trace(text.as_bytes(), "t", None).unwrap();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0].timestamp, 1);
        let two = parse_trace(text.as_bytes(), "t", Some(2)).unwrap();
        assert_eq!(two.len(), 2);
    }

    #[test]
    fn errors_name_the_line() {
        let text = "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 3, \"hash_ids\": [0, 1]}\n{\"timestamp\": \"x\"}\n";
        let e = parse_trace(text.as_bytes(), "trace.jsonl", None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("trace.jsonl:2: "), "{e}");
        let e = parse_trace(
            "{\"timestamp\": 5, \"input_length\": 6, \"output_length\": 3, \"hash_ids\": []}"
                .as_bytes(),
            "t",
            None,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(e, "t:1: hash_ids is empty");
        assert!(matches!(
            parse_trace("".as_bytes(), "t", None),
            Err(SimError::EmptyTrace)
        ));
    }
}

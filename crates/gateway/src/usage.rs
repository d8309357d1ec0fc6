//! Reading `usage` out of engine responses as they pass through, without
//! changing a byte: a whole JSON body, or the `data:` lines of an SSE stream
//! (vLLM sends usage in a final chunk when the client asked for
//! `stream_options.include_usage`, or in every chunk with
//! `continuous_usage_stats`; the last one wins).

use serde_json::Value;

/// The token counts of one response.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// `prompt_tokens`.
    pub prompt_tokens: u64,
    /// `completion_tokens`.
    pub completion_tokens: u64,
    /// `prompt_tokens_details.cached_tokens` (engines started with
    /// `--enable-prompt-tokens-details`).
    pub cached_tokens: Option<u64>,
}

impl Usage {
    /// The `usage` of a response object, if it has one.
    pub fn from_response(v: &Value) -> Option<Self> {
        let u = v.get("usage").filter(|u| u.is_object())?;
        Some(Self {
            prompt_tokens: u["prompt_tokens"].as_u64().unwrap_or(0),
            completion_tokens: u["completion_tokens"].as_u64().unwrap_or(0),
            cached_tokens: u["prompt_tokens_details"]["cached_tokens"].as_u64(),
        })
    }
}

/// Longest SSE line kept for parsing; longer lines pass through unparsed.
const MAX_LINE: usize = 1 << 20;

/// Scans an SSE stream chunk by chunk for `usage`.
#[derive(Debug, Default)]
pub struct SseUsage {
    line: Vec<u8>,
    skipping: bool,
    /// The last usage seen.
    pub usage: Option<Usage>,
}

impl SseUsage {
    /// Feeds the next chunk of the stream.
    pub fn feed(&mut self, mut chunk: &[u8]) {
        while !chunk.is_empty() {
            match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => {
                    self.push(&chunk[..i]);
                    self.end_line();
                    chunk = &chunk[i + 1..];
                }
                None => {
                    self.push(chunk);
                    chunk = &[];
                }
            }
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.skipping {
            return;
        }
        if self.line.len() + bytes.len() > MAX_LINE {
            self.skipping = true;
            self.line.clear();
            return;
        }
        self.line.extend_from_slice(bytes);
    }

    fn end_line(&mut self) {
        if !std::mem::take(&mut self.skipping) {
            if let Some(u) = parse_line(&self.line) {
                self.usage = Some(u);
            }
        }
        self.line.clear();
    }
}

/// The usage of one SSE line, if it is a `data:` line carrying one.
fn parse_line(line: &[u8]) -> Option<Usage> {
    let data = line.strip_prefix(b"data:")?;
    // Most chunks carry no usage: only parse the ones that might.
    if !contains(data, b"\"usage\"") {
        return None;
    }
    let v = serde_json::from_slice::<Value>(data.trim_ascii()).ok()?;
    Usage::from_response(&v)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_found_across_chunk_boundaries() {
        let stream = concat!(
            "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":70,\"completion_tokens\":2,",
            "\"prompt_tokens_details\":{\"cached_tokens\":64}}}\n\n",
            "data: [DONE]\n\n"
        );
        for split in [1, 7, 33, stream.len()] {
            let mut s = SseUsage::default();
            for c in stream.as_bytes().chunks(split) {
                s.feed(c);
            }
            assert_eq!(
                s.usage,
                Some(Usage {
                    prompt_tokens: 70,
                    completion_tokens: 2,
                    cached_tokens: Some(64)
                }),
                "split {split}"
            );
        }
    }

    #[test]
    fn a_response_without_details_has_no_cached_count() {
        let v = serde_json::json!({"usage": {"prompt_tokens": 5, "completion_tokens": 1}});
        assert_eq!(Usage::from_response(&v).unwrap().cached_tokens, None);
        assert_eq!(Usage::from_response(&serde_json::json!({})), None);
    }
}

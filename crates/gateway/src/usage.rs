//! Reading `usage` out of engine responses as they pass through, without
//! changing a byte: a whole JSON body, or the `data:` lines of an SSE stream
//! (vLLM sends usage in a final chunk when the client asked for
//! `stream_options.include_usage`, or in every chunk with
//! `continuous_usage_stats`; the last one wins).
//!
//! A stream whose client did not ask for usage is forwarded with
//! `stream_options.include_usage` on ([`ask_for_usage`]), so every answer
//! can be judged, and the usage-only chunk the engine then adds is taken
//! out again on the way back ([`UsageStripper`]): the client sees exactly
//! the stream it asked for.

use bytes::Bytes;
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
    /// `data: [DONE]` was seen: the answer is complete (clients may close
    /// the connection right after it, before the engine's end of stream).
    pub done: bool,
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
            } else if self.line.trim_ascii() == b"data: [DONE]" {
                self.done = true;
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

/// What a request body says about usage in its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamUsage {
    /// Not streamed: the answer always carries usage.
    NotStreamed,
    /// Streamed, and the client asked for usage (or set stream options the
    /// gateway leaves alone): forwarded as is.
    Asked,
    /// Streamed without usage: the gateway asks for it and strips it.
    Add,
}

impl StreamUsage {
    /// Reads a parsed request body.
    pub fn of(body: &Value) -> Self {
        if body["stream"].as_bool() != Some(true) {
            return Self::NotStreamed;
        }
        match &body["stream_options"] {
            Value::Null => Self::Add,
            Value::Object(o) => {
                let asked = o.get("include_usage").and_then(Value::as_bool) == Some(true);
                // Per-chunk usage would have to be stripped from every
                // chunk: leave such requests alone.
                let continuous = o.contains_key("continuous_usage_stats");
                if asked || continuous {
                    Self::Asked
                } else {
                    Self::Add
                }
            }
            _ => Self::Asked,
        }
    }
}

/// `body` with `stream_options.include_usage` on. Without `stream_options`
/// the field is spliced in after the opening brace (no re-serialisation);
/// otherwise the parsed body is rewritten. `None` when the body is not a
/// JSON object.
pub fn ask_for_usage(body: &Bytes, parsed: &Value) -> Option<Bytes> {
    const FIELD: &[u8] = br#""stream_options":{"include_usage":true},"#;
    if parsed.get("stream_options").is_none() {
        let open = body.iter().position(|b| !b.is_ascii_whitespace())?;
        if body[open] != b'{' {
            return None;
        }
        let mut out = Vec::with_capacity(body.len() + FIELD.len());
        out.extend_from_slice(&body[..=open]);
        out.extend_from_slice(FIELD);
        out.extend_from_slice(&body[open + 1..]);
        return Some(Bytes::from(out));
    }
    let mut v = parsed.clone();
    let obj = v.as_object_mut()?;
    let opts = obj
        .entry("stream_options")
        .or_insert_with(|| Value::Object(serde_json::Map::new()));
    if !opts.is_object() {
        *opts = Value::Object(serde_json::Map::new());
    }
    opts["include_usage"] = Value::Bool(true);
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

/// Takes the usage-only chunk (`"choices":[]` with a `usage`) and its blank
/// line out of an SSE stream, passing everything else through as it comes:
/// complete lines at once, a partial last line when it completes.
#[derive(Debug, Default)]
pub struct UsageStripper {
    partial: Vec<u8>,
    drop_blank: bool,
}

impl UsageStripper {
    /// The bytes of `chunk` to pass on.
    pub fn feed(&mut self, chunk: Bytes) -> Bytes {
        // Most chunks are whole lines without usage: pass them untouched.
        if self.partial.is_empty()
            && !self.drop_blank
            && chunk.ends_with(b"\n")
            && !contains(&chunk, b"\"usage\"")
        {
            return chunk;
        }
        self.partial.extend_from_slice(&chunk);
        let Some(end) = self.partial.iter().rposition(|&b| b == b'\n') else {
            return Bytes::new();
        };
        let rest = self.partial.split_off(end + 1);
        let complete = std::mem::replace(&mut self.partial, rest);
        let mut out = Vec::with_capacity(complete.len());
        for line in complete.split_inclusive(|&b| b == b'\n') {
            if std::mem::take(&mut self.drop_blank) && line.trim_ascii().is_empty() {
                continue;
            }
            if usage_only(line) {
                self.drop_blank = true;
                continue;
            }
            out.extend_from_slice(line);
        }
        Bytes::from(out)
    }

    /// What is left at the end of the stream (a last line without newline).
    pub fn finish(&mut self) -> Bytes {
        let rest = std::mem::take(&mut self.partial);
        if usage_only(&rest) {
            Bytes::new()
        } else {
            Bytes::from(rest)
        }
    }
}

/// A `data:` line whose chunk carries usage and no choices.
fn usage_only(line: &[u8]) -> bool {
    let Some(data) = line.trim_ascii().strip_prefix(b"data:") else {
        return false;
    };
    if !contains(data, b"\"usage\"") {
        return false;
    }
    serde_json::from_slice::<Value>(data.trim_ascii())
        .is_ok_and(|v| v["usage"].is_object() && v["choices"].as_array().is_some_and(Vec::is_empty))
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
            assert!(s.done, "split {split}");
        }
    }

    #[test]
    fn streams_without_usage_ask_for_it_and_lose_it_again() {
        use serde_json::json;
        let of = |v: Value| StreamUsage::of(&v);
        assert_eq!(of(json!({"stream": false})), StreamUsage::NotStreamed);
        assert_eq!(of(json!({"stream": true})), StreamUsage::Add);
        assert_eq!(
            of(json!({"stream": true, "stream_options": {"include_usage": false}})),
            StreamUsage::Add
        );
        assert_eq!(
            of(json!({"stream": true, "stream_options": {"include_usage": true}})),
            StreamUsage::Asked
        );
        assert_eq!(
            of(
                json!({"stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}})
            ),
            StreamUsage::Asked
        );
        // Spliced in: the client's bytes stay as they were around it.
        let body = Bytes::from_static(b" {\"model\": \"m\", \"stream\": true}");
        let out = ask_for_usage(&body, &serde_json::from_slice(&body).unwrap()).unwrap();
        assert_eq!(
            &out[..],
            &b" {\"stream_options\":{\"include_usage\":true},\"model\": \"m\", \"stream\": true}"[..]
        );
        let body =
            Bytes::from_static(b"{\"stream\":true,\"stream_options\":{\"include_usage\":false}}");
        let out = ask_for_usage(&body, &serde_json::from_slice(&body).unwrap()).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        // The usage chunk and its blank line go; everything else stays, in
        // whatever pieces it arrives.
        let stream = concat!(
            "data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
            "data: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":70,\"completion_tokens\":2}}\n\n",
            "data: [DONE]\n\n"
        );
        let want = concat!(
            "data: {\"choices\":[{\"text\":\"a\"}]}\n\n",
            "data: {\"choices\":[{\"text\":\"b\",\"finish_reason\":\"length\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        for split in [1, 5, 40, stream.len()] {
            let mut s = UsageStripper::default();
            let mut out = Vec::new();
            for c in stream.as_bytes().chunks(split) {
                out.extend_from_slice(&s.feed(Bytes::copy_from_slice(c)));
            }
            out.extend_from_slice(&s.finish());
            assert_eq!(String::from_utf8(out).unwrap(), want, "split {split}");
        }
    }

    #[test]
    fn a_response_without_details_has_no_cached_count() {
        let v = serde_json::json!({"usage": {"prompt_tokens": 5, "completion_tokens": 1}});
        assert_eq!(Usage::from_response(&v).unwrap().cached_tokens, None);
        assert_eq!(Usage::from_response(&serde_json::json!({})), None);
    }
}

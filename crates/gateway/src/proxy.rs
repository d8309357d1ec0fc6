//! Forwarding one request to the ranked engines and relaying the answer.
//!
//! The body goes out byte for byte, with the client's headers (hop-by-hop
//! ones aside). A refused or timed-out connect marks the engine unhealthy
//! and moves the request to the next engine in the ranking. A kept-alive
//! connection the engine closed under the request before any response byte
//! (its keep-alive timer) sends it once more on a fresh connection to the
//! same engine ([`crate::upstream`]); any other failure before the answer
//! starts is a 502 naming the engine. The answer
//! streams back chunk by chunk as the engine writes it; usage is read on
//! the way. When the client goes away the relay is dropped, which drops the
//! engine connection (vLLM aborts the request when its client disconnects)
//! and releases the engine's load. An engine that fails mid-stream ends an
//! SSE answer with an OpenAI-shaped `error` event, so SDKs raise instead of
//! hanging or mistaking it for the end.

use crate::engine::{Dispatch, Engine};
use crate::metrics::{Metrics, Phase};
use crate::pick::Choice;
use crate::upstream::{Upstream, closed_before_response};
use crate::usage::{SseUsage, Usage, UsageStripper};
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Headers that describe one connection, never forwarded.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "content-length"
    )
}

/// An OpenAI-shaped error answer.
pub fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    let body = serde_json::json!({"error": {
        "message": message,
        "type": kind,
        "code": status.as_u16(),
    }});
    (status, axum::Json(body)).into_response()
}

/// One request to forward.
#[derive(Debug)]
pub struct Outgoing<'a> {
    /// Method.
    pub method: Method,
    /// Path and query on the engine.
    pub path_and_query: &'a str,
    /// The client's headers.
    pub headers: &'a HeaderMap,
    /// The body, as received.
    pub body: Bytes,
    /// Metric label of the route.
    pub route: &'static str,
    /// When the request arrived.
    pub start: Instant,
    /// Why the first engine was chosen (a response header).
    pub reason: &'static str,
    /// The prompt's block chain, held as routed to the engine that takes it.
    pub chain: &'a [u64],
    /// The gateway asked for usage the client did not: strip it from the
    /// stream.
    pub strip_usage: bool,
}

/// Tries `choices` in order; the first engine that accepts the connection
/// answers. `first`: the first choice's hold on the request, taken when it
/// was ranked.
pub async fn forward(
    upstream: &Upstream,
    metrics: &Arc<Metrics>,
    out: Outgoing<'_>,
    choices: &[Choice],
    mut first: Option<Dispatch>,
) -> Response {
    // One resend per request on a fresh connection: a second closed
    // connection is the engine's fault, not the pool's.
    let mut resent = false;
    for (i, choice) in choices.iter().enumerate() {
        let engine = &choice.engine;
        let prompt_tokens = choice.reusable + choice.uncached;
        let dispatch = match first.take() {
            Some(d) if i == 0 => d,
            _ => engine.dispatch_prompt(choice.uncached, out.chain, prompt_tokens),
        };
        let url = format!("{}{}", engine.spec.url, out.path_and_query);
        let mut fresh = false;
        let result = loop {
            let http = if fresh {
                &upstream.fresh
            } else {
                &upstream.pooled
            };
            let mut req = http.request(out.method.clone(), &url);
            for (name, value) in out.headers {
                if !hop_by_hop(name) {
                    req = req.header(name, value);
                }
            }
            let sent = Instant::now();
            if i == 0 && !fresh {
                metrics.phase(Phase::PreForward, (sent - out.start).as_secs_f64());
            }
            match req.body(out.body.clone()).send().await {
                Err(e) if !resent && closed_before_response(&e) => {
                    tracing::info!(engine = %engine.id, error = %e, "engine_closed_connection_resending");
                    metrics.stale_retry(engine);
                    resent = true;
                    fresh = true;
                }
                r => break r.map(|resp| (resp, sent)),
            }
        };
        match result {
            Ok((resp, sent)) => {
                metrics.phase(Phase::UpstreamHeaders, sent.elapsed().as_secs_f64());
                metrics.processed(engine);
                return relay(resp, dispatch, metrics, &out, choice, i > 0, sent);
            }
            Err(e) if e.is_connect() || (e.is_timeout() && !e.is_body()) => {
                drop(dispatch);
                if engine.set_healthy(false) {
                    tracing::warn!(engine = %engine.id, error = %e, "engine_unreachable");
                }
                metrics.retry(engine);
            }
            Err(e) => {
                drop(dispatch);
                tracing::warn!(engine = %engine.id, error = %e, "engine_request_failed");
                metrics.request(out.route, 502, out.start.elapsed().as_secs_f64());
                return error(
                    StatusCode::BAD_GATEWAY,
                    "upstream_error",
                    &format!("engine {} failed: {e}", engine.id),
                );
            }
        }
    }
    metrics.request(out.route, 503, out.start.elapsed().as_secs_f64());
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_engine",
        "no engine accepted the connection (all refused or unreachable); see the gateway's /health",
    )
}

/// Streams an engine's answer back to the client.
fn relay(
    resp: reqwest::Response,
    dispatch: Dispatch,
    metrics: &Arc<Metrics>,
    out: &Outgoing<'_>,
    choice: &Choice,
    retried: bool,
    sent: Instant,
) -> Response {
    let status = resp.status();
    let mut headers = HeaderMap::new();
    for (name, value) in resp.headers() {
        if !hop_by_hop(name) || name == header::CONTENT_LENGTH {
            headers.append(name, value.clone());
        }
    }
    let sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if sse {
        headers.remove(header::CONTENT_LENGTH);
    }
    let resp_len = resp.content_length();
    let engine = Arc::clone(dispatch.engine());
    if let Ok(v) = HeaderValue::from_str(&engine.id) {
        headers.insert("x-inferencecache-engine", v);
    }
    let reason = if retried { "retry" } else { out.reason };
    headers.insert("x-inferencecache-route", HeaderValue::from_static(reason));
    headers.insert(
        "x-inferencecache-reusable-tokens",
        HeaderValue::from(choice.reusable),
    );
    // What the engine had ahead of this request when it was picked, and the
    // gateway's own time before forwarding (W3C Server-Timing): per request,
    // what the phase histograms only give on average.
    if let Ok(v) = HeaderValue::from_str(&format!(
        "in_flight={}, prefill_tokens={}, cost={}",
        choice.in_flight, choice.queued_prefill, choice.cost
    )) {
        headers.insert("x-inferencecache-load", v);
    }
    if let Ok(v) = HeaderValue::from_str(&format!(
        "pre_forward;dur={:.3}",
        (sent - out.start).as_secs_f64() * 1000.0
    )) {
        headers.append(HeaderName::from_static("server-timing"), v);
    }
    let state = Relay {
        resp: Some(resp),
        dispatch,
        metrics: Arc::clone(metrics),
        route: out.route,
        start: out.start,
        sent,
        status: status.as_u16(),
        first: true,
        sse: sse.then(SseUsage::default),
        strip: (sse && out.strip_usage).then(UsageStripper::default),
        json: (!sse).then(Vec::new),
        expected_reuse: choice.reusable,
        done: false,
        remaining: resp_len,
    };
    let body = Body::from_stream(futures::stream::unfold(state, Relay::next));
    let mut response = Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
}

/// Reads what is left of an answer whose content is all relayed (an SSE
/// stream after `[DONE]`: the chunked encoding's last chunk), so its
/// connection goes back to the pool instead of being closed: dropped
/// unread, every streamed request would cost a new connection to the
/// engine. Bounded: an engine that sends more, or nothing, within a second
/// loses the connection.
fn drain(mut rest: reqwest::Response) {
    tokio::spawn(async move {
        let read = async {
            let mut left = 64usize << 10;
            while let Ok(Some(c)) = rest.chunk().await {
                left = left.checked_sub(c.len())?;
            }
            Some(())
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), read).await;
    });
}

/// Largest non-streamed answer kept to read its usage.
const MAX_JSON_KEPT: usize = 4 << 20;

struct Relay {
    resp: Option<reqwest::Response>,
    dispatch: Dispatch,
    metrics: Arc<Metrics>,
    route: &'static str,
    start: Instant,
    /// When the request left for the engine.
    sent: Instant,
    status: u16,
    first: bool,
    sse: Option<SseUsage>,
    strip: Option<UsageStripper>,
    json: Option<Vec<u8>>,
    expected_reuse: u64,
    done: bool,
    /// Bytes still to come of a sized body: hyper stops polling a body once
    /// its content-length is written, so the relay finishes on the last
    /// byte rather than waiting for an end it would never be asked for.
    remaining: Option<u64>,
}

type Item = Result<Bytes, std::io::Error>;

impl Relay {
    async fn next(mut self) -> Option<(Item, Self)> {
        loop {
            let resp = self.resp.as_mut()?;
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    let chunk = self.seen(chunk);
                    // A chunk that was all stripped usage: read on.
                    if chunk.is_empty() && self.resp.is_some() {
                        continue;
                    }
                    return Some((Ok(chunk), self));
                }
                Ok(None) => {
                    self.finish();
                    let rest = self.strip.as_mut().map(UsageStripper::finish);
                    return rest.filter(|r| !r.is_empty()).map(|r| (Ok(r), self));
                }
                Err(e) => return Some(self.failed(&e)),
            }
        }
    }

    /// Reads a chunk on its way through (first byte, usage, end); what to
    /// pass on.
    fn seen(&mut self, chunk: Bytes) -> Bytes {
        let first = std::mem::replace(&mut self.first, false).then(Instant::now);
        if let Some(at) = first {
            self.dispatch.prefilled();
            let t = (at - self.start).as_secs_f64();
            self.metrics.first_token(self.route, self.engine(), t);
            self.engine().stats.first_byte(t);
            self.metrics
                .phase(Phase::UpstreamFirstByte, (at - self.sent).as_secs_f64());
        }
        let out = self.pass_on(chunk);
        if let Some(at) = first {
            let relay = at.elapsed();
            self.metrics
                .phase(Phase::RelayFirstByte, relay.as_secs_f64());
            tracing::debug!(
                engine = %self.engine().id,
                pre_forward_us = (self.sent - self.start).as_micros(),
                upstream_first_byte_us = (at - self.sent).as_micros(),
                relay_us = relay.as_micros(),
                "first_byte"
            );
        }
        out
    }

    /// Usage, end of answer and usage stripping for one chunk; what to pass on.
    fn pass_on(&mut self, chunk: Bytes) -> Bytes {
        let mut done = false;
        if let Some(s) = &mut self.sse {
            s.feed(&chunk);
            done = s.done;
        } else if let Some(j) = &mut self.json {
            if j.len() + chunk.len() <= MAX_JSON_KEPT {
                j.extend_from_slice(&chunk);
            } else {
                self.json = None;
            }
        }
        if let Some(r) = &mut self.remaining {
            *r = r.saturating_sub(chunk.len() as u64);
            done |= *r == 0;
        }
        if done {
            self.finish();
        }
        match &mut self.strip {
            Some(s) => {
                let mut out = s.feed(chunk);
                if done {
                    let rest = s.finish();
                    if !rest.is_empty() {
                        let mut v = out.to_vec();
                        v.extend_from_slice(&rest);
                        out = Bytes::from(v);
                    }
                }
                out
            }
            None => chunk,
        }
    }

    /// The engine failed mid-answer.
    fn failed(mut self, e: &reqwest::Error) -> (Item, Self) {
        self.resp = None;
        let engine = Arc::clone(self.engine());
        tracing::warn!(engine = %engine.id, error = %e, "engine_failed_mid_response");
        if engine.set_healthy(false) {
            tracing::warn!(engine = %engine.id, "engine_marked_unhealthy");
        }
        self.done = true;
        self.metrics
            .request(self.route, 502, self.start.elapsed().as_secs_f64());
        if self.sse.is_some() {
            let event = serde_json::json!({"error": {
                "message": format!("engine {} failed mid-stream: {e}", engine.id),
                "type": "upstream_error",
                "code": 502,
            }});
            let bytes = Bytes::from(format!("data: {event}\n\n"));
            return (Ok(bytes), self);
        }
        (Err(std::io::Error::other(e.to_string())), self)
    }

    fn engine(&self) -> &Arc<Engine> {
        self.dispatch.engine()
    }

    fn finish(&mut self) {
        if let Some(rest) = self.resp.take() {
            drain(rest);
        }
        self.done = true;
        let usage = match (&self.sse, &self.json) {
            (Some(s), _) => s.usage,
            (None, Some(j)) => serde_json::from_slice(j)
                .ok()
                .and_then(|v| Usage::from_response(&v)),
            (None, None) => None,
        };
        if let Some(u) = usage {
            self.metrics.usage(self.engine(), &u, self.expected_reuse);
            self.engine()
                .stats
                .usage(u.prompt_tokens, u.cached_tokens, self.expected_reuse);
        }
        self.metrics
            .request(self.route, self.status, self.start.elapsed().as_secs_f64());
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if !self.done {
            // The client went away: dropping `resp` closes the engine
            // connection, which aborts the request there.
            tracing::info!(engine = %self.engine().id, "client_disconnected");
            self.metrics
                .request(self.route, 499, self.start.elapsed().as_secs_f64());
        }
    }
}

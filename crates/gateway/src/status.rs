//! The gateway's status page (`GET /inferencecache/status`) and its data
//! (`GET /inferencecache/status.json`): per engine, requests, in flight,
//! the engine's prefix-cache hit rate on them, how its answers judged the
//! hints (exact / over-claimed / under-claimed, from
//! `usage.prompt_tokens_details.cached_tokens`) and the mean time to the
//! first byte. The page is one static document that polls the JSON; no
//! external assets.

use crate::engine::Engine;
use crate::http::St;
use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::atomic::Ordering;

fn engine_row(e: &Engine) -> Value {
    let st = &e.stats;
    let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
    let (prompt, cached) = (get(&st.prompt_tokens), get(&st.cached_tokens));
    let (exact, over, under) = (get(&st.hint_exact), get(&st.hint_over), get(&st.hint_under));
    let (ttft_sum, ttft_n) = (get(&st.ttft_us_sum), get(&st.ttft_count));
    #[allow(clippy::cast_precision_loss)]
    let ratio = |a: u64, b: u64| {
        if b == 0 {
            None
        } else {
            Some(a as f64 / b as f64)
        }
    };
    json!({
        "id": e.id.as_ref(),
        "url": e.spec.url,
        "healthy": e.healthy(),
        "indexed": e.indexed.is_set(),
        "in_flight": e.in_flight(),
        "pending_prefill_tokens": e.pending_prefill(),
        "pending_prefix_blocks": e.pending.len(),
        "fresh_tokens": e.fresh_tokens(),
        "requests": get(&st.requests),
        "answered": get(&st.answered),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": ratio(cached, prompt),
        "hints": {"exact": exact, "over": over, "under": under,
                  "expected_tokens": get(&st.expected_tokens)},
        "ttft_mean_ms": ratio(ttft_sum, ttft_n).map(|us| us / 1000.0),
    })
}

/// `GET /inferencecache/status.json`.
pub async fn json(State(s): St) -> Response {
    let engines = s.engines.snapshot();
    Json(json!({
        "block_size": s.block_size,
        "engines": engines.iter().map(|e| engine_row(e)).collect::<Vec<_>>(),
    }))
    .into_response()
}

/// `GET /inferencecache/status`.
pub async fn page() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PAGE).into_response()
}

const PAGE: &str = r##"<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>inferencecache gateway</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse}th,td{padding:.3em .7em;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}.down{color:#b00}.over{color:#b00;font-weight:bold}
small{color:#666}
</style></head><body>
<h1>inferencecache gateway</h1>
<p><small>Per engine: requests routed there, the engine's prefix-cache hit rate on them, and how its
answers judged the gateway's hints (<code>usage.prompt_tokens_details.cached_tokens</code> against the
tokens the gateway expected it to reuse: exact, over-claimed, under-claimed). Refreshes every second.</small></p>
<table id="engines"><thead><tr><th>engine</th><th>health</th><th>requests</th><th>in flight</th>
<th>hit rate</th><th>hints exact</th><th>over</th><th>under</th><th>TTFT mean</th></tr></thead>
<tbody></tbody></table>
<p id="updated"><small>loading…</small></p>
<script>
const pct = x => x == null ? "–" : (100 * x).toFixed(1) + " %";
const ms = x => x == null ? "–" : x.toFixed(1) + " ms";
function cell(tr, text, cls) { const td = tr.insertCell(); td.textContent = text; if (cls) td.className = cls; }
async function refresh() {
  try {
    const s = await (await fetch("status.json")).json();
    const body = document.querySelector("#engines tbody");
    body.replaceChildren();
    for (const e of s.engines) {
      const tr = body.insertRow();
      tr.dataset.engine = e.id;
      cell(tr, e.id + " (" + e.url + ")");
      cell(tr, e.healthy ? "up" : "down", e.healthy ? "" : "down");
      cell(tr, e.requests); cell(tr, e.in_flight); cell(tr, pct(e.hit_rate));
      cell(tr, e.hints.exact); cell(tr, e.hints.over, e.hints.over ? "over" : ""); cell(tr, e.hints.under);
      cell(tr, ms(e.ttft_mean_ms));
    }
    document.getElementById("updated").innerHTML = "<small>updated " + new Date().toLocaleTimeString() + "</small>";
  } catch (err) {
    document.getElementById("updated").innerHTML = "<small>gateway unreachable: " + err + "</small>";
  }
}
refresh(); setInterval(refresh, 1000);
</script></body></html>
"##;

//! The OpenAI-compatible front: `/v1/chat/completions`, `/v1/completions`
//! (routed by hint and load), `/v1/models` (the engines' lists merged),
//! `/health`, `/metrics`; any other path goes to the least-loaded engine
//! that serves the model, unchanged.

use crate::attach::Attach;
use crate::engine::{Engine, EngineSet};
use crate::hints::{Hint, HintQuery, HintSource};
use crate::metrics::Metrics;
use crate::pick::{self, PickReason};
use crate::prompt::{self, Api, Tokenizers};
use crate::proxy::{self, Outgoing, error};
use crate::usage::{self, StreamUsage};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Bodies up to this size are tokenized on the request's task; larger
/// ones on the blocking pool, so a huge prompt never stalls other requests.
const INLINE_TOKENIZE_BYTES: usize = 16 << 10;

/// Everything a request handler needs.
#[derive(Debug)]
pub struct Shared {
    /// The engines (they come and go: take a snapshot per request).
    pub engines: Arc<EngineSet>,
    /// Attaches an engine added at runtime.
    pub(crate) attach: Attach,
    /// The gateway's cancellation (engines added later live under it).
    pub cancel: CancellationToken,
    /// Whether `POST/DELETE /inferencecache/engines` are served.
    pub engine_admin: bool,
    /// Hint source.
    pub hints: HintSource,
    /// Tokenizers by base model.
    pub tokenizers: Arc<Tokenizers>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// HTTP client for the engines' own endpoints (models, metrics).
    pub http: reqwest::Client,
    /// Where requests are forwarded with ([`crate::upstream`]).
    pub upstream: crate::upstream::Upstream,
    /// Tenant.
    pub tenant: String,
    /// Hash scheme.
    pub hash_scheme: String,
    /// Engine block size.
    pub block_size: u32,
    /// Lookup budget.
    pub lookup_timeout: Duration,
    /// The pick's weights.
    pub weights: pick::Weights,
    /// Whether routed-but-unindexed prefixes count ([`crate::pending`]).
    pub pending_prefixes: bool,
    /// Eviction foresight on (it needs the prompt's block chain too).
    pub eviction_foresight: bool,
    /// Held from a request's ranking until its first choice holds the
    /// request ([`crate::engine::Dispatch`]): two requests for one new
    /// prompt tokenize in the same time and used to rank at once, each
    /// before the other's prefix was pending, and went to two engines.
    pub placing: std::sync::Mutex<()>,
}

pub(crate) type St = State<Arc<Shared>>;

/// The router.
pub fn router(shared: Arc<Shared>, max_body: usize) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/inferencecache/route/{api}", post(dry_run))
        .route(
            "/inferencecache/engines",
            get(crate::admin::list).post(crate::admin::add),
        )
        .route(
            "/inferencecache/engines/{id}",
            axum::routing::delete(crate::admin::remove),
        )
        .route("/inferencecache/status", get(crate::status::page))
        .route("/inferencecache/status.json", get(crate::status::json))
        .fallback(passthrough)
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(shared)
}

async fn chat(State(s): St, headers: HeaderMap, uri: Uri, body: Bytes) -> Response {
    route_request(&s, Api::Chat, &headers, &uri, body).await
}

async fn completions(State(s): St, headers: HeaderMap, uri: Uri, body: Bytes) -> Response {
    route_request(&s, Api::Completions, &headers, &uri, body).await
}

/// Engines serving `model`, with its index model and adapter; when no engine
/// lists it (lists not fetched yet, or a model the engines load lazily), all
/// engines, so the engine gives its own answer.
fn eligible(s: &Shared, model: &str) -> (Vec<Arc<Engine>>, Option<(String, String)>) {
    let mut keys = None;
    let all = s.engines.snapshot();
    let serving: Vec<Arc<Engine>> = all
        .iter()
        .filter(|e| match e.resolve(model) {
            Some(k) => {
                keys.get_or_insert(k);
                true
            }
            None => false,
        })
        .cloned()
        .collect();
    if serving.is_empty() {
        (all.as_ref().clone(), None)
    } else {
        (serving, keys)
    }
}

/// A routing decision, before forwarding.
struct Decision {
    choices: Vec<pick::Choice>,
    reason: PickReason,
    hint: Hint,
    prompt_tokens: u64,
    /// The prompt's block chain (empty when unknown or not tracked).
    chain: Vec<u64>,
    /// The body with usage asked for, when the client streams without it.
    usage_body: Option<Bytes>,
    /// The first choice, already holding the request (when forwarding).
    first: Option<crate::engine::Dispatch>,
}

/// The hint reason of a lookup skipped, or emptied, because the engines'
/// histories are not indexed yet.
const CATCHING_UP: &str = "CATCHING_UP";

/// Drops the candidates of engines whose history the index does not have
/// yet; a hint left without candidates is no hint.
fn without_unindexed(hint: &mut Hint, engines: &[Arc<Engine>]) {
    let before = hint.candidates.len();
    hint.candidates.retain(|c| {
        !engines
            .iter()
            .any(|e| e.id == c.replica_id && !e.indexed.is_set())
    });
    if hint.candidates.is_empty() && before > 0 {
        *hint = Hint::none(CATCHING_UP);
    }
}

/// Parses, tokenizes, looks up and ranks; an `Err` is the answer to send.
async fn decide(
    s: &Arc<Shared>,
    api: Api,
    body: &Bytes,
    start: Instant,
    forwarding: bool,
) -> Result<Decision, Response> {
    let route = api.label();
    let json: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            s.metrics.request(route, 400, start.elapsed().as_secs_f64());
            return Err(error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!("the body is not JSON: {e}"),
            ));
        }
    };
    let mut p = prompt::header_fields(&json);
    let (engines, keys) = eligible(s, &p.model);
    let mut chain = Vec::new();
    // An engine whose event history is still on its way to the index may
    // be listed with blocks it dropped since (a prefix-cache reset, an
    // eviction the replay has not reached): its claims wait.
    let catching_up = engines.iter().any(|e| !e.indexed.is_set());
    let (hint, tokens_len, seed) = match &keys {
        None => {
            s.metrics.fallback("unknown_model");
            (Hint::none("UNKNOWN_MODEL"), 0, 0)
        }
        Some((model, adapter)) => match s.tokenizers.get(model) {
            None => {
                s.metrics.fallback("no_tokenizer");
                (Hint::none("NO_TOKENIZER"), 0, 0)
            }
            Some(tok) => {
                let tokens = if body.len() <= INLINE_TOKENIZE_BYTES {
                    prompt::tokens(api, &json, &tok)
                } else {
                    let json = json.clone();
                    tokio::task::spawn_blocking(move || prompt::tokens(api, &json, &tok))
                        .await
                        .unwrap_or(Err("tokenizer_panicked"))
                };
                match tokens {
                    Ok(t) => p.tokens = t,
                    Err(why) => p.no_tokens = Some(why),
                }
                if let Some(why) = p.no_tokens {
                    s.metrics.fallback(why);
                    (Hint::none("NO_TOKENS"), 0, 0)
                } else {
                    let q = HintQuery {
                        tenant: &s.tenant,
                        model,
                        adapter,
                        hash_scheme: &s.hash_scheme,
                        tokens: &p.tokens,
                        cache_salt: p.cache_salt.as_deref(),
                    };
                    let hint = if engines.iter().any(|e| e.indexed.is_set()) {
                        let t = Instant::now();
                        let mut hint = s.hints.lookup(&q, s.block_size, s.lookup_timeout).await;
                        s.metrics.lookup(&hint.reason, t.elapsed().as_secs_f64());
                        if catching_up {
                            without_unindexed(&mut hint, &engines);
                        }
                        hint
                    } else {
                        Hint::none(CATCHING_UP)
                    };
                    if hint.candidates.is_empty() {
                        s.metrics.fallback(match hint.reason.as_str() {
                            "TIMEOUT" | "DEADLINE_EXCEEDED" => "timeout",
                            "UNAVAILABLE" => "hint_server_unavailable",
                            CATCHING_UP => "catching_up",
                            _ => "no_hint",
                        });
                    }
                    let seed = prompt::first_block_seed(&p.tokens, s.block_size);
                    if s.pending_prefixes || s.eviction_foresight {
                        let salt = p.cache_salt.as_deref().unwrap_or_default();
                        chain =
                            crate::pending::chain(&p.tokens, s.block_size, &[model, adapter, salt]);
                    }
                    (hint, p.tokens.len() as u64, seed)
                }
            }
        },
    };
    let req = pick::Request {
        prompt_tokens: tokens_len,
        chain: &chain,
        seed,
    };
    let (choices, reason, first) = {
        let _one = s.placing.lock().unwrap_or_else(|e| e.into_inner());
        let (choices, mut reason) = pick::rank(&engines, &hint, &req, &s.weights);
        if catching_up && reason == PickReason::LeastLoaded {
            reason = PickReason::CatchingUp;
        }
        let first = choices.first().filter(|_| forwarding).map(|c| {
            c.engine
                .dispatch_prompt(c.uncached, &chain, c.reusable + c.uncached)
        });
        (choices, reason, first)
    };
    if let Some(first) = choices.first() {
        if !first.engine.healthy() {
            s.metrics.fallback("all_unhealthy");
        } else if hint
            .candidates
            .first()
            .and_then(|c| engines.iter().find(|e| e.id == c.replica_id))
            .is_some_and(|e| !e.healthy())
        {
            s.metrics.fallback("hinted_unhealthy");
        }
    }
    s.metrics.decision(reason.as_str());
    s.metrics.overhead(start.elapsed().as_secs_f64());
    tracing::debug!(
        route,
        model = %p.model,
        prompt_tokens = tokens_len,
        hint = %hint.reason,
        engine = choices.first().map(|c| c.engine.id.to_string()).unwrap_or_default(),
        reusable = choices.first().map_or(0, |c| c.reusable),
        reason = reason.as_str(),
        "routed"
    );
    Ok(Decision {
        choices,
        reason,
        hint,
        prompt_tokens: tokens_len,
        chain,
        first,
        usage_body: match StreamUsage::of(&json) {
            StreamUsage::Add => usage::ask_for_usage(body, &json),
            StreamUsage::NotStreamed | StreamUsage::Asked => None,
        },
    })
}

async fn route_request(
    s: &Arc<Shared>,
    api: Api,
    headers: &HeaderMap,
    uri: &Uri,
    body: Bytes,
) -> Response {
    let start = Instant::now();
    let mut d = match decide(s, api, &body, start, true).await {
        Ok(d) => d,
        Err(answer) => return answer,
    };
    let path_and_query = uri.path_and_query().map_or(api.path(), |p| p.as_str());
    let strip_usage = d.usage_body.is_some();
    let out = Outgoing {
        method: Method::POST,
        path_and_query,
        headers,
        body: d.usage_body.unwrap_or(body),
        route: api.label(),
        start,
        reason: d.reason.as_str(),
        chain: &d.chain,
        strip_usage,
    };
    proxy::forward(&s.upstream, &s.metrics, out, &d.choices, d.first.take()).await
}

/// `POST /inferencecache/route/{chat|completions}`: the decision the gateway
/// would take for this body, without forwarding it (operators: "why did
/// this go there?"; tests: wait until the index has caught up).
async fn dry_run(State(s): St, Path(api): Path<String>, body: Bytes) -> Response {
    let api = match api.as_str() {
        "chat" => Api::Chat,
        "completions" => Api::Completions,
        other => {
            return error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                &format!("no route kind {other:?}: use chat or completions"),
            );
        }
    };
    match decide(&s, api, &body, Instant::now(), false).await {
        Err(answer) => answer,
        Ok(d) => axum::Json(serde_json::json!({
            "engine": d.choices.first().map(|c| c.engine.id.to_string()),
            "reason": d.reason.as_str(),
            "reusable_tokens": d.choices.first().map_or(0, |c| c.reusable),
            "prompt_tokens": d.prompt_tokens,
            "hint": {
                "reason": d.hint.reason,
                "candidates": d.hint.candidates.iter().map(|c| serde_json::json!({
                    "replica_id": c.replica_id.as_ref(),
                    "matched_tokens": c.matched_tokens,
                })).collect::<Vec<_>>(),
            },
            "ranking": d.choices.iter().map(|c| serde_json::json!({
                "engine": c.engine.id.as_ref(),
                "cost": c.cost,
                "reusable_tokens": c.reusable,
                "healthy": c.engine.healthy(),
                "in_flight": c.engine.in_flight(),
                "pending_prefill_tokens": c.engine.pending_prefill(),
                "reusable_from_pending": c.pending,
                "withheld_tokens": c.withheld,
            })).collect::<Vec<_>>(),
        }))
        .into_response(),
    }
}

async fn passthrough(
    State(s): St,
    method: Method,
    headers: HeaderMap,
    uri: Uri,
    body: Bytes,
) -> Response {
    let start = Instant::now();
    let model = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v["model"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let (engines, _) = eligible(&s, &model);
    let req = pick::Request {
        prompt_tokens: 0,
        chain: &[],
        seed: 0,
    };
    let (choices, reason) = pick::rank(&engines, &Hint::none("NO_HINT"), &req, &s.weights);
    debug_assert_eq!(reason, PickReason::LeastLoaded);
    let out = Outgoing {
        method,
        path_and_query: uri.path_and_query().map_or("/", |p| p.as_str()),
        headers: &headers,
        body,
        route: "other",
        start,
        reason: reason.as_str(),
        chain: &[],
        strip_usage: false,
    };
    proxy::forward(&s.upstream, &s.metrics, out, &choices, None).await
}

async fn models(State(s): St) -> Response {
    let engines = s.engines.snapshot();
    let asks = engines.iter().filter(|e| e.healthy()).map(|e| {
        let http = s.http.clone();
        let url = format!("{}/v1/models", e.spec.url);
        async move {
            let r = http
                .get(url)
                .timeout(crate::discover::PROBE_TIMEOUT)
                .send()
                .await
                .ok()?;
            serde_json::from_slice::<serde_json::Value>(&r.bytes().await.ok()?).ok()
        }
    });
    let answers = futures::future::join_all(asks).await;
    let mut data: Vec<serde_json::Value> = Vec::new();
    for a in answers.into_iter().flatten() {
        for m in a["data"].as_array().into_iter().flatten() {
            if !data.iter().any(|d| d["id"] == m["id"]) {
                data.push(m.clone());
            }
        }
    }
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

async fn health(State(s): St) -> Response {
    let engines = s.engines.snapshot();
    let up: Vec<&str> = engines
        .iter()
        .filter(|e| e.healthy())
        .map(|e| e.id.as_ref())
        .collect();
    let body = serde_json::json!({
        "healthy_engines": up,
        "engines": engines.len(),
    });
    let status = if up.is_empty() {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (status, axum::Json(body)).into_response()
}

async fn metrics(State(s): St) -> Response {
    s.metrics.refresh(&s.engines.snapshot());
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

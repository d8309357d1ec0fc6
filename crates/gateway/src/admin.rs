//! Engines added and removed while the gateway runs:
//! `GET /inferencecache/engines` (always), and with `--engine-admin`
//! `POST /inferencecache/engines` (`{"engine": "<an --engine value>"}`) and
//! `DELETE /inferencecache/engines/{id}`.
//!
//! An added engine is attached like one given at startup (its models, its
//! tokenizer, its KV-event subscriber, retried until it answers) and takes
//! traffic at once, routed by load until its events fill the index. A
//! removed engine takes no new request; those already on it finish; its
//! subscriber stops. Its blocks stay in the index until they age out, but
//! hints naming an engine that is not in the set are ignored.

use crate::config::EngineSpec;
use crate::discover;
use crate::engine::{Engine, Served};
use crate::http::St;
use crate::proxy::error;
use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;

fn describe(e: &Engine) -> Value {
    let served = e.served();
    json!({
        "id": e.id.as_ref(),
        "url": e.spec.url,
        "healthy": e.healthy(),
        "indexed": e.indexed.is_set(),
        "in_flight": e.in_flight(),
        "pending_prefill_tokens": e.pending_prefill(),
        "models": served.models,
        "adapters": served.adapters.iter().map(|(a, _)| a).collect::<Vec<_>>(),
    })
}

fn admin_off() -> Response {
    error(
        StatusCode::FORBIDDEN,
        "permission_error",
        "engine changes are off: start the gateway with --engine-admin to add and remove engines at runtime",
    )
}

/// `GET /inferencecache/engines`.
pub async fn list(State(s): St) -> Response {
    let engines = s.engines.snapshot();
    Json(json!({"engines": engines.iter().map(|e| describe(e)).collect::<Vec<_>>()}))
        .into_response()
}

/// `POST /inferencecache/engines`.
pub async fn add(State(s): St, body: axum::body::Bytes) -> Response {
    if !s.engine_admin {
        return admin_off();
    }
    let spec = match serde_json::from_slice::<Value>(&body)
        .ok()
        .and_then(|v| v["engine"].as_str().map(str::to_owned))
    {
        Some(spec) => spec,
        None => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                r#"the body must be {"engine": "URL[,id=..][,events=tcp://..][,replay=tcp://..]"} (an --engine value)"#,
            );
        }
    };
    let spec = match EngineSpec::parse(&spec) {
        Ok(spec) => spec,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &e.to_string(),
            );
        }
    };
    // An engine with another block size would be matched block for block
    // against chains it never stored.
    if let Some(b) = discover::block_size(&s.http, &spec.url).await {
        if b != s.block_size {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &format!(
                    "engine {} uses KV blocks of {b} tokens, this gateway's engines {}: one gateway routes engines of one block size",
                    spec.url, s.block_size
                ),
            );
        }
    }
    let engine = Arc::new(Engine::under(spec, Served::default(), &s.cancel));
    if let Err(there) = s.engines.add(Arc::clone(&engine)) {
        engine.retire();
        return error(
            StatusCode::CONFLICT,
            "invalid_request_error",
            &format!(
                "an engine with id {:?} is already routed ({}); remove it first or give id=...",
                there.id, there.spec.url
            ),
        );
    }
    tracing::info!(engine = %engine.id, url = %engine.spec.url, "engine_added");
    s.attach.clone().spawn(Arc::clone(&engine));
    (StatusCode::CREATED, Json(describe(&engine))).into_response()
}

/// `DELETE /inferencecache/engines/{id}`.
pub async fn remove(State(s): St, Path(id): Path<String>) -> Response {
    if !s.engine_admin {
        return admin_off();
    }
    match s.engines.remove(&id) {
        Some(e) => {
            tracing::info!(engine = %e.id, url = %e.spec.url, in_flight = e.in_flight(), "engine_removed");
            Json(describe(&e)).into_response()
        }
        None => error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            &format!("no engine {id:?}; GET /inferencecache/engines lists them"),
        ),
    }
}

//! `inferencecache gateway`: an OpenAI-compatible router in front of vLLM
//! (or SGLang) engines that sends each request where its prompt is already
//! cached, and fails open.
//!
//! Per request ([`http`]): parse the body, tokenize the prompt exactly as
//! the engine will (the model's chat template and tokenizer, the code the
//! server's `prompt_text` path uses: [`prompt`]), ask for a hint
//! ([`hints`]: the in-process index, or a remote server through the
//! fail-open SDK), rank the engines by the prefill work each would have
//! before this request's first token, from the hint's matched tokens and the
//! gateway's own load signal ([`pick`], [`engine`]), and forward the body
//! unchanged, streaming the answer back chunk by chunk ([`proxy`]). No hint,
//! a slow lookup or an unhealthy hinted engine all end in the least-loaded
//! engine; a refused connection moves the request to the next engine.
//!
//! In the default mode ([`embedded`]) the gateway runs `inferencecache
//! serve`'s index and one `inferencecache subscribe` sidecar per engine in
//! its own process, each engine's KV-event endpoints discovered from the
//! engine ([`discover`]). With a remote server it only asks.
//!
//! Every response's `usage.prompt_tokens_details.cached_tokens` is compared
//! with the reuse the hint promised ([`metrics`], [`usage`]): the engine is
//! the judge of a hint.

pub mod admin;
mod attach;
mod caller_load;
mod config;
pub mod discover;
pub mod embedded;
pub mod engine;
mod error;
pub mod foresight;
pub mod hints;
pub mod http;
pub mod metrics;
pub mod pending;
pub mod pick;
pub mod progress;
pub mod prompt;
pub mod proxy;
pub mod status;
pub mod upstream;
pub mod usage;

pub use config::{
    DEFAULT_CATCH_UP_TIMEOUT, DEFAULT_DECODE_WEIGHT_TOKENS, DEFAULT_DUPLICATE_WEIGHT_PCT,
    DEFAULT_ENGINE_IDLE_TIMEOUT, DEFAULT_EVENTS_WINDOW, DEFAULT_INTAKE_WEIGHT_PCT, DEFAULT_TENANT,
    EmbeddedIndex, EngineSpec, GatewayConfig, HintMode,
};
pub use error::GatewayError;

use attach::Attach;
use engine::{Engine, EngineSet, Served};
use hints::HintSource;
use prompt::Tokenizers;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// A started gateway.
#[derive(Debug)]
pub struct Running {
    /// Where the OpenAI API is served.
    pub addr: SocketAddr,
    /// The in-process index's listeners (embedded mode).
    pub index: Option<IndexAddrs>,
    /// The engines (live state; engines added or removed at runtime are
    /// in [`Running::engine_set`]).
    pub engines: Vec<Arc<Engine>>,
    /// The live set.
    pub engine_set: Arc<EngineSet>,
    tasks: JoinSet<Result<(), GatewayError>>,
    cancel: CancellationToken,
}

/// The embedded index's addresses.
#[derive(Debug, Clone, Copy)]
pub struct IndexAddrs {
    /// gRPC (`inferencecache lookup/state/watch --server`).
    pub grpc: SocketAddr,
    /// Status page (`/ui`) and `/snapshot`.
    pub control: SocketAddr,
    /// `/metrics`, `/readyz` of the index.
    pub http: SocketAddr,
}

/// The gateway.
#[derive(Debug)]
pub struct Gateway;

impl Gateway {
    /// Discovers the engines, starts the index and subscribers (embedded
    /// mode), binds the listener and serves until `cancel`.
    pub async fn start(
        config: GatewayConfig,
        cancel: CancellationToken,
    ) -> Result<Running, GatewayError> {
        config.validate()?;
        // Forwarded requests; a connection the engine closed under one is
        // retried on a fresh connection ([`upstream`]).
        let upstream = upstream::Upstream::new(config.connect_timeout, config.engine_idle_timeout)
            .map_err(|e| GatewayError::Config(format!("HTTP client: {e}")))?;
        // Discovery, health checks and scrapes: a pool of their own, so the
        // background polling neither takes nor keeps alive the connections
        // requests are forwarded on.
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .pool_idle_timeout(config.engine_idle_timeout)
            .build()
            .map_err(|e| GatewayError::Config(format!("HTTP client: {e}")))?;
        let block_size = match config.block_size {
            Some(b) => b,
            None => discover_block_size(&http, &config).await?,
        };
        let engines: Vec<Arc<Engine>> = config
            .engines
            .iter()
            .map(|s| Arc::new(Engine::under(s.clone(), Served::default(), &cancel)))
            .collect();
        let tokenizers = Arc::new(Tokenizers::default());
        for (model, dir) in &config.tokenizers {
            tokenizers.load(model, dir).map_err(|e| {
                GatewayError::Config(format!("--tokenizer {model}={}: {e}", dir.display()))
            })?;
        }
        let mut tasks = JoinSet::new();
        let (hints, index) = match &config.hints {
            HintMode::Embedded(settings) => {
                let e = embedded::start_index(settings, block_size, &mut tasks, &cancel).await?;
                let addrs = IndexAddrs {
                    grpc: e.grpc_addr,
                    control: e.control_addr,
                    http: e.http_addr,
                };
                (HintSource::Embedded(e.pipeline), Some((addrs, e.ingest)))
            }
            HintMode::Remote(addr) => {
                let endpoint = if addr.contains("://") {
                    addr.clone()
                } else {
                    format!("http://{addr}")
                };
                let client = inferencecache_client::Client::connect_lazy(
                    inferencecache_client::ClientConfig::new(endpoint)
                        .lookup_deadline(config.lookup_timeout),
                )
                .map_err(|e| GatewayError::Config(format!("--server {addr}: {e}")))?;
                (HintSource::Remote(client), None)
            }
        };
        // Attach every engine (models, tokenizer, subscriber); wait for them
        // up to the startup timeout, then keep trying in the background.
        let attach = Attach {
            http: http.clone(),
            tokenizers: Arc::clone(&tokenizers),
            tenant: config.tenant.clone(),
            hash_scheme: config.hash_scheme.clone(),
            index_ingest: index.as_ref().map(|(_, ingest)| ingest.clone()),
            eviction_foresight: config.eviction_foresight,
            events_window: config.events_window,
            catch_up_timeout: config.catch_up_timeout,
        };
        let mut pending = JoinSet::new();
        for e in &engines {
            let (a, e) = (attach.clone(), Arc::clone(e));
            pending.spawn(async move { a.run(e).await });
        }
        let deadline = tokio::time::Instant::now() + config.startup_timeout;
        let mut subscriber_tasks = JoinSet::new();
        loop {
            match tokio::time::timeout_at(deadline, pending.join_next()).await {
                Ok(Some(Ok(Some(t)))) => {
                    subscriber_tasks.spawn(t);
                }
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        waiting = pending.len(),
                        "engines not attached within the startup timeout; routing to them without hints until they are"
                    );
                    let mut subs = JoinSet::new();
                    std::mem::swap(&mut subs, &mut subscriber_tasks);
                    tasks.spawn(async move {
                        while let Some(r) = pending.join_next().await {
                            if let Ok(Some(t)) = r {
                                subs.spawn(t);
                            }
                        }
                        while subs.join_next().await.is_some() {}
                        Ok(())
                    });
                    break;
                }
            }
        }
        tasks.spawn(async move {
            while subscriber_tasks.join_next().await.is_some() {}
            Ok(())
        });
        let metrics = Arc::new(metrics::Metrics::new());
        let set = Arc::new(EngineSet::new(engines.clone()));
        if let HintSource::Remote(client) = &hints {
            // The server counts this gateway's requests in flight exactly.
            let (client, set, c) = (client.clone(), Arc::clone(&set), cancel.clone());
            tasks.spawn(async move {
                caller_load::report_loop(client, set, caller_load::caller_id(), c).await;
                Ok(())
            });
        }
        let shared = Arc::new(http::Shared {
            engines: Arc::clone(&set),
            attach,
            cancel: cancel.clone(),
            engine_admin: config.engine_admin,
            hints,
            tokenizers,
            metrics,
            http: http.clone(),
            upstream,
            tenant: config.tenant.clone(),
            hash_scheme: config.hash_scheme.clone(),
            block_size,
            lookup_timeout: config.lookup_timeout,
            weights: pick::Weights {
                block_size,
                decode_weight: config.decode_weight_tokens,
                duplicate_weight_pct: config.duplicate_weight_pct,
                intake_weight_pct: config.intake_weight_pct,
                pending_prefixes: config.pending_prefixes,
                prefill_progress: config.prefill_progress,
            },
            pending_prefixes: config.pending_prefixes,
            eviction_foresight: config.eviction_foresight,
            placing: std::sync::Mutex::new(()),
        });
        {
            let (engines, http, c) = (Arc::clone(&set), http.clone(), cancel.clone());
            let every = config.health_interval;
            tasks.spawn(async move {
                health_loop(engines, http, every, c).await;
                Ok(())
            });
        }
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| GatewayError::Bind {
                addr: config.listen.to_string(),
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|e| GatewayError::Serve(e.to_string()))?;
        let app = http::router(shared, config.max_body_bytes);
        let c = cancel.clone();
        // Every SSE chunk is a small write: without TCP_NODELAY, Nagle holds
        // each one back until the client acknowledges the previous.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
        });
        tasks.spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(c.cancelled_owned())
                .await
                .map_err(|e| GatewayError::Serve(e.to_string()))
        });
        Ok(Running {
            addr,
            index: index.map(|(addrs, _)| addrs),
            engines,
            engine_set: set,
            tasks,
            cancel,
        })
    }
}

impl Running {
    /// Waits until every task ended (after cancellation) or one failed
    /// (which stops the rest); returns the first failure.
    pub async fn wait(mut self) -> Result<(), GatewayError> {
        let mut first = None;
        while let Some(r) = self.tasks.join_next().await {
            let r = r
                .map_err(|e| GatewayError::Serve(e.to_string()))
                .and_then(|r| r);
            if let Err(e) = r {
                if first.is_none() {
                    tracing::error!(error = %e, "gateway task failed; shutting down");
                    self.cancel.cancel();
                    first = Some(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Reads the KV block size from the first engine that says, within the
/// startup timeout.
async fn discover_block_size(
    http: &reqwest::Client,
    config: &GatewayConfig,
) -> Result<u32, GatewayError> {
    let deadline = Instant::now() + config.startup_timeout;
    loop {
        for e in &config.engines {
            if let Some(b) = discover::block_size(http, &e.url).await {
                tracing::info!(engine = %e.id, block_size = b, "block size discovered");
                return Ok(b);
            }
        }
        if Instant::now() >= deadline {
            return Err(GatewayError::Config(format!(
                "no engine reported its KV block size (vllm:cache_config_info on /metrics) within {:?}; start the engines first or give --block-size",
                config.startup_timeout
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Checks every engine each `every`; a recovered engine's model list is
/// refreshed (LoRA adapters come and go).
async fn health_loop(
    engines: Arc<EngineSet>,
    http: reqwest::Client,
    every: Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let now = engines.snapshot();
        let checks = now.iter().map(|e| {
            let http = http.clone();
            async move {
                let up = discover::healthy(&http, &e.spec.url).await;
                if up {
                    if let Ok((served, _)) = discover::models(&http, &e.spec.url).await {
                        e.set_served(served);
                    }
                }
                if e.set_healthy(up) {
                    if up {
                        // Back after being down: it may have restarted with
                        // an empty cache (forgetting only returns its claims
                        // to the index's word).
                        e.foresight.reset();
                        tracing::info!(engine = %e.id, "engine_healthy");
                    } else {
                        tracing::warn!(engine = %e.id, "engine_unhealthy");
                    }
                }
            }
        });
        futures::future::join_all(checks).await;
    }
}

//! Attaching an engine: what it serves (`GET /v1/models`), its model's
//! tokenizer, and (embedded mode) its KV-event subscriber, retried until
//! the engine answers or is removed.

use crate::embedded;
use crate::engine::Engine;
use crate::{discover, prompt::Tokenizers};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

pub(crate) type SubscriberTask = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Attaching one engine: what it serves, its tokenizer, its subscriber.
#[derive(Clone)]
pub(crate) struct Attach {
    pub(crate) http: reqwest::Client,
    pub(crate) tokenizers: Arc<Tokenizers>,
    pub(crate) tenant: String,
    pub(crate) hash_scheme: String,
    /// Where the embedded index's subscribers report; `None` with a remote
    /// index.
    pub(crate) index_ingest: Option<embedded::IngestTo>,
    /// Model each engine's block pool ([`crate::foresight`]).
    pub(crate) eviction_foresight: bool,
    /// The subscribers' report window.
    pub(crate) events_window: Duration,
    /// How long an engine's claims wait for its history to reach the index.
    pub(crate) catch_up_timeout: Duration,
}

impl std::fmt::Debug for Attach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attach")
            .field("tenant", &self.tenant)
            .field("embedded", &self.index_ingest.is_some())
            .finish_non_exhaustive()
    }
}

impl Attach {
    /// Retries until the engine answers; returns the subscriber's task.
    pub(crate) async fn run(self, engine: Arc<Engine>) -> Option<SubscriberTask> {
        let cancel = engine.retired().clone();
        let mut warned = false;
        loop {
            match self.once(&engine, &cancel).await {
                Ok(task) => {
                    tracing::info!(engine = %engine.id, url = %engine.spec.url, served = ?engine.served().models, "engine attached");
                    return task;
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!(engine = %engine.id, error = %e, "engine not attached yet; retrying");
                        warned = true;
                    }
                }
            }
            tokio::select! {
                () = cancel.cancelled() => return None,
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn once(
        &self,
        engine: &Arc<Engine>,
        cancel: &CancellationToken,
    ) -> Result<Option<SubscriberTask>, String> {
        let (served, roots) = discover::models(&self.http, &engine.spec.url).await?;
        let Some(model) = served.index_model().map(str::to_owned) else {
            return Err("GET /v1/models lists no base model".into());
        };
        engine.set_served(served);
        if self.eviction_foresight && !engine.foresight.active() {
            self.start_foresight(engine).await;
        }
        for (m, dir) in roots {
            if !self.tokenizers.has(&m) {
                // Parsing a tokenizer is seconds of CPU on a loaded host:
                // off the runtime's workers, and once per model.
                let (t, dir2, m2) = (Arc::clone(&self.tokenizers), dir.clone(), m.clone());
                let loaded = tokio::task::spawn_blocking(move || t.load_once(&m2, &dir2))
                    .await
                    .unwrap_or_else(|e| Err(format!("loader panicked: {e}")));
                match loaded {
                    Ok(true) => {
                        tracing::info!(model = %m, dir = %dir.display(), "tokenizer loaded from the engine's model directory")
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(model = %m, error = %e, "tokenizer not loaded; this model is routed without hints")
                    }
                }
            }
        }
        if !self.tokenizers.has(&model) {
            tracing::warn!(model = %model, "no tokenizer for this model (its directory is not local): give --tokenizer MODEL=DIR; routed by load only");
        }
        let Some(ingest) = &self.index_ingest else {
            // A remote index is followed by its own sidecars.
            engine.indexed.set();
            return Ok(None);
        };
        let sources = discover::event_sources(&self.http, &engine.spec).await?;
        tracing::info!(engine = %engine.id, endpoint = %sources.endpoint, replay = ?sources.replay, ranks = sources.ranks, "KV events");
        let spec = embedded::SubscriberSpec {
            replica_id: engine.spec.id.clone(),
            model,
            sources,
            caught_up: engine.indexed.clone(),
        };
        let mut set = JoinSet::new();
        embedded::start_subscriber(
            &spec,
            &self.tenant,
            &self.hash_scheme,
            ingest,
            self.events_window,
            &mut set,
            cancel,
        )
        .await
        .map_err(|e| e.to_string())?;
        self.watch_catch_up(engine, cancel.clone());
        let id = engine.id.clone();
        Ok(Some(Box::pin(async move {
            while let Some(r) = set.join_next().await {
                if let Ok(Err(e)) = r {
                    tracing::error!(engine = %id, error = %e, "KV-event subscriber stopped; this engine's hints go stale");
                }
            }
        })))
    }

    /// Logs when the engine's history reaches the index, or gives up
    /// waiting after `catch_up_timeout` and uses its claims on live events
    /// alone (loudly: they may name blocks dropped before the gateway
    /// started until the engine evicts or restores them).
    fn watch_catch_up(&self, engine: &Arc<Engine>, cancel: CancellationToken) {
        let (signal, id, wait) = (
            engine.indexed.clone(),
            engine.id.clone(),
            self.catch_up_timeout,
        );
        let started = std::time::Instant::now();
        tokio::spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                () = signal.wait() => {
                    tracing::info!(engine = %id, after_ms = started.elapsed().as_millis() as u64, "KV-event history indexed; hints for this engine count from now");
                }
                () = tokio::time::sleep(wait) => {
                    tracing::warn!(engine = %id, waited_ms = wait.as_millis() as u64, "the engine's KV-event history has not reached the index (replay unanswered or the event endpoint unreachable); using its hints on live events from now: they may claim blocks it dropped before the gateway started");
                    signal.set();
                }
            }
        });
    }

    /// Reads the engine's KV pool from its `/metrics` and starts modelling
    /// it; without it (not vLLM, a hybrid model, metrics unreachable) the
    /// engine's claims are the index's, as without foresight.
    async fn start_foresight(&self, engine: &Arc<Engine>) {
        let url = format!("{}/metrics", engine.spec.url);
        let body = match self.http.get(&url).send().await {
            Ok(r) if r.status().is_success() => r.text().await.map_err(|e| e.to_string()),
            Ok(r) => Err(format!("HTTP {}", r.status())),
            Err(e) => Err(e.to_string()),
        };
        match body.and_then(|b| crate::foresight::kv_pool(&b).map_err(str::to_owned)) {
            Ok(pool) => {
                tracing::info!(engine = %engine.id, blocks = pool.usable_blocks, block_size = pool.block_size, "eviction foresight on");
                engine.foresight.start(pool);
            }
            Err(why) => {
                tracing::warn!(engine = %engine.id, url = %url, reason = %why, "eviction foresight off for this engine: its hints may claim blocks that requests already sent to it evict");
            }
        }
    }

    /// Attaches `engine` in the background (an engine added at runtime):
    /// its subscriber runs until the engine is retired.
    pub(crate) fn spawn(self, engine: Arc<Engine>) {
        tokio::spawn(async move {
            if let Some(task) = self.run(engine).await {
                task.await;
            }
        });
    }
}

//! Attaching an engine: what it serves (`GET /v1/models`), its model's
//! tokenizer, and (embedded mode) its KV-event subscriber, retried until
//! the engine answers or is removed.

use crate::embedded;
use crate::engine::Engine;
use crate::{discover, prompt::Tokenizers};
use std::net::SocketAddr;
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
    pub(crate) index_grpc: Option<SocketAddr>,
}

impl std::fmt::Debug for Attach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attach")
            .field("tenant", &self.tenant)
            .field("index_grpc", &self.index_grpc)
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
        for (m, dir) in roots {
            if !self.tokenizers.has(&m) {
                match self.tokenizers.load(&m, &dir) {
                    Ok(()) => {
                        tracing::info!(model = %m, dir = %dir.display(), "tokenizer loaded from the engine's model directory")
                    }
                    Err(e) => {
                        tracing::warn!(model = %m, error = %e, "tokenizer not loaded; this model is routed without hints")
                    }
                }
            }
        }
        if !self.tokenizers.has(&model) {
            tracing::warn!(model = %model, "no tokenizer for this model (its directory is not local): give --tokenizer MODEL=DIR; routed by load only");
        }
        let Some(grpc) = self.index_grpc else {
            return Ok(None);
        };
        let sources = discover::event_sources(&self.http, &engine.spec).await?;
        tracing::info!(engine = %engine.id, endpoint = %sources.endpoint, replay = ?sources.replay, ranks = sources.ranks, "KV events");
        let spec = embedded::SubscriberSpec {
            replica_id: engine.spec.id.clone(),
            model,
            sources,
        };
        let mut set = JoinSet::new();
        embedded::start_subscriber(
            &spec,
            &self.tenant,
            &self.hash_scheme,
            grpc,
            &mut set,
            cancel,
        )
        .await
        .map_err(|e| e.to_string())?;
        let id = engine.id.clone();
        Ok(Some(Box::pin(async move {
            while let Some(r) = set.join_next().await {
                if let Ok(Err(e)) = r {
                    tracing::error!(engine = %id, error = %e, "KV-event subscriber stopped; this engine's hints go stale");
                }
            }
        })))
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

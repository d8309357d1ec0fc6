//! Real vLLM engines (`testkit::vllm`) with `inferencecache serve` and one
//! `inferencecache subscribe` per engine, each with its default flags (only
//! addresses and names given), and the LookupRoute calls a gateway makes.
//! Include with `mod common; #[path = "common/engine.rs"] mod engine;
//! #[path = "common/real_chain.rs"] mod real_chain;`.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use super::engine::{Proc, serve};
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::{
    EngineLoad, GetCacheStateRequest, LookupRouteRequest, LookupRouteResponse,
};
use inferencecache_testkit::vllm::{self, Engine, EngineConfig, Model, ModelKind};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The tenant every sidecar reports under.
pub(crate) const TENANT: &str = "t";

/// Boots are slow and the machine has two cores: one chain at a time per
/// test binary.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Engines, the server and a sidecar per engine.
pub(crate) struct Chain {
    /// The engines, replica `r{i}` each.
    pub engines: Vec<Engine>,
    /// `inferencecache serve`.
    pub server: Proc,
    /// `inferencecache subscribe` per engine (`None` once stopped).
    pub sidecars: Vec<Option<Proc>>,
    /// The model the engines serve.
    pub model: Model,
    /// The vLLM venv (to restart an engine).
    pub venv: std::path::PathBuf,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

/// The venv and the tiny model, or `None` (skipped) without real vLLM.
pub(crate) fn model(kind: ModelKind) -> Option<(std::path::PathBuf, Model)> {
    let venv = vllm::venv()?;
    let m = vllm::model(&venv, kind);
    Some((venv, m))
}

impl Chain {
    /// Starts `configs` engines (in parallel), the server with `serve_args`
    /// and a sidecar per engine with `sidecar_args`.
    pub(crate) async fn start(
        venv: &std::path::Path,
        model: &Model,
        configs: Vec<EngineConfig>,
        serve_args: &[&str],
        sidecar_args: &[&str],
    ) -> Self {
        let turn = ONE_AT_A_TIME.lock().await;
        let t0 = Instant::now();
        let engines = Engine::start_all(venv, configs).await;
        eprintln!("engines ready in {:?}", t0.elapsed());
        let server = serve(serve_args);
        let grpc = server.addr("grpc_addr");
        let sidecars = engines
            .iter()
            .enumerate()
            .map(|(i, e)| Some(sidecar(e, &replica(i), &grpc, sidecar_args)))
            .collect();
        Self {
            engines,
            server,
            sidecars,
            model: model.clone(),
            venv: venv.to_owned(),
            _turn: turn,
        }
    }

    /// The server's gRPC address.
    pub(crate) fn grpc(&self) -> String {
        self.server.addr("grpc_addr")
    }

    /// The model id engine `i` serves (and its sidecar reports).
    pub(crate) fn model_id(&self, i: usize) -> String {
        self.engines[i].config.served_name.clone()
    }

    /// A LookupRoute by `token_ids` (and `salt`) for engine `i`'s model.
    pub(crate) fn request(&self, i: usize, tokens: &[u32], salt: &str) -> LookupRouteRequest {
        LookupRouteRequest {
            model_id: self.model_id(i),
            tenant_id: TENANT.into(),
            hash_scheme: "vllm".into(),
            token_ids: tokens.to_vec(),
            cache_salt: salt.to_owned(),
            ..LookupRouteRequest::default()
        }
    }

    /// Polls until the server says replica `i` holds `want` tokens of
    /// `tokens` (under `salt`): the engine's events have arrived. Shadow
    /// lookups ([`Self::peek`]): the probes are never sent to an engine, so
    /// they must not count as delivered hints (a never-sent probe's
    /// tentative holding and its request in eviction foresight's model
    /// changed later steps' claims, sessions 45-46).
    pub(crate) async fn wait_held(&self, i: usize, tokens: &[u32], salt: &str, want: i32) {
        let req = self.request(i, tokens, salt);
        let r = replica(i);
        self.wait_for(
            &req,
            Duration::from_secs(20),
            "stored blocks reach lookups",
            |a| hint_for(a, &r).1 == want,
        )
        .await;
    }

    /// One LookupRoute: a delivered hint (the caller then sends the
    /// request where it points).
    pub(crate) async fn lookup(&self, req: LookupRouteRequest) -> LookupRouteResponse {
        self.call_lookup(req, false).await
    }

    /// One shadow LookupRoute (`x-inferencecache-shadow: true`): the same
    /// answer, no delivery recorded. For checks the test never sends.
    pub(crate) async fn peek(&self, req: LookupRouteRequest) -> LookupRouteResponse {
        self.call_lookup(req, true).await
    }

    async fn call_lookup(&self, req: LookupRouteRequest, shadow: bool) -> LookupRouteResponse {
        let mut c = InferenceCacheClient::connect(format!("http://{}", self.grpc()))
            .await
            .unwrap();
        let mut req = tonic::Request::new(req);
        if shadow {
            req.metadata_mut()
                .insert("x-inferencecache-shadow", "true".parse().unwrap());
        }
        c.lookup_route(req).await.unwrap().into_inner()
    }

    /// Polls shadow lookups ([`Self::peek`]) until `want` holds for the
    /// answer (panics with the last answer after `within`).
    pub(crate) async fn wait_for(
        &self,
        req: &LookupRouteRequest,
        within: Duration,
        what: &str,
        want: impl Fn(&LookupRouteResponse) -> bool,
    ) -> LookupRouteResponse {
        let deadline = Instant::now() + within;
        loop {
            let r = self.peek(req.clone()).await;
            if want(&r) {
                return r;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not within {within:?}; last answer {r:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A completion of `tokens` on engine `i`: (prompt tokens, cached tokens).
    pub(crate) async fn complete(&self, i: usize, tokens: &[u32], extra: Value) -> (u64, u64) {
        self.engines[i].complete(json!(tokens), extra).await
    }

    /// The engine load the server holds for replica `i` (GetCacheState):
    /// `None` before its sidecar's first report.
    pub(crate) async fn load(&self, i: usize) -> Option<EngineLoad> {
        let mut c = InferenceCacheClient::connect(format!("http://{}", self.grpc()))
            .await
            .unwrap();
        let st = c
            .get_cache_state(GetCacheStateRequest {
                model_id: self.model_id(i),
                tenant_id: TENANT.into(),
            })
            .await
            .unwrap()
            .into_inner();
        let r = replica(i);
        st.replicas.into_iter().find(|s| s.replica_id == r)?.load
    }

    /// The server's `/metrics` body.
    pub(crate) fn server_metrics(&self) -> String {
        super::common::http_get(&self.server.addr("http_addr"), "/metrics").1
    }
}

/// Replica id of engine `i`.
pub(crate) fn replica(i: usize) -> String {
    format!("r{i}")
}

/// `inferencecache subscribe` next to `engine` with default flags.
pub(crate) fn sidecar(engine: &Engine, replica: &str, server_grpc: &str, extra: &[&str]) -> Proc {
    let metrics = format!("{}/metrics", engine.url);
    let (events, replay) = (engine.events_endpoint(), engine.replay_endpoint());
    let mut args = vec![
        "subscribe",
        "--replica-id",
        replica,
        "--model-id",
        &engine.config.served_name,
        "--tenant-id",
        TENANT,
        "--engine-endpoint",
        &events,
        "--replay-endpoint",
        &replay,
        "--server",
        server_grpc,
        "--engine-metrics-url",
        &metrics,
        "--http-bind-address",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    Proc::start(&args)
}

/// (reason, matched tokens) the answer gives `replica` (0 when it names
/// another one, or none).
pub(crate) fn hint_for(r: &LookupRouteResponse, replica: &str) -> (String, i32) {
    let matched = r
        .replica_scores
        .iter()
        .find(|s| s.replica_id == replica)
        .map_or(0, |s| s.matched_tokens);
    (r.reason_code.clone(), matched)
}

/// Random-looking token ids (a fixed LCG per seed), inside the model's
/// vocabulary and clear of its special tokens.
pub(crate) fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            1_000 + ((x >> 33) % 30_000) as u32
        })
        .collect()
}

/// `a` followed by `b`.
pub(crate) fn cat(a: &[u32], b: &[u32]) -> Vec<u32> {
    let mut v = a.to_vec();
    v.extend_from_slice(b);
    v
}

/// One hint judged by the engine: what the server claimed for the replica
/// the request went to, and what the engine then reused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Judged {
    /// The step it belongs to.
    pub step: String,
    /// The engine the request went to.
    pub engine: usize,
    /// The answer's reason code.
    pub reason: String,
    /// Matched tokens claimed for the replica.
    pub hinted: i32,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub reused: u64,
}

/// Prints how many of `judged` were exact and fails on any hint the engine
/// did not confirm (over or under).
pub(crate) fn assert_every_hint_exact(what: &str, judged: &[Judged]) {
    let wrong: Vec<&Judged> = judged
        .iter()
        .filter(|j| u64::try_from(j.hinted).unwrap() != j.reused)
        .collect();
    eprintln!(
        "{what}: {} of {} judged hints exact",
        judged.len() - wrong.len(),
        judged.len()
    );
    assert!(
        wrong.is_empty(),
        "hints the engine did not confirm: {wrong:#?}"
    );
}

impl Chain {
    /// A gateway's turn: looks `tokens` up (with `salt`), sends them where
    /// the answer points (its first replica; engine `fallback` when it names
    /// none) and returns what was claimed for that replica and what its
    /// engine reused.
    pub(crate) async fn judge(
        &self,
        step: &str,
        tokens: &[u32],
        salt: &str,
        fallback: usize,
    ) -> Judged {
        let r = self.lookup(self.request(fallback, tokens, salt)).await;
        let engine = r
            .replica_scores
            .first()
            .and_then(|s| s.replica_id.strip_prefix('r')?.parse::<usize>().ok())
            .unwrap_or(fallback);
        let (reason, hinted) = hint_for(&r, &replica(engine));
        let extra = if salt.is_empty() {
            json!({})
        } else {
            json!({ "cache_salt": salt })
        };
        let (_, reused) = self.complete(engine, tokens, extra).await;
        let j = Judged {
            step: step.to_owned(),
            engine,
            reason,
            hinted,
            reused,
        };
        eprintln!("{j:?}");
        j
    }
}

/// Starts the chain with `engines` Qwen3 engines (names `qwen-{i}`... all
/// one model id `qwen`), cores 0 and 1, after `tweak`s each config.
pub(crate) async fn qwen_chain(
    n: usize,
    serve_args: &[&str],
    sidecar_args: &[&str],
    tweak: impl Fn(&mut EngineConfig),
) -> Option<Chain> {
    let (venv, m) = model(ModelKind::Qwen3)?;
    let configs = (0..n)
        .map(|i| {
            let mut c = EngineConfig::new(&m, "qwen", i % 2);
            tweak(&mut c);
            c
        })
        .collect();
    Some(Chain::start(&venv, &m, configs, serve_args, sidecar_args).await)
}

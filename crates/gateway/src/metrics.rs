//! The gateway's metrics, in the shapes the routers of the ecosystem use
//! (`sgl_router_*` / `vllm_router_*`: requests by route, per-worker running
//! and processed requests, retries, worker health; vLLM's
//! `time_to_first_token_seconds`), under `inferencecache_gateway_`, plus
//! what only a cache-aware router can say: why each engine was picked, and
//! how accurate the hints were as the engine itself judged them
//! (`usage.prompt_tokens_details.cached_tokens` against the hint).

use crate::engine::Engine;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Arc;

type Labels = Vec<(&'static str, String)>;

fn latency_buckets() -> Vec<f64> {
    vec![
        0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
        2.5, 5.0, 10.0, 30.0, 60.0,
    ]
}

/// Finer at the bottom than [`latency_buckets`]: the gateway's own phases
/// are tens to hundreds of microseconds, and the targets are 0.5 / 2 ms.
fn phase_buckets() -> Vec<f64> {
    vec![
        0.000_025, 0.000_05, 0.000_1, 0.000_2, 0.000_3, 0.000_5, 0.000_75, 0.001, 0.001_5, 0.002,
        0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ]
}

fn diff_buckets() -> Vec<f64> {
    vec![
        -4096.0, -1024.0, -256.0, -64.0, -16.0, -1.0, 0.0, 16.0, 64.0, 256.0, 1024.0, 4096.0,
    ]
}

/// The phases of a routed request's time to first byte
/// (`inferencecache_gateway_phase_seconds{phase}`): what is the gateway's own
/// and what is the engine's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Arrival to the request leaving for the engine.
    PreForward,
    /// Request sent to the engine's response headers.
    UpstreamHeaders,
    /// Request sent to the engine's first body byte.
    UpstreamFirstByte,
    /// The engine's first body byte received to handed to the client's
    /// connection (the relay's own work on it).
    RelayFirstByte,
}

impl Phase {
    /// The label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PreForward => "pre_forward",
            Self::UpstreamHeaders => "upstream_headers",
            Self::UpstreamFirstByte => "upstream_first_byte",
            Self::RelayFirstByte => "relay_first_byte",
        }
    }
}

/// Every gateway metric.
#[derive(Debug)]
pub struct Metrics {
    /// The registry `/metrics` encodes.
    pub registry: Registry,
    requests: Family<Labels, Counter>,
    duration: Family<Labels, Histogram>,
    ttft: Family<Labels, Histogram>,
    decisions: Family<Labels, Counter>,
    lookups: Family<Labels, Counter>,
    lookup_duration: Histogram,
    fallbacks: Family<Labels, Counter>,
    retries: Family<Labels, Counter>,
    stale_retries: Family<Labels, Counter>,
    processed: Family<Labels, Counter>,
    running: Family<Labels, Gauge>,
    pending_prefill: Family<Labels, Gauge>,
    health: Family<Labels, Gauge>,
    prompt_tokens: Family<Labels, Counter>,
    cached_tokens: Family<Labels, Counter>,
    generation_tokens: Family<Labels, Counter>,
    hint_diff: Family<Labels, Histogram>,
    hint_overclaims: Family<Labels, Counter>,
    hint_checks: Family<Labels, Counter>,
    routing_overhead: Histogram,
    phases: Family<Labels, Histogram>,
}

fn worker(e: &Engine) -> Labels {
    vec![("worker", e.id.to_string())]
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        // Every name below is under this prefix (`inferencecache_gateway_requests`, ...).
        let mut r = Registry::with_prefix("inferencecache_gateway");
        let hist = || Histogram::new(latency_buckets());
        let m = Self {
            requests: Family::default(),
            duration: Family::new_with_constructor(|| Histogram::new(latency_buckets())),
            ttft: Family::new_with_constructor(|| Histogram::new(latency_buckets())),
            decisions: Family::default(),
            lookups: Family::default(),
            lookup_duration: hist(),
            fallbacks: Family::default(),
            retries: Family::default(),
            stale_retries: Family::default(),
            processed: Family::default(),
            running: Family::default(),
            pending_prefill: Family::default(),
            health: Family::default(),
            prompt_tokens: Family::default(),
            cached_tokens: Family::default(),
            generation_tokens: Family::default(),
            hint_diff: Family::new_with_constructor(|| Histogram::new(diff_buckets())),
            hint_overclaims: Family::default(),
            hint_checks: Family::default(),
            routing_overhead: hist(),
            phases: Family::new_with_constructor(|| Histogram::new(phase_buckets())),
            registry: Registry::default(),
        };
        r.register(
            "requests",
            "Requests answered, by route and HTTP status",
            m.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Request duration at the gateway, by route (streams: to the last byte)",
            m.duration.clone(),
        );
        r.register("time_to_first_token_seconds", "Time from the request's arrival to the engine's first response byte, by route and worker", m.ttft.clone());
        r.register("routing_decisions", "Why each request went where it went: prefix_match, pending_match, affinity, least_loaded, load_override, catching_up", m.decisions.clone());
        r.register("hint_lookups", "Hint lookups by reason code (the contract's codes; DEADLINE_EXCEEDED / UNAVAILABLE from the SDK)", m.lookups.clone());
        r.register(
            "hint_lookup_duration_seconds",
            "Time spent asking for a hint",
            m.lookup_duration.clone(),
        );
        r.register(
            "fallbacks",
            "Requests routed without a usable hint, by cause",
            m.fallbacks.clone(),
        );
        r.register("retries", "Requests moved to the next engine after a refused connection, by the worker that refused", m.retries.clone());
        r.register("stale_connection_retries", "Requests sent again on a fresh connection after the worker closed a kept-alive one under them before any response byte (its keep-alive timer), by worker", m.stale_retries.clone());
        r.register(
            "processed_requests",
            "Requests sent to each worker",
            m.processed.clone(),
        );
        r.register(
            "running_requests",
            "Requests in flight on each worker (the gateway's own count)",
            m.running.clone(),
        );
        r.register(
            "pending_prefill_tokens",
            "Uncached prompt tokens dispatched to each worker and not yet prefilled",
            m.pending_prefill.clone(),
        );
        r.register(
            "worker_health",
            "1 when the worker's last health check passed",
            m.health.clone(),
        );
        r.register(
            "prompt_tokens",
            "Prompt tokens by worker, from the engines' usage",
            m.prompt_tokens.clone(),
        );
        r.register("cached_prompt_tokens", "Prompt tokens the engines served from their prefix cache (usage.prompt_tokens_details.cached_tokens)", m.cached_tokens.clone());
        r.register(
            "generation_tokens",
            "Completion tokens by worker, from the engines' usage",
            m.generation_tokens.clone(),
        );
        r.register("hint_accuracy_diff_tokens", "cached_tokens the engine reported minus the tokens the gateway expected it to reuse, per worker (negative: the hint over-claimed)", m.hint_diff.clone());
        r.register(
            "hint_overclaims",
            "Responses whose engine reused fewer tokens than the hint claimed, per worker",
            m.hint_overclaims.clone(),
        );
        r.register(
            "hint_checks",
            "Responses whose usage was compared with the hint, per worker",
            m.hint_checks.clone(),
        );
        r.register(
            "routing_overhead_seconds",
            "The gateway's own time before forwarding: parse, tokenize, lookup, pick",
            m.routing_overhead.clone(),
        );
        r.register(
            "phase_seconds",
            "Where a routed request's time to first byte goes, by phase: pre_forward (arrival to the request leaving for the engine: parse, tokenize, lookup, pick, build), upstream_headers (request sent to the engine's response headers), upstream_first_byte (request sent to the engine's first body byte), relay_first_byte (that byte received to handed to the client's connection)",
            m.phases.clone(),
        );
        Self { registry: r, ..m }
    }

    /// One answered request.
    pub fn request(&self, route: &str, status: u16, seconds: f64) {
        self.requests
            .get_or_create(&vec![
                ("route", route.to_owned()),
                ("status", status.to_string()),
            ])
            .inc();
        self.duration
            .get_or_create(&vec![("route", route.to_owned())])
            .observe(seconds);
    }

    /// The first response byte of a request on `engine`.
    pub fn first_token(&self, route: &str, engine: &Engine, seconds: f64) {
        self.ttft
            .get_or_create(&vec![
                ("route", route.to_owned()),
                ("worker", engine.id.to_string()),
            ])
            .observe(seconds);
    }

    /// A routing decision.
    pub fn decision(&self, reason: &str) {
        self.decisions
            .get_or_create(&vec![("reason", reason.to_owned())])
            .inc();
    }

    /// A hint lookup.
    pub fn lookup(&self, code: &str, seconds: f64) {
        self.lookups
            .get_or_create(&vec![("code", code.to_owned())])
            .inc();
        self.lookup_duration.observe(seconds);
    }

    /// A request routed without a usable hint.
    pub fn fallback(&self, cause: &str) {
        self.fallbacks
            .get_or_create(&vec![("cause", cause.to_owned())])
            .inc();
    }

    /// A refused connection moved the request on.
    pub fn retry(&self, engine: &Engine) {
        self.retries.get_or_create(&worker(engine)).inc();
    }

    /// A request resent on a fresh connection after `engine` closed a
    /// pooled one under it ([`crate::upstream`]).
    pub fn stale_retry(&self, engine: &Engine) {
        self.stale_retries.get_or_create(&worker(engine)).inc();
    }

    /// A request sent to `engine`.
    pub fn processed(&self, engine: &Engine) {
        self.processed.get_or_create(&worker(engine)).inc();
    }

    /// The gateway's time before forwarding.
    pub fn overhead(&self, seconds: f64) {
        self.routing_overhead.observe(seconds);
    }

    /// One phase of a routed request ([`Phase`]).
    pub fn phase(&self, phase: Phase, seconds: f64) {
        self.phases
            .get_or_create(&vec![("phase", phase.as_str().to_owned())])
            .observe(seconds);
    }

    /// A response's usage, compared with what the hint let the gateway expect.
    pub fn usage(&self, engine: &Engine, u: &crate::usage::Usage, expected_reuse: u64) {
        let w = worker(engine);
        self.prompt_tokens.get_or_create(&w).inc_by(u.prompt_tokens);
        self.generation_tokens
            .get_or_create(&w)
            .inc_by(u.completion_tokens);
        let Some(cached) = u.cached_tokens else {
            return;
        };
        self.cached_tokens.get_or_create(&w).inc_by(cached);
        self.hint_checks.get_or_create(&w).inc();
        #[allow(clippy::cast_precision_loss)]
        let diff = cached as f64 - expected_reuse as f64;
        self.hint_diff.get_or_create(&w).observe(diff);
        if cached < expected_reuse {
            self.hint_overclaims.get_or_create(&w).inc();
        }
    }

    /// Refreshes the per-worker gauges (called before each scrape).
    pub fn refresh(&self, engines: &[Arc<Engine>]) {
        for e in engines {
            let w = worker(e);
            let g = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            self.running.get_or_create(&w).set(g(e.in_flight()));
            self.pending_prefill
                .get_or_create(&w)
                .set(g(e.pending_prefill()));
            self.health.get_or_create(&w).set(i64::from(e.healthy()));
        }
    }

    /// The classic Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

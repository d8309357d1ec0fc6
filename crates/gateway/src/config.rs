//! The gateway's settings (the CLI's flags, validated) and the `--engine`
//! value syntax.

use crate::error::GatewayError;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// One engine behind the gateway: `URL[,id=REPLICA][,events=tcp://..][,replay=tcp://..]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSpec {
    /// Base URL of its OpenAI server, without a trailing slash.
    pub url: String,
    /// The replica id its KV events are indexed under (default: `host:port`).
    pub id: String,
    /// KV-event publisher endpoint; `None`: ask the engine (`GET /kv_event_sources`).
    pub events: Option<String>,
    /// Replay endpoint; `None`: the engine's, when it has one.
    pub replay: Option<String>,
}

impl EngineSpec {
    /// Parses an `--engine` value.
    pub fn parse(spec: &str) -> Result<Self, GatewayError> {
        let bad = |why: &str| GatewayError::Config(format!("--engine {spec:?}: {why}"));
        let mut parts = spec.split(',').map(str::trim);
        let url = parts.next().unwrap_or_default().trim_end_matches('/');
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("needs an http:// URL, e.g. http://127.0.0.1:8000"))?;
        let host_port = rest.split('/').next().unwrap_or_default();
        if host_port.is_empty() {
            return Err(bad("the URL has no host"));
        }
        let mut out = Self {
            url: url.to_owned(),
            id: host_port.to_owned(),
            events: None,
            replay: None,
        };
        for part in parts.filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| bad("options are key=value: id=, events=, replay="))?;
            let v = v.trim();
            if v.is_empty() {
                return Err(bad(&format!("{k}= is empty")));
            }
            match k.trim() {
                "id" => out.id = v.to_owned(),
                "events" | "replay" if !v.contains("://") => {
                    return Err(bad(&format!(
                        "{k}={v} needs a transport, e.g. tcp://127.0.0.1:5557"
                    )));
                }
                "events" => out.events = Some(v.to_owned()),
                "replay" => out.replay = Some(v.to_owned()),
                other => {
                    return Err(bad(&format!(
                        "unknown option {other:?} (id, events, replay)"
                    )));
                }
            }
        }
        Ok(out)
    }

    /// The host part of the URL (what `*` in a discovered endpoint means).
    pub fn host(&self) -> &str {
        let rest = self.url.trim_start_matches("http://");
        let host_port = rest.split('/').next().unwrap_or_default();
        if let Some(v6) = host_port.strip_prefix('[') {
            return v6.split(']').next().unwrap_or_default();
        }
        host_port.rsplit_once(':').map_or(host_port, |(h, _)| h)
    }
}

/// Where hints come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HintMode {
    /// One machine: the index and one KV-event subscriber per engine run
    /// inside the gateway.
    Embedded(EmbeddedIndex),
    /// A remote `inferencecache serve` (gRPC address); its subscribers run
    /// next to the engines.
    Remote(String),
}

/// Settings of the in-process index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmbeddedIndex {
    /// Its gRPC listener (the subscribers report here; `inferencecache
    /// lookup/state/watch` can attach). Loopback, any port by default.
    pub grpc_addr: SocketAddr,
    /// Its control listener (`/ui` status page, `/snapshot`).
    pub control_addr: SocketAddr,
    /// Its public listener (`/metrics` of the index, `/readyz`).
    pub http_addr: SocketAddr,
    /// The subscribers report over loopback gRPC, as a remote sidecar
    /// does, instead of to the index's ingest directly: the path before
    /// session 47, kept to compare the two.
    pub ingest_over_grpc: bool,
}

impl Default for EmbeddedIndex {
    fn default() -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            grpc_addr: any,
            control_addr: any,
            http_addr: any,
            ingest_over_grpc: false,
        }
    }
}

/// Everything [`crate::Gateway::start`] needs.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Where the OpenAI API is served.
    pub listen: SocketAddr,
    /// The engines.
    pub engines: Vec<EngineSpec>,
    /// Hint source.
    pub hints: HintMode,
    /// Tenant the engines' blocks are indexed under.
    pub tenant: String,
    /// Hash scheme the subscribers report (`vllm` or `sglang`).
    pub hash_scheme: String,
    /// Engine KV block size; `None`: read from the engines' `/metrics`.
    pub block_size: Option<u32>,
    /// `MODEL=DIR` tokenizers; models without one use the engine's model
    /// directory when it is local, else route without hints.
    pub tokenizers: Vec<(String, PathBuf)>,
    /// Longest a lookup may take before the request is routed without it.
    pub lookup_timeout: Duration,
    /// Engine health-check period.
    pub health_interval: Duration,
    /// Connect timeout towards an engine (a refused or slow connect moves
    /// the request to the next engine).
    pub connect_timeout: Duration,
    /// How long an idle kept-alive connection to an engine is kept: below
    /// the engines' own keep-alive (vLLM: 5 s), so the gateway closes it
    /// first ([`crate::upstream`]).
    pub engine_idle_timeout: Duration,
    /// Prefill-token equivalent of one running request in the pick's cost.
    pub decode_weight_tokens: u64,
    /// Percent of a prefix's tokens the pick charges for caching a second
    /// copy of it on another engine ([`crate::pick`]).
    pub duplicate_weight_pct: u64,
    /// Percent of a prompt's uncached tokens charged per token an engine's
    /// cache has taken in beyond the least-filled engine's, up to the
    /// prompt's own uncached tokens ([`crate::pick`]; 0: a tie-break only).
    pub intake_weight_pct: u64,
    /// How long the embedded subscribers batch an engine's block stores
    /// before reporting them to the index (removals go at once).
    pub events_window: Duration,
    /// Count prefixes routed moments ago, before the index hears of them
    /// ([`crate::pending`]).
    pub pending_prefixes: bool,
    /// Withhold from a claim the blocks the requests already sent to an
    /// engine will evict before it gets to this one ([`crate::foresight`]).
    pub eviction_foresight: bool,
    /// Price what is left of an engine's in-flight prefills, by its learned
    /// prefill rate, rather than the tokens sent ([`crate::progress`]).
    pub prefill_progress: bool,
    /// Serve `POST/DELETE /inferencecache/engines` (engines added and
    /// removed at runtime). Off by default: whoever reaches the gateway
    /// could otherwise point it at any host.
    pub engine_admin: bool,
    /// Largest request body accepted.
    pub max_body_bytes: usize,
    /// How long discovery waits for the engines at startup.
    pub startup_timeout: Duration,
    /// How long an engine's claims wait for its event history to reach the
    /// in-process index (its subscriber's first replay) before the gateway
    /// uses them anyway, on live events only (a warning).
    pub catch_up_timeout: Duration,
}

impl GatewayConfig {
    /// Defaults for `engines` in embedded mode, listening on `listen`.
    pub fn new(listen: SocketAddr, engines: Vec<EngineSpec>) -> Self {
        Self {
            listen,
            engines,
            hints: HintMode::Embedded(EmbeddedIndex::default()),
            tenant: DEFAULT_TENANT.to_owned(),
            hash_scheme: "vllm".to_owned(),
            block_size: None,
            tokenizers: Vec::new(),
            lookup_timeout: Duration::from_millis(20),
            health_interval: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            engine_idle_timeout: DEFAULT_ENGINE_IDLE_TIMEOUT,
            decode_weight_tokens: DEFAULT_DECODE_WEIGHT_TOKENS,
            duplicate_weight_pct: DEFAULT_DUPLICATE_WEIGHT_PCT,
            intake_weight_pct: DEFAULT_INTAKE_WEIGHT_PCT,
            events_window: DEFAULT_EVENTS_WINDOW,
            pending_prefixes: true,
            eviction_foresight: true,
            prefill_progress: true,
            engine_admin: false,
            max_body_bytes: 32 << 20,
            startup_timeout: Duration::from_secs(120),
            catch_up_timeout: DEFAULT_CATCH_UP_TIMEOUT,
        }
    }

    /// Checks what can be checked before anything starts.
    pub fn validate(&self) -> Result<(), GatewayError> {
        if self.engines.is_empty() {
            return Err(GatewayError::Config(
                "at least one --engine is needed, e.g. --engine http://127.0.0.1:8000".into(),
            ));
        }
        let mut ids: Vec<&str> = self.engines.iter().map(|e| e.id.as_str()).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(GatewayError::Config(format!(
                "two engines share the replica id {:?}; give one an id=... option",
                w[0]
            )));
        }
        if self.tenant.is_empty() {
            return Err(GatewayError::Config(
                "--tenant must not be empty (lookups for an empty tenant never match)".into(),
            ));
        }
        if self.block_size == Some(0) {
            return Err(GatewayError::Config("--block-size must be positive".into()));
        }
        Ok(())
    }
}

/// Idle connections to an engine are closed after this: under vLLM's
/// uvicorn keep-alive (5 s, `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`).
pub const DEFAULT_ENGINE_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// The tenant of the engines' blocks when `--tenant` is not given.
pub const DEFAULT_TENANT: &str = "default";

/// A running request's weight in the pick, in prompt tokens to prefill: a
/// decode step of each running sequence shares the engine with the new
/// request's prefill.
pub const DEFAULT_DECODE_WEIGHT_TOKENS: u64 = 64;

/// The pick's price of a second cached copy of a prefix, in percent of its
/// tokens: half, so a repeat waits behind its twin's prefill (about the same
/// wait as prefilling it elsewhere) rather than evicting other prompts from
/// a second cache, and moves once the twin's engine is a copy's worth busier.
/// A copy that does not fit the other cache is charged the intake weight
/// instead ([`crate::pick`]).
pub const DEFAULT_DUPLICATE_WEIGHT_PCT: u64 = 50;

/// `--catch-up-timeout`: a replay of a long event history takes seconds on a
/// loaded host; one that has not reached the index in this long is taken to
/// be stuck (the engine's replay socket unreachable, a subscriber that cannot
/// connect), and the engine's claims are used on live events alone.
pub const DEFAULT_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// Default `--events-window`: the sidecar's own. The gateway counts what it
/// routed from dispatch ([`crate::pending`]), so a store reaching the index
/// 100 ms later costs no hint, and an idle subscriber wakes 10 times a
/// second rather than 100 (at 10 ms the two subscribers' ticks were most of
/// the idle gateway's 1 % of a core). Removals are flushed as they arrive.
pub const DEFAULT_EVENTS_WINDOW: Duration = Duration::from_millis(100);

/// Default `--intake-weight-pct`: a new prefix waits behind up to about four
/// of its own prefills rather than fill the fuller cache ([`crate::pick`]).
/// 200 % was not enough: with two new prompts queued on the emptier engine
/// (run S, 4 clients) the eighth system prompt went to the fuller one, a 5/3
/// split, 10 full misses.
pub const DEFAULT_INTAKE_WEIGHT_PCT: u64 = 400;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_spec_defaults_and_options() {
        let e = EngineSpec::parse("http://10.0.0.1:8000/").unwrap();
        assert_eq!(
            (e.url.as_str(), e.id.as_str(), e.host()),
            ("http://10.0.0.1:8000", "10.0.0.1:8000", "10.0.0.1")
        );
        let e =
            EngineSpec::parse("http://h:8000,id=vllm-0,events=tcp://h:5557,replay=tcp://h:5558")
                .unwrap();
        assert_eq!(e.id, "vllm-0");
        assert_eq!(e.events.as_deref(), Some("tcp://h:5557"));
        assert_eq!(e.replay.as_deref(), Some("tcp://h:5558"));
        for bad in [
            "h:8000",
            "http://",
            "http://h:8000,events=h:5557",
            "http://h:8000,color=red",
            "http://h:8000,id=",
        ] {
            assert!(EngineSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn duplicate_ids_are_refused() {
        let e = EngineSpec::parse("http://h:8000").unwrap();
        let c = GatewayConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)), vec![e.clone(), e]);
        assert!(c.validate().unwrap_err().to_string().contains("share"));
    }
}

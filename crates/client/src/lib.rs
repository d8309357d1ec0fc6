//! Gateway SDK for inference-cache.
//!
//! A gateway asks the cache plane "which replica already holds this
//! prompt's KV cache?" before it routes a request. The answer is a *hint*:
//! the SDK makes sure asking can never hurt the request.
//!
//! * **Fail open by construction.** [`Client::lookup_route`] returns a
//!   [`RouteHint`], never an error. Transport errors, gRPC statuses,
//!   timeouts, an empty `replica_scores` and reason codes this SDK does not
//!   know all become [`Hint::NoHint`] with a [`NoHintReason`] you can count
//!   in a metric.
//! * **Hard deadline.** A lookup never waits longer than its deadline
//!   (default 20 ms, [`ClientConfig::lookup_deadline`], or per query with
//!   [`RouteQuery::deadline`]): the call is wrapped in a local timeout and
//!   the deadline is also sent as `grpc-timeout` so the server can give up
//!   in time.
//! * **Lazy connection.** [`Client::connect_lazy`] does not dial, so a
//!   gateway can start before the cache plane; lookups return
//!   `NoHint(Unavailable)` until it is up. Tools use [`Client::connect`],
//!   which dials eagerly and reports a wrong address straight away. The
//!   connection (TCP, TLS, HTTP/2 setup) is made inside the first lookup's
//!   deadline, so a cold lazy client's first answer may be
//!   `NoHint(DeadlineExceeded)`; the channel then stays up (HTTP/2
//!   keep-alive) and reconnects by itself after failures.
//!
//! # Routing one request
//!
//! ```no_run
//! use inferencecache_client::{Client, ClientConfig, RoundRobin, RouteInput, RouteQuery};
//! # async fn route(prompt_tokens: Vec<u32>) -> Result<(), inferencecache_client::ClientError> {
//! // Once per process.
//! let client = Client::connect_lazy(ClientConfig::new("http://inference-cache:9090"))?;
//! let fallback = RoundRobin::new();
//! let replicas = vec!["vllm-0".to_string(), "vllm-1".to_string()];
//!
//! // Per request: tenant/model/hash scheme must match what the engines report.
//! let query = RouteQuery::new("team-a", "llama-3-8b", RouteInput::TokenIds(prompt_tokens));
//! let answer = client.lookup_route(&query).await;
//! let replica = fallback.pick(&answer.hint, &replicas);
//! println!("{} → {replica} in {:?}", answer.hint.reason_code(), answer.latency);
//! # Ok(()) }
//! ```
//!
//! [`RoundRobin::pick`] takes the hint's best candidate when the gateway
//! knows that replica and round-robins otherwise, which is the contract's
//! intended gateway behaviour. `PREFIX_MATCH`, `AFFINITY_HINT` and
//! `TENANT_HOT` are all routable; `UNKNOWN_TENANT` / `UNKNOWN_MODEL` /
//! `UNKNOWN_HASH_SCHEME` ([`NoHintReason::is_misconfiguration`]) mean the
//! gateway and the producers disagree on a key — log them, still route.
//!
//! # The prompt
//!
//! [`RouteInput`] takes the prompt in whichever form the gateway has:
//! token ids (the server fingerprints them), a block chain the gateway
//! computed itself with [`block_hashes`] / [`RouteInput::chain_from_tokens`]
//! (the same XXH3 content fingerprint the kvevent-subscriber ingests, so the
//! tokens never leave the gateway), a legacy prefix hash, or raw prompt text
//! (the server tokenizes; needs `--tokenizer-models-dir` on the server).
//! The block size must match the engines' (default [`DEFAULT_BLOCK_SIZE`];
//! vLLM on CPU uses multiples of 32). With token ids or text the server uses
//! the size the engines' sidecars report.
//!
//! **What the engine will reuse.** vLLM always recomputes a prompt's last
//! token, so a fully cached block-aligned prompt reuses one block less than
//! it holds. With token ids or text the server applies that rule itself
//! (outside contract mode). A chain carries only hashes, so a gateway that
//! fingerprints the whole prompt should leave its last token out:
//! [`RouteInput::chain_for_prompt`] does. A request sent with a
//! `cache_salt` must be looked up with the same salt
//! ([`RouteQuery::cache_salt`] for token ids and text,
//! [`block_hashes_salted`] / [`RouteInput::chain_for_prompt`] for chains):
//! salted blocks match nothing else, and an unsalted lookup never matches
//! them.
//!
//! **Forward in lookup order.** A hint the server just delivered counts as
//! a tentative holding of the replica it named, so the next lookup of the
//! same prefix claims the blocks that request is still bringing there.
//! That claim holds when the engine schedules requests in the order their
//! lookups were answered; scheduled the other way round, the later request
//! reuses less than `matched_tokens` and the earlier one more. Write a
//! request's bytes to the engine before acting on the next lookup (one
//! lock from `lookup_route` until the request is written, not until its
//! response), and send a request that starts with the same block as one
//! still waiting for the same engine's response headers only after them
//! (vLLM renders prompts before scheduling them): `docs/gateway.md`,
//! "forward in lookup order".
//!
//! # Producers and tools
//!
//! [`Client::report_state`] and [`Client::publish_event`] report cache
//! contents for engines without a subscriber; [`Client::get_cache_state`]
//! and [`Client::watch`] serve dashboards and the `inferencecache` CLI
//! (`lookup`, `state`, `watch`), which use this crate for every call.
//! [`Client::raw`] exposes the generated tonic client for anything else.
//!
//! # Example
//!
//! `cargo run -p inferencecache-client --example gateway` starts an
//! in-process server, reports a replica's cache as a producer would, and
//! routes a few requests with a round-robin fallback; pass
//! `--server http://HOST:9090` to use a running server instead.
//!
//! # Differences from the first API sketch
//!
//! Additions only; every sketched name and meaning is kept.
//!
//! * [`RouteHint::token_ids`]: the server's canonical tokens on the
//!   prompt-text path (forward them to the engine).
//! * [`ClientConfig::request_timeout`] bounds the non-lookup calls so tools
//!   never hang on a stalled peer; [`Client::from_channel`] reuses a channel.
//! * [`Client::connect_lazy`] returns [`ClientError::NoRuntime`] outside a
//!   tokio runtime instead of panicking (tonic spawns the channel's worker).
//! * [`RouteQuery::new`] plus builder setters; [`RouteInput::chain_from_tokens`];
//!   [`Hint::candidates`] and [`Hint::is_hint`]; [`NoHintReason::code`] and
//!   [`NoHintReason::is_misconfiguration`]; the wire [`Tier`] as an enum.
//! * A positive reason code with no replicas is
//!   `NoHint(UnknownReason(code))`, keeping the odd code visible.
//! * `NoHint(Unavailable)` covers every failure to reach the server: refused,
//!   unresolvable, TLS handshake failed, connection broken mid-call.

mod chain;
mod client;
mod config;
mod error;
mod fallback;
mod hint;
mod query;

pub use chain::{DEFAULT_BLOCK_SIZE, block_hashes, block_hashes_salted};
pub use client::Client;
pub use config::{
    ClientConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_LOOKUP_DEADLINE, DEFAULT_REQUEST_TIMEOUT,
    TlsOptions,
};
pub use error::ClientError;
pub use fallback::RoundRobin;
pub use hint::{Candidate, Hint, NoHintReason, RouteHint, Tier};
pub use query::{RouteInput, RouteQuery};

/// The content fingerprint (XXH3-64 block chain) producers and gateways share.
pub use inferencecache_fingerprint as fingerprint;
/// The wire contract, for callers building requests by hand.
pub use inferencecache_proto::v1alpha1 as proto;
pub use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
pub use inferencecache_proto::v1alpha1::{
    Ack, CacheEvent, CacheStateUpdate, GetCacheStateResponse, LookupRouteRequest,
    LookupRouteResponse, PrefixEntry, ReplicaStats, StreamEventsRequest,
};
/// The channel type behind [`Client::raw`].
pub use tonic::transport::Channel;
/// gRPC status and code, as carried by [`ClientError::Status`].
pub use tonic::{Code, Status};

/// Hash scheme of the content fingerprint; what the kvevent-subscriber
/// reports vLLM engines under.
pub const DEFAULT_HASH_SCHEME: &str = "vllm";

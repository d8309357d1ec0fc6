//! The real stack behind the hint policies: an inference-cache server (fresh
//! in-process, or `--server ADDR`) reached only through the gateway client,
//! plus the per-replica subscriber mapping that turns engine events into
//! reports.
//!
//! # Time
//!
//! The in-process server's index runs on the simulation's clock
//! ([`inferencecache_index::ManualClock`], set to the virtual time before
//! every message and lookup), so the delivered-hint window drains and
//! tentative holdings expire in simulated time. Reports carry the virtual
//! time shifted one day into the future: the server treats any timestamp not
//! in its past as fully fresh (`freshness = 1`), so scores are exactly
//! reproducible whatever the machine's speed, and the TTL sweep never drops
//! an entry during a run. (Against `--server` the index runs on its wall
//! clock, which moves much slower than simulated time: the load window and
//! the tentative TTL then see time compressed, and figures differ.) The engines' own LRU evictions remove
//! entries instead, as in production. Timestamps still grow with virtual
//! time, so the server's cap ordering follows the simulation. Every replica
//! is cleared (`ALL_CLEARED`) at the start and end of a run, so a shared
//! `--server` keeps no future-dated entry afterwards.

use crate::config::{LookupInput, Settings};
use crate::error::SimError;
use crate::policy::PolicyKind;
use inferencecache_client::{Client, ClientConfig, RouteInput, RouteQuery};
use inferencecache_index::ManualClock;
use inferencecache_proto::v1alpha1::{
    CacheEvent, CacheStateUpdate, PrefixEntry, ReplicaStats, cache_event,
};
use inferencecache_server::core::RankingMode;
use inferencecache_server::{Server, ServerConfig};
use inferencecache_subscriber::Update;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Hash scheme (engine domain) every simulated replica reports under.
pub const HASH_SCHEME: &str = "vllm";
/// Model id of the simulated fleet.
pub const MODEL_ID: &str = "mooncake-sim";

/// One message to the server, in send order.
#[derive(Debug, Clone)]
pub enum Op {
    /// `ReportCacheState` message.
    Report(CacheStateUpdate),
    /// `PublishEvent` (eviction or clear).
    Event(CacheEvent),
}

/// The answer to one lookup, reduced to what the simulator records.
#[derive(Debug, Clone)]
pub struct Lookup {
    /// The replica to use, after the round-robin fallback.
    pub replica_id: String,
    /// The server's reason code (or the client's fail-open code).
    pub reason: String,
    /// Client-side latency, µs.
    pub latency_us: u64,
}

/// A server and a gateway client for one policy's run.
pub struct Backend {
    client: Client,
    endpoint: String,
    tenant: String,
    input: LookupInput,
    deadline: Duration,
    round_robin: inferencecache_client::RoundRobin,
    in_process: Option<(
        CancellationToken,
        JoinHandle<Result<(), inferencecache_server::ServeError>>,
    )>,
    /// Unix µs that virtual time 0 maps to in report timestamps.
    epoch_us: i64,
    /// The in-process index's clock and the Unix ns virtual time 0 maps to.
    clock: Option<(Arc<ManualClock>, i64)>,
}

/// The CachePolicy pushed for [`PolicyKind::HintsNoAffinity`]: the defaults,
/// spelled out (a body that omits `minimumMatchedTokens` would turn that
/// floor off), the contract ranking, and `affinityRouting: false`.
pub fn no_affinity_policy_json(tenant: &str) -> String {
    format!(
        r#"{{"version":8,"policies":[{{"namespace":"{tenant}","minimumMatchedTokens":64,"routingFloorScore":0.1,"affinityRouting":false,"routing":{{"ranking":"contract"}}}}]}}"#
    )
}

/// Serves the server's own InferenceCache service (same core: index,
/// policies, handlers) on a second loopback listener with `TCP_NODELAY`, and
/// returns its endpoint.
///
/// Why: the server's gRPC listener leaves Nagle's algorithm on, and a small
/// response write held back by Nagle waits for the client's delayed ACK
/// (~40 ms on Linux). A run makes two round trips per request, so those
/// stalls would dominate the wall time (and the lookup p99) without changing
/// any decision. `server.serve` still runs (sweep loop, HTTP listeners).
fn serve_nodelay(server: &Server, cancel: &CancellationToken) -> Result<String, SimError> {
    use inferencecache_proto::v1alpha1::inference_cache_server::InferenceCacheServer;
    use inferencecache_server::service::{DEFAULT_METRICS_INTERVAL, InferenceCacheService};
    let incoming = tonic::transport::server::TcpIncoming::bind(std::net::SocketAddr::from((
        [127, 0, 0, 1],
        0,
    )))
    .map_err(|e| SimError::Server(format!("bind: {e}")))?
    .with_nodelay(Some(true));
    let addr = incoming
        .local_addr()
        .map_err(|e| SimError::Server(format!("bind: {e}")))?;
    let service = InferenceCacheServer::new(InferenceCacheService::new(
        server.core(),
        cancel.clone(),
        DEFAULT_METRICS_INTERVAL,
    ))
    .max_decoding_message_size(inferencecache_server_max_request());
    let stop = cancel.clone();
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await;
        if let Err(e) = served {
            eprintln!("simulator gRPC listener: {e}");
        }
    });
    Ok(format!("http://{addr}"))
}

/// The server's request-size limit (a whole prompt of token ids must fit).
fn inferencecache_server_max_request() -> usize {
    8 << 20
}

/// Why `hints-contract` / `hints-no-affinity` cannot run against
/// `--server`, and what to do.
pub fn remote_knob_error() -> SimError {
    SimError::Config(format!(
        "hints-contract and hints-no-affinity set server options (--ranking contract, a \
         CachePolicy), which needs the in-process server; with --server, start it with \
         --ranking contract and run `hints`, or push {} to its /policy and run `hints`",
        no_affinity_policy_json(&format!("simulate-{}", PolicyKind::Hints.name()))
    ))
}

impl Backend {
    /// Starts (or connects to) the server for `policy` and clears the
    /// simulated replicas' state on it.
    pub async fn start(
        settings: &Settings,
        policy: PolicyKind,
        replica_ids: &[String],
    ) -> Result<Self, SimError> {
        let tenant = format!("simulate-{}", policy.name());
        let now_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as i64);
        let mut clock = None;
        let (endpoint, in_process) = match &settings.server {
            Some(addr) => {
                if policy.needs_in_process() {
                    return Err(remote_knob_error());
                }
                let endpoint = if addr.contains("://") {
                    addr.clone()
                } else {
                    format!("http://{addr}")
                };
                (endpoint, None)
            }
            None => {
                let mut config = ServerConfig::ephemeral();
                config.engine_block_size = u32::try_from(settings.block_size)
                    .map_err(|_| SimError::Config("--block-size too large".into()))?;
                if policy == PolicyKind::HintsContract {
                    config.index.ranking = RankingMode::Contract;
                }
                let base_ns = now_us.saturating_mul(1_000);
                let manual = Arc::new(ManualClock::new(base_ns));
                clock = Some((Arc::clone(&manual), base_ns));
                let server = Server::bind_with_clock(&config, manual)
                    .await
                    .map_err(|e| SimError::Server(e.to_string()))?;
                if policy == PolicyKind::HintsNoAffinity {
                    let set = inferencecache_server::policy::decode_policy_json(
                        no_affinity_policy_json(&tenant).as_bytes(),
                    )
                    .map_err(|e| SimError::Server(e.to_string()))?;
                    server.policies().replace(set);
                }
                let cancel = CancellationToken::new();
                let endpoint = serve_nodelay(&server, &cancel)?;
                let task = tokio::spawn(server.serve(cancel.clone()));
                (endpoint, Some((cancel, task)))
            }
        };
        let rpc_err = |message: String| SimError::Rpc {
            endpoint: endpoint.clone(),
            message,
        };
        let client = Client::connect(
            ClientConfig::new(endpoint.clone()).lookup_deadline(settings.lookup_deadline()),
        )
        .await
        .map_err(|e| rpc_err(e.to_string()))?;
        let backend = Self {
            client,
            endpoint,
            tenant,
            input: settings.input,
            deadline: settings.lookup_deadline(),
            round_robin: inferencecache_client::RoundRobin::new(),
            in_process,
            epoch_us: now_us + 86_400_000_000,
            clock,
        };
        backend.clear(replica_ids).await?;
        Ok(backend)
    }

    /// Tenant id the run reports and looks up under.
    pub fn tenant(&self) -> &str {
        &self.tenant
    }

    /// Moves the in-process index's clock to a virtual instant (time only
    /// moves forward).
    pub fn set_time(&self, virtual_us: u64) {
        if let Some((clock, base_ns)) = &self.clock {
            let t = base_ns.saturating_add((virtual_us as i64).saturating_mul(1_000));
            use inferencecache_index::Clock as _;
            if t > clock.now_ns() {
                clock.set_ns(t);
            }
        }
    }

    /// Wire timestamp of a virtual instant.
    pub fn timestamp_us(&self, virtual_us: u64) -> i64 {
        self.epoch_us + virtual_us as i64
    }

    fn rpc_err(&self, message: String) -> SimError {
        SimError::Rpc {
            endpoint: self.endpoint.clone(),
            message,
        }
    }

    /// Sends `ALL_CLEARED` for every simulated replica.
    pub async fn clear(&self, replica_ids: &[String]) -> Result<(), SimError> {
        let ops: Vec<Op> = replica_ids
            .iter()
            .map(|r| {
                Op::Event(CacheEvent {
                    r#type: cache_event::Type::AllCleared as i32,
                    replica_id: r.clone(),
                    model_id: MODEL_ID.into(),
                    tenant_id: self.tenant.clone(),
                    timestamp_us: 0,
                    ..Default::default()
                })
            })
            .collect();
        self.send(ops).await
    }

    /// Sends ops in order. Consecutive reports share one `ReportCacheState`
    /// stream; consecutive events go out concurrently (evictions of distinct
    /// blocks commute). Everything is acknowledged before this returns, so
    /// the next lookup sees it.
    pub async fn send(&self, ops: Vec<Op>) -> Result<(), SimError> {
        let mut reports = Vec::new();
        let mut events = Vec::new();
        for op in ops {
            match op {
                Op::Report(u) => {
                    if !events.is_empty() {
                        self.publish(std::mem::take(&mut events)).await?;
                    }
                    reports.push(u);
                }
                Op::Event(e) => {
                    if !reports.is_empty() {
                        self.report(std::mem::take(&mut reports)).await?;
                    }
                    events.push(e);
                }
            }
        }
        if !reports.is_empty() {
            self.report(reports).await?;
        }
        if !events.is_empty() {
            self.publish(events).await?;
        }
        Ok(())
    }

    async fn report(&self, updates: Vec<CacheStateUpdate>) -> Result<(), SimError> {
        let ack = self
            .client
            .report_state(updates)
            .await
            .map_err(|e| self.rpc_err(format!("ReportCacheState: {e}")))?;
        if !ack.accepted {
            return Err(self.rpc_err("ReportCacheState not accepted".into()));
        }
        Ok(())
    }

    async fn publish(&self, events: Vec<CacheEvent>) -> Result<(), SimError> {
        let calls = events.into_iter().map(|e| self.client.publish_event(e));
        for result in futures::future::join_all(calls).await {
            result.map_err(|e| self.rpc_err(format!("PublishEvent: {e}")))?;
        }
        Ok(())
    }

    /// Turns one engine batch's subscriber updates into ops (stats travel
    /// separately, at the scrape interval).
    pub fn ops_for(
        &self,
        replica_id: &str,
        at_virtual_us: u64,
        updates: Vec<Update>,
        out: &mut Vec<Op>,
    ) {
        let timestamp_us = self.timestamp_us(at_virtual_us);
        let mut entries = Vec::new();
        let flush = |entries: &mut Vec<PrefixEntry>, out: &mut Vec<Op>| {
            if !entries.is_empty() {
                out.push(Op::Report(self.update(
                    replica_id,
                    timestamp_us,
                    std::mem::take(entries),
                    None,
                )));
            }
        };
        for u in updates {
            match u {
                // One legacy entry per block, as the subscriber reports them:
                // positional fingerprint, cumulative token count.
                Update::Report(r) => entries.push(PrefixEntry {
                    prefix_hash: r.prefix_hash_wire().to_vec(),
                    token_count: r.token_count,
                    tier: r.tier.as_proto(),
                    adapter_id: r.adapter.to_string(),
                    no_match_end: r.no_match_end,
                    ..Default::default()
                }),
                Update::Evict(e) => {
                    flush(&mut entries, out);
                    out.push(Op::Event(CacheEvent {
                        r#type: cache_event::Type::PrefixEvicted as i32,
                        replica_id: replica_id.to_owned(),
                        model_id: MODEL_ID.into(),
                        tenant_id: self.tenant.clone(),
                        prefix_hash: e.prefix_hash_wire().to_vec(),
                        timestamp_us,
                        adapter_id: e.adapter.to_string(),
                    }));
                }
                Update::AllCleared => {
                    flush(&mut entries, out);
                    out.push(Op::Event(CacheEvent {
                        r#type: cache_event::Type::AllCleared as i32,
                        replica_id: replica_id.to_owned(),
                        model_id: MODEL_ID.into(),
                        tenant_id: self.tenant.clone(),
                        timestamp_us,
                        ..Default::default()
                    }));
                }
            }
        }
        flush(&mut entries, out);
    }

    /// A `CacheStateUpdate` for a replica (stats-only when `prefixes` is empty).
    pub fn update(
        &self,
        replica_id: &str,
        timestamp_us: i64,
        prefixes: Vec<PrefixEntry>,
        stats: Option<&ReplicaStats>,
    ) -> CacheStateUpdate {
        CacheStateUpdate {
            replica_id: replica_id.to_owned(),
            model_id: MODEL_ID.into(),
            tenant_id: self.tenant.clone(),
            hash_scheme: HASH_SCHEME.into(),
            timestamp_us,
            prefixes,
            stats: stats.cloned(),
            adapter_id: String::new(),
            // The in-process server is configured with the trace's size.
            block_size: 0,
        }
    }

    /// Asks LookupRoute where to send a prompt and applies the round-robin
    /// fallback when there is no hint.
    pub async fn lookup(
        &mut self,
        tokens: impl FnOnce() -> Vec<u32>,
        chain: &[u64],
        block_size: usize,
        replica_ids: &[String],
    ) -> Lookup {
        let input = match self.input {
            LookupInput::TokenIds => RouteInput::TokenIds(tokens()),
            LookupInput::Chain => RouteInput::BlockHashes {
                hashes: chain
                    .iter()
                    .map(|&h| inferencecache_fingerprint::to_wire(h).to_vec())
                    .collect(),
                token_counts: vec![block_size as i32; chain.len()],
            },
        };
        let query = RouteQuery {
            tenant_id: self.tenant.clone(),
            model_id: MODEL_ID.into(),
            hash_scheme: HASH_SCHEME.into(),
            adapter_id: String::new(),
            input,
            slo_ttft_ms: 0,
            deadline: Some(self.deadline),
            cache_salt: String::new(),
            shadow: false,
        };
        let answer = self.client.lookup_route(&query).await;
        let replica_id = self.round_robin.pick(&answer.hint, replica_ids).to_owned();
        Lookup {
            replica_id,
            reason: answer.hint.reason_code().to_string(),
            latency_us: answer.latency.as_micros() as u64,
        }
    }

    /// Clears the replicas and stops an in-process server.
    pub async fn finish(self, replica_ids: &[String]) -> Result<(), SimError> {
        let cleared = self.clear(replica_ids).await;
        drop(self.client);
        if let Some((cancel, task)) = self.in_process {
            cancel.cancel();
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(SimError::Server(e.to_string())),
                Err(e) => return Err(SimError::Server(e.to_string())),
            }
        }
        cleared
    }
}

//! The LookupRoute pipeline (`server.md` §3.2–§3.5), in the reference's exact
//! step order. Every outcome is an answer with a reason code: never a gRPC
//! error, never a log line.
//!
//! The pipeline works on its own types ([`RouteRequest`] borrowed from the
//! wire request, [`RouteOutcome`] turned into the wire response by
//! `convert.rs`), so the protobuf types stay at the edge.
//!
//! Index lookups take no global lock and finish in microseconds, so they run
//! inline on the handler task and the deadline is checked around them, rather
//! than paying a thread hop per lookup.

mod deadline;
mod request;
mod resolve;
mod ttft;

pub use deadline::parse_grpc_timeout;
pub use request::{RouteOutcome, RouteRequest, strategy_reason};
pub use resolve::{MAX_LOOKUP_TOKENS, MAX_PROMPT_TEXT_BYTES};

use crate::metrics::Metrics;
use crate::policy::{PolicyStore, TenantPolicy};
use crate::reserved_tenant::is_reserved;
use crate::tokenize::Tokenizers;
use inferencecache_index::{
    Index, LookupRequest, LookupRouteResult, RankingMode, ScoreById, Strategy,
};
use inferencecache_proto::Reason;
use resolve::{ChainHashes, Input, Resolved};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Default budget for a lookup that must tokenize `prompt_text`.
pub const DEFAULT_TOKENIZE_TIMEOUT: Duration = Duration::from_secs(5);
/// Tokenizations running at once; beyond this, prompt_text fails open
/// rather than queueing behind other requests.
pub const MAX_CONCURRENT_TOKENIZE: usize = 64;

/// Everything LookupRoute needs; cheap to clone.
#[derive(Clone)]
pub struct LookupPipeline {
    index: Arc<Index>,
    policies: PolicyStore,
    metrics: Arc<Metrics>,
    block_sizes: crate::block_size::BlockSizes,
    tokenizers: Tokenizers,
    ranking: RankingMode,
    tokenize_budget: crate::tokenize_budget::TokenizeBudget,
    /// Delivered hints to share with the other server replicas (bus mode).
    deliveries: crate::delivery_log::DeliveryLog,
    /// Claims shortened by what hinted requests will evict (ttft ranking).
    foresight: Arc<crate::foresight::Foresight>,
}

impl std::fmt::Debug for LookupPipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LookupPipeline")
            .field("block_size", &self.block_sizes.configured())
            .finish_non_exhaustive()
    }
}

fn expired(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// What the pipeline needs to go on after tokenizing `prompt_text`.
struct Tokenize {
    policy: TenantPolicy,
    ranking: RankingMode,
    block_size: u32,
    chain_enabled: bool,
    deadline: Option<Instant>,
}

/// Outcome of tokenizing prompt_text.
enum Tokenized {
    Ready(Resolved<'static>),
    FailOpen(Vec<u32>),
    Timeout,
}

/// A fail-open envelope: empty scores, no adapter echo.
fn envelope(reason: Reason, start: Instant, echo: Vec<u32>) -> RouteOutcome {
    RouteOutcome::envelope(reason, start.elapsed(), echo)
}

impl LookupPipeline {
    /// Creates the pipeline.
    pub fn new(
        index: Arc<Index>,
        policies: PolicyStore,
        metrics: Arc<Metrics>,
        block_sizes: crate::block_size::BlockSizes,
        tokenizers: Tokenizers,
    ) -> Self {
        Self {
            index,
            policies,
            block_sizes,
            tokenizers,
            ranking: RankingMode::default(),
            tokenize_budget: crate::tokenize_budget::TokenizeBudget::new(
                MAX_CONCURRENT_TOKENIZE,
                crate::limits::DEFAULT_TOKENIZE_MEMORY_BUDGET,
                Arc::clone(&metrics),
            ),
            metrics,
            deliveries: crate::delivery_log::DeliveryLog::default(),
            foresight: Arc::new(crate::foresight::Foresight::new(false)),
        }
    }

    /// The eviction foresight claims are checked against (off until set).
    #[must_use]
    pub fn with_foresight(mut self, foresight: Arc<crate::foresight::Foresight>) -> Self {
        self.foresight = foresight;
        self
    }

    /// The delivered hints bus mode shares with the other server replicas
    /// (disabled until `replicate` enables it).
    pub fn deliveries(&self) -> &crate::delivery_log::DeliveryLog {
        &self.deliveries
    }

    /// The ranking of tenants whose policy does not choose one (`--ranking`).
    #[must_use]
    pub fn with_ranking(mut self, ranking: RankingMode) -> Self {
        self.ranking = ranking;
        self
    }

    /// Replaces the tokenization bounds (`--tokenize-*` flags).
    #[must_use]
    pub fn with_tokenize_budget(mut self, budget: crate::tokenize_budget::TokenizeBudget) -> Self {
        self.tokenize_budget = budget;
        self
    }

    /// Answers one LookupRoute. `caller_timeout` is the gRPC deadline.
    pub async fn route(
        &self,
        req: &RouteRequest<'_>,
        caller_timeout: Option<Duration>,
    ) -> RouteOutcome {
        let start = Instant::now();
        let outcome = match self.run_now(req, caller_timeout, start) {
            Ok(outcome) => outcome,
            // Boxed: the tokenizer's wait (a blocking task and a timer) would
            // otherwise size every lookup's future (issue 36).
            Err(wait) => Box::pin(self.run_tokenized(req, wait, start)).await,
        };
        self.observe(req, &outcome);
        outcome
    }

    /// [`Self::route`] without a future, for a request without
    /// `prompt_text` (the only input that waits, for the tokenizer):
    /// `None` for one with it. The gRPC edge answers such lookups in the
    /// call itself, with no handler future to allocate (issue 36,
    /// session 45).
    pub fn route_now(
        &self,
        req: &RouteRequest<'_>,
        caller_timeout: Option<Duration>,
    ) -> Option<RouteOutcome> {
        if !req.prompt_text.is_empty() {
            return None;
        }
        let outcome = self.run_now(req, caller_timeout, Instant::now()).ok()?;
        self.observe(req, &outcome);
        Some(outcome)
    }

    /// The histogram observes the latency the response reports (one clock
    /// read fewer per lookup).
    fn observe(&self, req: &RouteRequest<'_>, outcome: &RouteOutcome) {
        self.metrics.observe_lookup(
            req.model,
            outcome.reason,
            outcome.hint_used(),
            outcome.latency.as_secs_f64(),
        );
    }

    /// The whole pipeline when the request resolves without the tokenizer;
    /// else what [`Self::run_tokenized`] needs to go on. (Not an error: the
    /// `Err` is a continuation, consumed at once by the caller.)
    #[allow(clippy::result_large_err)]
    fn run_now(
        &self,
        req: &RouteRequest<'_>,
        caller_timeout: Option<Duration>,
        start: Instant,
    ) -> Result<RouteOutcome, Tokenize> {
        if is_reserved(req.tenant) {
            return Ok(RouteOutcome::envelope(
                Reason::NoHint,
                Duration::ZERO,
                Vec::new(),
            ));
        }
        let policy = self.policies.policy(req.tenant);
        // Step 2-3: the tighter of the caller's deadline and the tenant budget.
        let budget = policy.lookup_timeout;
        let mut deadline = [caller_timeout, budget]
            .into_iter()
            .flatten()
            .map(|d| start + d)
            .min();
        let chain_enabled = policy.enable_chain_matching;
        let no_chain = !req.has_chain();
        let will_tokenize = !req.prompt_text.is_empty()
            && (!chain_enabled || no_chain)
            && req.prefix_hash.is_empty()
            && req.token_ids.is_empty();
        if deadline.is_none() && will_tokenize {
            deadline = Some(start + DEFAULT_TOKENIZE_TIMEOUT);
        }
        // Step 4.
        if expired(deadline) {
            return Ok(envelope(Reason::Timeout, start, Vec::new()));
        }
        // Step 5, on the raw request.
        let well_formed_chain =
            !req.block_hashes.is_empty() && req.block_hashes.len() == req.block_token_counts.len();
        if policy.require_chain && !well_formed_chain {
            return Ok(envelope(Reason::PolicyRequiresChain, start, Vec::new()));
        }
        // Step 6-8.
        let ranking = policy.ranking.unwrap_or(self.ranking);
        // How the server fingerprints tokens itself: the engines' block size
        // where their producers said it, the request's salt, and (outside
        // contract mode) the engine's rule that the last token is recomputed.
        let cut = resolve::Cut {
            block_size: self.block_sizes.for_scope(req.tenant, req.model),
            salt: req.cache_salt,
            reuse_rule: ranking != RankingMode::Contract,
        };
        let resolved = match resolve::resolve(req, cut, chain_enabled) {
            Input::Ready(r) => r,
            Input::FailOpen => return Ok(envelope(Reason::NoHint, start, Vec::new())),
            Input::PromptText => {
                return Err(Tokenize {
                    policy,
                    ranking,
                    block_size: cut.block_size,
                    chain_enabled,
                    deadline,
                });
            }
        };
        Ok(self.run_resolved(req, &policy, ranking, resolved, start, deadline))
    }

    /// The pipeline after the tokenizer: steps 8-13 on its tokens.
    async fn run_tokenized(
        &self,
        req: &RouteRequest<'_>,
        wait: Tokenize,
        start: Instant,
    ) -> RouteOutcome {
        let cut = resolve::Cut {
            block_size: wait.block_size,
            salt: req.cache_salt,
            reuse_rule: wait.ranking != RankingMode::Contract,
        };
        let resolved = match self
            .tokenize(req, cut, wait.chain_enabled, wait.deadline)
            .await
        {
            Tokenized::Ready(r) => r,
            Tokenized::FailOpen(echo) => return envelope(Reason::NoHint, start, echo),
            Tokenized::Timeout => return envelope(Reason::Timeout, start, Vec::new()),
        };
        self.run_resolved(
            req,
            &wait.policy,
            wait.ranking,
            resolved,
            start,
            wait.deadline,
        )
    }

    /// Steps 8-13 on the resolved input.
    fn run_resolved(
        &self,
        req: &RouteRequest<'_>,
        policy: &TenantPolicy,
        ranking: RankingMode,
        mut resolved: Resolved<'_>,
        start: Instant,
        deadline: Option<Instant>,
    ) -> RouteOutcome {
        let budget = policy.lookup_timeout;
        let chain_enabled = policy.enable_chain_matching;
        if expired(deadline) {
            return envelope(Reason::Timeout, start, resolved.echo_tokens);
        }
        // Step 9: pre-lookup min-prefix gate (affinity disabled only).
        let min_prefix = i64::from(policy.minimum_prefix_tokens);
        let below_min_prefix = min_prefix > 0 && resolved.effective_prefix_tokens() < min_prefix;
        if below_min_prefix && !policy.affinity_routing {
            return envelope(Reason::NoHint, start, resolved.echo_tokens);
        }
        // Step 10.
        if !chain_enabled {
            resolved.clear_chain();
        }
        self.metrics.routing.ranked(ranking.name());
        if ranking == RankingMode::Ttft {
            return self.run_ttft(req, policy, resolved, below_min_prefix, start, deadline);
        }
        // Step 11.
        let lookup_start = Instant::now();
        let mut result = self.index_lookup(req, policy, &resolved);
        if expired(deadline) || budget.is_some_and(|b| lookup_start.elapsed() > b) {
            return envelope(Reason::Timeout, start, resolved.echo_tokens);
        }
        // Step 12.
        if result.strategy == Strategy::TenantHot && !policy.enable_tenant_hot {
            result.demote();
        }
        self.respond(req, policy, resolved, result, below_min_prefix, start)
    }

    /// The prompt_text branch of §3.3: bounded, concurrent with the deadline,
    /// failing open on every error.
    async fn tokenize(
        &self,
        req: &RouteRequest<'_>,
        cut: resolve::Cut<'_>,
        chain_enabled: bool,
        deadline: Option<Instant>,
    ) -> Tokenized {
        if req.prompt_text.len() > MAX_PROMPT_TEXT_BYTES {
            return Tokenized::FailOpen(Vec::new());
        }
        let Ok(tokenizer) = self.tokenizers.get(req.model) else {
            return Tokenized::FailOpen(Vec::new());
        };
        let per_byte = tokenizer.working_bytes_per_prompt_byte();
        let Ok(permit) = self
            .tokenize_budget
            .try_acquire(req.prompt_text.len(), per_byte)
        else {
            return Tokenized::FailOpen(Vec::new());
        };
        let text = req.prompt_text.to_owned();
        // The permit travels with the work: a timed-out request's
        // tokenization still holds its slot until it really ends.
        let work = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            tokenizer.encode_chat(&text)
        });
        let joined = match deadline {
            Some(d) => match tokio::time::timeout_at(d.into(), work).await {
                Ok(j) => j,
                Err(_) => return Tokenized::Timeout,
            },
            None => work.await,
        };
        let tokens = match joined {
            Ok(Ok(t)) if !t.is_empty() && t.len() <= MAX_LOOKUP_TOKENS => t,
            _ => return Tokenized::FailOpen(Vec::new()),
        };
        match resolve::from_tokens(&tokens, cut, chain_enabled, tokens.clone()) {
            Ok(r) => Tokenized::Ready(r),
            Err(fail) => Tokenized::FailOpen(fail.echo_tokens),
        }
    }

    fn index_lookup(
        &self,
        req: &RouteRequest<'_>,
        policy: &TenantPolicy,
        r: &Resolved<'_>,
    ) -> LookupRouteResult<ScoreById> {
        match &r.chain {
            ChainHashes::Request(h) => self
                .index
                .lookup_route_by_id(&index_request(req, policy, r, h)),
            ChainHashes::Computed(h) => self
                .index
                .lookup_route_by_id(&index_request(req, policy, r, h)),
        }
    }

    /// Step 13: floors, affinity, LFU credit, response.
    fn respond(
        &self,
        req: &RouteRequest<'_>,
        policy: &TenantPolicy,
        resolved: Resolved<'_>,
        mut result: LookupRouteResult<ScoreById>,
        below_min_prefix: bool,
        start: Instant,
    ) -> RouteOutcome {
        let hinted = matches!(result.strategy, Strategy::PrefixMatch | Strategy::TenantHot);
        if below_min_prefix && hinted {
            result.demote();
        }
        if result.strategy == Strategy::PrefixMatch {
            let floor = policy.minimum_matched_tokens;
            if floor > 0 {
                result.retain_min_matched_tokens(floor);
            }
        }
        if result.strategy == Strategy::PrefixMatch {
            let floor = policy.routing_floor_score;
            if floor > 0.0 && result.scores.first().is_some_and(|s| s.score < floor) {
                result.demote();
            }
        }
        if result.strategy == Strategy::None {
            if let Some(replica) = self.affinity(req, policy, &resolved) {
                return RouteOutcome::ranked(
                    Reason::AffinityHint,
                    RouteOutcome::affinity_scores(replica),
                    start.elapsed(),
                    resolved.echo_tokens,
                );
            }
        }
        if !result.hits.is_empty() && !req.shadow {
            self.index.credit(&result.hits);
        }
        RouteOutcome::ranked(
            strategy_reason(result.strategy),
            (result.scores, result.names),
            start.elapsed(),
            resolved.echo_tokens,
        )
    }

    /// §3.4: a stable replica for a miss, so repeats of a prefix co-locate.
    fn affinity(
        &self,
        req: &RouteRequest<'_>,
        policy: &TenantPolicy,
        resolved: &Resolved<'_>,
    ) -> Option<Arc<str>> {
        if !affinity_allowed(req, policy) {
            return None;
        }
        let seed = affinity_seed(resolved);
        self.index
            .affinity_hint(req.tenant, req.model, req.hash_scheme, &seed)
    }
}

/// §3.4's conditions on the request and policy for an AFFINITY_HINT.
fn affinity_allowed(req: &RouteRequest<'_>, policy: &TenantPolicy) -> bool {
    if !policy.affinity_routing
        || req.tenant.is_empty()
        || req.model.is_empty()
        || req.hash_scheme.is_empty()
    {
        return false;
    }
    !req.has_chain() || req.block_hashes.len() == req.block_token_counts.len()
}

/// §3.4's canonical seed: the chain seed, else the exact key.
fn affinity_seed(resolved: &Resolved<'_>) -> Vec<u8> {
    match &resolved.chain {
        ChainHashes::Request(h) if !h.is_empty() => inferencecache_index::chain_seed(h),
        ChainHashes::Computed(h) if !h.is_empty() => inferencecache_index::chain_seed(h),
        _ => resolved.exact_hash.as_bytes().to_vec(),
    }
}

/// The index request over a chain of either hash container, carrying the
/// tenant policy already read (the index asks no resolver).
fn index_request<'a, H>(
    req: &RouteRequest<'a>,
    policy: &TenantPolicy,
    r: &'a Resolved<'_>,
    hashes: &'a [H],
) -> LookupRequest<'a, H> {
    LookupRequest::new(req.tenant, req.model, req.hash_scheme)
        .policy(policy.lookup())
        .adapter(req.adapter)
        .exact(r.exact_hash.as_bytes(), r.exact_count)
        .chain(hashes, r.counts.as_slice())
        .slo_ttft_ms(req.slo_ttft_ms)
}

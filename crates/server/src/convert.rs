//! Proto ⇄ domain conversions, at the edge. The index never sees proto types.

use crate::route::{RouteOutcome, RouteRequest};
use inferencecache_index as index;
use inferencecache_proto::v1alpha1 as pb;

/// `CacheStateUpdate` → index update (moves the byte vectors, no copies).
pub fn update_from_proto(u: pb::CacheStateUpdate) -> index::CacheUpdate {
    index::CacheUpdate {
        replica_id: u.replica_id,
        model_id: u.model_id,
        tenant_id: u.tenant_id,
        hash_scheme: u.hash_scheme,
        timestamp_us: u.timestamp_us,
        prefixes: u.prefixes.into_iter().map(entry_from_proto).collect(),
        stats: u.stats.map(stats_from_proto),
        adapter_id: u.adapter_id,
    }
}

fn entry_from_proto(e: pb::PrefixEntry) -> index::PrefixEntry {
    index::PrefixEntry {
        prefix_hash: e.prefix_hash,
        token_count: e.token_count,
        block_hashes: e.block_hashes,
        block_token_counts: e.block_token_counts,
        tier: index::Tier::from_wire(e.tier),
        adapter_id: e.adapter_id,
        no_match_end: e.no_match_end,
    }
}

fn stats_from_proto(s: pb::ReplicaStats) -> index::ReplicaStatsReport {
    index::ReplicaStatsReport {
        cache_memory_bytes: s.cache_memory_bytes,
        hit_rate: s.hit_rate,
        pressure: s.pressure,
        client_version: s.client_version,
        t2_hit_tokens: s.t2_hit_tokens,
        t2_query_tokens: s.t2_query_tokens,
        load: s.load.map(|l| index::EngineLoad {
            running_requests: l.running_requests,
            waiting_requests: l.waiting_requests,
            kv_cache_usage: l.kv_cache_usage,
            kv_cache_capacity_tokens: l.kv_cache_capacity_tokens,
        }),
    }
}

/// `CacheEvent` → index event; `None` for TYPE_UNSPECIFIED and unknown types
/// (acknowledged, nothing applied).
pub fn event_from_proto(e: pb::CacheEvent) -> Option<index::CacheEvent> {
    Some(index::CacheEvent {
        kind: index::EventKind::from_wire(e.r#type)?,
        replica_id: e.replica_id,
        model_id: e.model_id,
        tenant_id: e.tenant_id,
        prefix_hash: e.prefix_hash,
        timestamp_us: e.timestamp_us,
        adapter_id: e.adapter_id,
    })
}

/// A feed event → the wire `CacheEvent` a StreamCacheEvents subscriber gets.
pub fn feed_event_to_proto(e: &crate::events::FeedEvent) -> pb::CacheEvent {
    pb::CacheEvent {
        r#type: e.kind.to_wire(),
        replica_id: e.replica_id.to_string(),
        model_id: e.model.to_string(),
        tenant_id: e.tenant.to_string(),
        prefix_hash: e.prefix_hash.to_vec(),
        timestamp_us: e.timestamp_us,
        adapter_id: e.adapter.to_string(),
    }
}

/// A metric sample → the wire `Metric` StreamMetrics sends.
pub fn sample_to_proto(s: crate::sampler::Sample, timestamp_us: i64) -> pb::Metric {
    pb::Metric {
        name: s.name,
        r#type: s.kind.to_owned(),
        labels: s.labels,
        value: s.value,
        timestamp_us,
    }
}

/// Ranked replica → wire score. The probability is clamped to [0, 1]: for
/// TENANT_HOT it is the producer's hit rate, which a buggy producer can send
/// out of range; ranking itself is left exactly as the reference computes it.
pub fn score_to_proto(s: &index::ReplicaScore) -> pb::ReplicaScore {
    pb::ReplicaScore {
        replica_id: s.replica_id.to_string(),
        score: s.score,
        matched_tokens: s.matched_tokens,
        estimated_cache_hit_prob: s.estimated_cache_hit_prob.clamp(0.0, 1.0),
        tier: s.tier.to_wire(),
    }
}

/// A score by id → the wire score, named `name`.
pub fn score_by_id_to_proto(name: &str, s: &index::ScoreById) -> pb::ReplicaScore {
    pb::ReplicaScore {
        replica_id: name.to_owned(),
        score: s.score,
        matched_tokens: s.matched_tokens,
        estimated_cache_hit_prob: s.estimated_cache_hit_prob.clamp(0.0, 1.0),
        tier: s.tier.to_wire(),
    }
}

/// `LookupRouteRequest` → the pipeline's request, borrowing every field;
/// `block_hashes` are the request's hashes as slices ([`hash_slices`]).
pub fn route_request<'a>(
    r: &'a pb::LookupRouteRequest,
    block_hashes: &'a [&'a [u8]],
) -> RouteRequest<'a> {
    RouteRequest {
        tenant: &r.tenant_id,
        model: &r.model_id,
        hash_scheme: &r.hash_scheme,
        adapter: &r.adapter_id,
        prefix_hash: &r.prefix_hash,
        prefix_token_count: r.prefix_token_count,
        block_hashes,
        block_token_counts: &r.block_token_counts,
        token_ids: &r.token_ids,
        prompt_text: &r.prompt_text,
        slo_ttft_ms: r.slo.map_or(0, |s| s.ttft_ms),
        cache_salt: &r.cache_salt,
        // A call's header, not a field: the handler sets it.
        shadow: false,
    }
}

/// A decoded request's block hashes as the byte slices the pipeline reads.
pub fn hash_slices(r: &pb::LookupRouteRequest) -> Vec<&[u8]> {
    r.block_hashes.iter().map(|h| &h[..]).collect()
}

/// The pipeline's outcome → `LookupRouteResponse` for the request it answers.
pub fn route_response(o: RouteOutcome, req: &pb::LookupRouteRequest) -> pb::LookupRouteResponse {
    pb::LookupRouteResponse {
        replica_scores: o
            .scores
            .iter()
            .map(|s| score_by_id_to_proto(o.names.name(s.replica), s))
            .collect(),
        reason_code: o.reason.as_str().to_owned(),
        lookup_latency_us: i64::try_from(o.latency.as_micros()).unwrap_or(i64::MAX),
        token_ids: o.echo_tokens,
        adapter_id: if o.echo_adapter {
            req.adapter_id.clone()
        } else {
            String::new()
        },
    }
}

/// Answers a wire LookupRoute through the pipeline: the gRPC handler's body.
pub async fn lookup_route(
    pipeline: &crate::route::LookupPipeline,
    req: &pb::LookupRouteRequest,
    caller_timeout: Option<std::time::Duration>,
) -> pb::LookupRouteResponse {
    let hashes = hash_slices(req);
    let outcome = pipeline
        .route(&route_request(req, &hashes), caller_timeout)
        .await;
    route_response(outcome, req)
}

/// Stored stats → wire stats (client_version is returned: decision 2).
pub fn stats_to_proto(s: &index::ReplicaStatsView) -> pb::ReplicaStats {
    pb::ReplicaStats {
        replica_id: s.replica_id.to_string(),
        cache_memory_bytes: s.cache_memory_bytes,
        hit_rate: s.hit_rate,
        pressure: s.pressure,
        client_version: s.client_version.to_string(),
        t2_hit_tokens: s.t2_hit_tokens,
        t2_query_tokens: s.t2_query_tokens,
        load: s.load.map(|l| pb::EngineLoad {
            running_requests: l.running_requests,
            waiting_requests: l.waiting_requests,
            kv_cache_usage: l.kv_cache_usage,
            kv_cache_capacity_tokens: l.kv_cache_capacity_tokens,
        }),
    }
}

/// Index cache state → `GetCacheStateResponse` (the summary is always set).
pub fn cache_state_response(s: &index::CacheState) -> pb::GetCacheStateResponse {
    pb::GetCacheStateResponse {
        replicas: s.replicas.iter().map(stats_to_proto).collect(),
        summary: Some(pb::CacheSummary {
            total_prefixes: s.total_prefixes,
            hot_prefixes: s.hot_prefixes,
        }),
    }
}

/// `LookupPdRouteRequest` → the PD router's question, borrowing every field.
pub fn pd_request(r: &pb::LookupPdRouteRequest) -> crate::pd::PdRequest<'_> {
    crate::pd::PdRequest {
        tenant: &r.tenant_id,
        model: &r.model_id,
        prefix_hash: &r.prefix_hash,
        prefix_token_count: r.prefix_token_count,
        topology: &r.pd_topology_ref,
    }
}

/// The PD router's pick → `LookupPdRouteResponse`.
pub fn pd_response(p: crate::pd::PdPick) -> pb::LookupPdRouteResponse {
    pb::LookupPdRouteResponse {
        prefill_replica_id: p.prefill,
        decode_replica_id: p.decode,
        transport_hint: p.transport,
        reason_code: p.reason.as_str().to_owned(),
    }
}

/// `RenderTemplateRequest` → the template store's question.
pub fn render_request(r: &pb::RenderTemplateRequest) -> crate::templates::RenderRequest<'_> {
    crate::templates::RenderRequest {
        template: &r.template_ref,
        variables: &r.variables,
    }
}

/// A render outcome → `RenderTemplateResponse`.
pub fn render_response(o: crate::templates::RenderOutcome) -> pb::RenderTemplateResponse {
    use crate::templates::RenderOutcome;
    let reason_code = o.reason().as_str().to_owned();
    match o {
        RenderOutcome::NotFound => pb::RenderTemplateResponse {
            reason_code,
            ..Default::default()
        },
        RenderOutcome::Rendered { template, rendered } => pb::RenderTemplateResponse {
            stable_prefix_hash: rendered.stable_prefix_hash(),
            rendered_prompt: rendered.prompt.into_bytes(),
            tenant_namespace: template.namespace().as_bytes().to_vec(),
            reason_code,
            template_revision: template.revision().to_owned(),
        },
        RenderOutcome::Failed { template } => pb::RenderTemplateResponse {
            reason_code,
            template_revision: template.revision().to_owned(),
            tenant_namespace: template.namespace().as_bytes().to_vec(),
            ..Default::default()
        },
    }
}

//! Index behaviour tests: diagnostics.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;

#[test]
fn has_any_for_tenant_reports_presence() {
    let e = Env::new();
    assert!(!e.idx.has_any_for_tenant("t"));
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert!(e.idx.has_any_for_tenant("t"));
    assert!(!e.idx.has_any_for_tenant("u"));
}

#[test]
fn has_any_for_tenant_model_reports_presence() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert!(e.idx.has_any_for_tenant_model("t", "m"));
    assert!(!e.idx.has_any_for_tenant_model("t", "m2"));
}

#[test]
fn has_any_for_tenant_model_scheme_reports_presence() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert!(e.idx.has_any_for_tenant_model_scheme("t", "m", "vllm"));
    assert!(!e.idx.has_any_for_tenant_model_scheme("t", "m", "sglang"));
}

#[test]
fn has_any_tracks_removal() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.event(EventKind::PrefixEvicted, "t", "m", "r1", Some(1), "");
    assert!(!e.idx.has_any_for_tenant("t"));
    assert!(!e.idx.has_any_for_tenant_model("t", "m"));
    assert!(!e.idx.has_any_for_tenant_model_scheme("t", "m", "vllm"));
}

#[test]
fn lookup_route_classifies_unknown_tenant() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert_eq!(
        e.exact("other", "m", "vllm", 1).strategy,
        Strategy::UnknownTenant
    );
}

#[test]
fn lookup_route_classifies_unknown_model() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert_eq!(
        e.exact("t", "m2", "vllm", 1).strategy,
        Strategy::UnknownModel
    );
}

#[test]
fn lookup_route_classifies_unknown_hash_scheme() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert_eq!(
        e.exact("t", "m", "sglang", 1).strategy,
        Strategy::UnknownHashScheme
    );
}

#[test]
fn lookup_route_widening_order() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    // Everything mismatched: the outermost key (tenant) is reported.
    assert_eq!(e.exact("x", "y", "z", 1).strategy, Strategy::UnknownTenant);
    assert_eq!(e.exact("t", "y", "z", 1).strategy, Strategy::UnknownModel);
    assert_eq!(
        e.exact("t", "m", "z", 1).strategy,
        Strategy::UnknownHashScheme
    );
}

#[test]
fn lookup_route_prefix_miss_on_populated_keys_still_no_hint() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    let r = e.exact("t", "m", "vllm", 2);
    assert_eq!(r.strategy, Strategy::None);
    assert_eq!(r.strategy, Strategy::None);
}

#[test]
fn lookup_route_empty_hash_scheme_stays_no_hint() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    assert_eq!(e.exact("t", "m", "", 1).strategy, Strategy::None);
}

#[test]
fn lookup_route_empty_tenant_stays_no_hint_even_when_ingested_under_empty() {
    let e = Env::new();
    e.put("", "m", "vllm", "r1", &[(1, 16)]);
    let r = e.exact("", "m", "vllm", 1);
    assert_eq!(r.strategy, Strategy::None);
    assert!(r.scores.is_empty());
    // The low-level lookup has no emptiness check.
    let hb = h(1);
    assert_eq!(
        e.idx
            .lookup(&LookupRequest::<Vec<u8>>::new("", "m", "vllm").exact(&hb, 0))
            .scores
            .len(),
        1
    );
}

#[test]
fn lookup_route_empty_model_stays_no_hint_even_when_ingested_under_empty() {
    let e = Env::new();
    e.put("t", "", "vllm", "r1", &[(1, 16)]);
    assert_eq!(e.exact("t", "", "vllm", 1).strategy, Strategy::None);
}

#[test]
fn lookup_route_cold_start_stays_no_hint() {
    let e = Env::new();
    assert_eq!(e.exact("t", "m", "vllm", 1).strategy, Strategy::None);
    assert_eq!(
        e.chain("t", "m", "vllm", &[1], &[16]).strategy,
        Strategy::None
    );
}

#[test]
fn lookup_route_unknown_tenant_only_when_index_has_data() {
    let e = Env::new();
    assert_eq!(e.exact("t", "m", "vllm", 1).strategy, Strategy::None);
    // Reserved-tenant entries make the index "not empty" (quirk 2).
    e.put(PROBE_TENANT, "m", "vllm", "p", &[(1, 16)]);
    assert_eq!(
        e.exact("t", "m", "vllm", 1).strategy,
        Strategy::UnknownTenant
    );
}

#[test]
fn lookup_route_tenant_hot_still_fires() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.stats("t", "m", "r1", 0.5, 0.0);
    let r = e.exact("t", "m", "vllm", 2);
    assert_eq!(r.strategy, Strategy::TenantHot);
    assert_eq!(r.strategy, Strategy::TenantHot);
}

#[test]
fn lookup_route_chain_bearing_miss_diagnoses() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.stats("t", "m", "r1", 0.5, 0.0);
    // Chain misses never become TENANT_HOT.
    assert_eq!(
        e.chain("t", "m", "vllm", &[5], &[16]).strategy,
        Strategy::None
    );
    assert_eq!(
        e.chain("x", "m", "vllm", &[5], &[16]).strategy,
        Strategy::UnknownTenant
    );
    assert_eq!(
        e.chain("t", "m2", "vllm", &[5], &[16]).strategy,
        Strategy::UnknownModel
    );
    assert_eq!(
        e.chain("t", "m", "sglang", &[5], &[16]).strategy,
        Strategy::UnknownHashScheme
    );
}

#[test]
fn lookup_route_without_fingerprint_input_is_no_hint() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 16)]);
    e.stats("t", "m", "r1", 0.5, 0.0);
    let r = e
        .idx
        .lookup_route(&LookupRequest::<Vec<u8>>::new("t", "m", "vllm"));
    assert_eq!(r.strategy, Strategy::None);
    assert!(r.scores.is_empty());
}

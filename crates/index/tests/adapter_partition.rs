//! Index behaviour tests: adapter partition.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod common;
use common::*;
use inferencecache_index::*;

fn put_adapter(e: &Env, replica: &str, update_adapter: &str, entry_adapter: &str, hash: u64) {
    let mut p = legacy(hash, 64);
    p.adapter_id = entry_adapter.into();
    let mut u = upd("t", "m", "vllm", replica, vec![p]);
    u.adapter_id = update_adapter.into();
    e.idx.ingest(&u);
}

fn exact_adapter(e: &Env, adapter: &str, hash: u64) -> LookupRouteResult {
    let hb = h(hash);
    e.idx.lookup_route(
        &LookupRequest::<Vec<u8>>::new("t", "m", "vllm")
            .adapter(adapter)
            .exact(&hb, 0),
    )
}

#[test]
fn adapter_partition_does_not_alias_across_adapters() {
    let e = Env::new();
    put_adapter(&e, "r1", "lora-a", "", 1);
    let r = exact_adapter(&e, "lora-b", 1);
    assert!(r.scores.is_empty());
    assert!(exact_adapter(&e, "", 1).scores.is_empty());
}

#[test]
fn adapter_partition_same_adapter_still_hits() {
    let e = Env::new();
    put_adapter(&e, "r1", "lora-a", "", 1);
    let r = exact_adapter(&e, "lora-a", 1);
    assert_eq!(r.strategy, Strategy::PrefixMatch);
    assert_eq!(ids(&r), vec!["r1"]);
}

#[test]
fn adapter_partition_absent_adapter_is_legacy_behavior() {
    let e = Env::new();
    e.put("t", "m", "vllm", "r1", &[(1, 64)]);
    assert_eq!(ids(&exact_adapter(&e, "", 1)), vec!["r1"]);
}

#[test]
fn adapter_partition_update_level_default_and_per_entry_override() {
    let e = Env::new();
    put_adapter(&e, "r1", "lora-a", "lora-b", 1);
    put_adapter(&e, "r1", "lora-a", "", 2);
    assert!(exact_adapter(&e, "lora-a", 1).scores.is_empty());
    assert_eq!(ids(&exact_adapter(&e, "lora-b", 1)), vec!["r1"]);
    assert_eq!(ids(&exact_adapter(&e, "lora-a", 2)), vec!["r1"]);
}

#[test]
fn adapter_partition_chain_path_does_not_alias() {
    let e = Env::new();
    let mut p = chain(&[1, 2], &[16, 16]);
    p.adapter_id = "lora-a".into();
    e.idx.ingest(&upd("t", "m", "vllm", "r1", vec![p]));
    let hs = vec![h(1), h(2)];
    let c = [16, 16];
    let hit = e.idx.lookup_route(
        &LookupRequest::new("t", "m", "vllm")
            .adapter("lora-a")
            .chain(&hs, &c),
    );
    assert_eq!(hit.scores[0].matched_tokens, 32);
    let miss = e.idx.lookup_route(
        &LookupRequest::new("t", "m", "vllm")
            .adapter("lora-b")
            .chain(&hs, &c),
    );
    assert!(miss.scores.is_empty());
    let base = e
        .idx
        .lookup_route(&LookupRequest::new("t", "m", "vllm").chain(&hs, &c));
    assert!(base.scores.is_empty());
}

#[test]
fn adapter_partition_eviction_is_scoped_to_its_adapter() {
    let e = Env::new();
    put_adapter(&e, "r1", "lora-a", "", 1);
    put_adapter(&e, "r1", "lora-b", "", 1);
    let out = e.event(EventKind::PrefixEvicted, "t", "m", "r1", Some(1), "lora-a");
    assert_eq!(out.entries_removed, 1);
    assert!(exact_adapter(&e, "lora-a", 1).scores.is_empty());
    assert_eq!(ids(&exact_adapter(&e, "lora-b", 1)), vec!["r1"]);
}

#[test]
fn adapter_partition_eviction_without_adapter_sweeps_every_partition() {
    let e = Env::new();
    put_adapter(&e, "r1", "lora-a", "", 1);
    put_adapter(&e, "r1", "lora-b", "", 1);
    put_adapter(&e, "r1", "", "", 1);
    let out = e.event(EventKind::PrefixEvicted, "t", "m", "r1", Some(1), "");
    assert_eq!(out.entries_removed, 3);
    assert_eq!(e.idx.total_entries(), 0);
}

#[test]
fn adapter_partition_all_cleared_ignores_adapter() {
    let e = Env::new();
    put_adapter(&e, "r1", "lora-a", "", 1);
    put_adapter(&e, "r1", "lora-b", "", 2);
    put_adapter(&e, "r2", "lora-b", "", 2);
    let out = e.event(EventKind::AllCleared, "t", "m", "r1", None, "lora-a");
    assert_eq!(out.entries_removed, 2);
    assert_eq!(e.idx.total_entries(), 1);
    assert_eq!(ids(&exact_adapter(&e, "lora-b", 2)), vec!["r2"]);
}

#[test]
fn adapter_partition_miss_classifier_unchanged_by_adapter() {
    let e = Env::new();
    put_adapter(&e, "r1", "lora-a", "", 1);
    let r = exact_adapter(&e, "lora-unseen", 1);
    assert_eq!(r.strategy, Strategy::None);
}

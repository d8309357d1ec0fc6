//! The live status page end to end: a real headless Chromium (Debian's
//! `chromium`, driven over the DevTools pipe by python/chromium_driver.py)
//! loads `/ui` from the real `inferencecache serve`, which a real
//! `inferencecache subscribe` feeds from the Python engine publisher.
//! The DOM must show the replica within 2 s of its first report and update
//! live when an eviction arrives. And `/ui/events` must survive a client
//! that never reads: bounded, dropped, counted, ingest unaffected.
//!
//! The page's screenshot is written to the test's temp dir; with
//! INFERENCECACHE_UPDATE_SCREENSHOTS=1 it also replaces docs/img/status-page.png.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/browser.rs"]
mod browser;
mod common;
#[path = "common/engine.rs"]
mod engine;

use browser::{Browser, chromium};
use common::{http_get, repo_root};
use inferencecache_proto::v1alpha1::LookupRouteRequest;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const REPLICA: &str = "engine-0";

/// A few LookupRoute calls (so the reason-code charts have data): tokens
/// `0..64` match the replica, `9000..9064` match nothing.
fn lookups(grpc: &str, n: usize) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = InferenceCacheClient::connect(format!("http://{grpc}"))
            .await
            .unwrap();
        for i in 0..n {
            let start = if i % 3 == 0 { 9000 } else { 0 };
            c.lookup_route(LookupRouteRequest {
                model_id: "m".into(),
                tenant_id: "t".into(),
                hash_scheme: "vllm".into(),
                // The 64 stored tokens and the next: a prompt's last
                // token is recomputed, so all four blocks are reusable.
                token_ids: (start..start + 65).collect(),
                ..Default::default()
            })
            .await
            .unwrap();
        }
    });
}

fn prefixes_cell() -> String {
    format!("document.querySelector('#replicas tr[data-replica=\"{REPLICA}\"] .prefixes')")
}

#[test]
fn page_shows_the_replica_and_live_evictions() {
    let Some(py) = engine::python() else { return };
    let Some(chromium) = chromium() else { return };
    let server = engine::serve(&[]);
    let grpc = server.addr("grpc_addr");
    let control = server.addr("snapshot_addr");

    let mut page = Browser::open(&py, &chromium, &format!("http://{control}/ui"));
    // Loaded, polling, and the live feed connected, before anything reports.
    page.wait_true(
        "document.getElementById('status').textContent === 'serving' && \
         document.getElementById('feed-status').textContent === 'live'",
        Duration::from_secs(10),
    );
    assert_eq!(
        page.eval("document.querySelectorAll('#replicas tr[data-replica]').length"),
        json!(0)
    );

    let mut eng = engine::Publisher::start(&py);
    let _sidecar = engine::subscribe(&eng, REPLICA, &grpc, &[]);
    // The first report: four blocks. The clock starts when the engine
    // publishes them, so the budget includes the sidecar and the server.
    let published = Instant::now();
    eng.store(1, 4, None, 0);
    page.wait_true(
        &format!("!!document.querySelector('#replicas tr[data-replica=\"{REPLICA}\"]')"),
        Duration::from_secs(5),
    );
    let shown = published.elapsed();
    assert!(
        shown <= Duration::from_secs(2),
        "replica shown {shown:?} after its first report (budget 2 s)"
    );
    page.wait_true(
        &format!("{}.textContent === '4'", prefixes_cell()),
        Duration::from_secs(2),
    );
    eprintln!("replica on the page {shown:?} after the engine published");

    // An eviction: the feed shows it and the replica's row follows.
    let evicted = Instant::now();
    eng.remove(3, 2);
    let feed_row = format!(
        "!!document.querySelector('#feed li[data-type=\"PREFIX_EVICTED\"][data-replica=\"{REPLICA}\"]')"
    );
    page.wait_true(&feed_row, Duration::from_secs(2));
    page.wait_true(
        &format!("{}.textContent === '2'", prefixes_cell()),
        Duration::from_secs(2),
    );
    eprintln!(
        "eviction on the page {:?} after the engine published it",
        evicted.elapsed()
    );
    assert_eq!(
        page.eval("document.getElementById('n-PREFIX_EVICTED').textContent"),
        json!("2")
    );

    // Traffic until the picture has a PREFIX_MATCH chart, then the screenshot.
    eng.store(1, 4, None, 0);
    let chart = "!!document.querySelector('#charts .chart[data-reason=\"PREFIX_MATCH\"]')";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while page.eval(chart) != json!(true) {
        assert!(
            std::time::Instant::now() < deadline,
            "no PREFIX_MATCH chart after 10 s of lookups"
        );
        lookups(&grpc, 60);
    }
    let shot = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    page.screenshot(&shot);
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    if std::env::var("INFERENCECACHE_UPDATE_SCREENSHOTS").as_deref() == Ok("1") {
        std::fs::copy(&shot, repo_root().join("docs/img/status-page.png")).unwrap();
    }
}

/// Reads one HTTP/1.1 response head from a raw socket.
fn read_head(conn: &mut std::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        conn.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

#[test]
fn a_client_that_never_reads_is_bounded_dropped_and_counted() {
    let Some(py) = engine::python() else { return };
    let server = engine::serve(&[]);
    let grpc = server.addr("grpc_addr");
    let control = server.addr("snapshot_addr");
    let public = server.addr("http_addr");

    // A client that opens the feed and then never reads another byte.
    let mut stalled = std::net::TcpStream::connect(&control).unwrap();
    stalled
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stalled,
        "GET /ui/events HTTP/1.1\r\nHost: {control}\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let head = read_head(&mut stalled);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/event-stream"), "{head}");
    let (_, m) = http_get(&public, "/metrics");
    assert_eq!(engine::metric(&m, "inferencecache_ui_event_clients"), 1.0);

    // Far more changes than the socket buffers plus the client's queue hold.
    let mut eng = engine::Publisher::start(&py);
    let _sidecar = engine::subscribe(&eng, REPLICA, &grpc, &[]);
    let blocks: u64 = 20_000;
    let started = Instant::now();
    for chunk in 0..(blocks / 200) {
        let base = 1 + chunk * 200;
        eng.store(
            base,
            200,
            (chunk > 0).then(|| base - 1),
            (chunk * 200 * 16) as u32,
        );
    }
    // Ingest keeps up regardless: every block is indexed.
    let mut entries = 0.0;
    for _ in 0..200 {
        let (_, m) = http_get(&public, "/metrics");
        entries = engine::metric(&m, "inferencecache_index_replica_entries");
        if entries >= blocks as f64 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        entries, blocks as f64,
        "ingest stalled behind a stalled page"
    );
    eprintln!(
        "{blocks} blocks indexed in {:?} with a stalled feed client",
        started.elapsed()
    );

    // The stalled client's drops are counted while it still does not read.
    let mut dropped = 0.0;
    for _ in 0..100 {
        let (_, m) = http_get(&public, "/metrics");
        dropped = engine::metric(&m, "inferencecache_ui_events_dropped_total");
        if dropped > 0.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        dropped > 0.0,
        "no drop counted for a client that never reads"
    );
    let (_, state) = http_get(&control, "/ui/state");
    let state: Value = serde_json::from_str(&state).unwrap();
    // (Drops may still be accruing while the forwarder drains the ring.)
    assert!(
        state["feed"]["dropped"].as_f64().unwrap() >= dropped,
        "{state}"
    );

    // The client is still connected and, once it reads, is told what it lost.
    let mut seen = String::new();
    let mut buf = vec![0u8; 1 << 16];
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.contains("event: dropped") && Instant::now() < deadline {
        // A later change flushes the announcement once the queue has room.
        let n = stalled.read(&mut buf).unwrap();
        assert!(n > 0, "the feed closed");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
        if seen.len() > 4 << 20 {
            seen = seen.split_off(seen.len() - 4096);
        }
        eng.remove(blocks, 1);
    }
    assert!(
        seen.contains("event: dropped"),
        "never told about its drops"
    );
    drop(stalled);
    for _ in 0..100 {
        let (_, m) = http_get(&public, "/metrics");
        if engine::metric(&m, "inferencecache_ui_event_clients") == 0.0 {
            return;
        }
        eng.remove(blocks, 1);
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the stalled client's forwarder outlived its connection");
}

#[test]
fn ui_endpoints_answer_get_only_and_the_page_is_self_contained() {
    let server = engine::serve(&[]);
    let control = server.addr("snapshot_addr");
    let (status, body) = http_get(&control, "/ui");
    assert!(status.contains("200"), "{status}");
    // Offline in a cluster: nothing loaded from anywhere else.
    for external in ["http://", "https://", "//cdn", "<link", "src="] {
        assert!(!body.contains(external), "page references {external}");
    }
    let (status, body) = http_get(&control, "/ui/state");
    assert!(status.contains("200"), "{status}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["ready"], true);
    assert_eq!(v["bus"], Value::Null);
    let (status, _) = common::http_send(&control, "POST", "/ui/state", &[], b"");
    assert!(status.contains("405"), "{status}");
    // The public listener does not serve the page.
    let (status, _) = http_get(&server.addr("http_addr"), "/ui");
    assert!(status.contains("404"), "{status}");
}

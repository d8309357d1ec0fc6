//! The shipped Grafana dashboard and alert rules against a real Prometheus
//! (Debian's `prometheus`): it scrapes a real `inferencecache serve` and two
//! real sidecars (fed by the Python engine publisher) under load on
//! loopback, loads the alert rules, and then
//! - every dashboard query must return data;
//! - every alert expression must evaluate, every metric it names must exist
//!   and every label it matches on must exist on that metric;
//! - Prometheus must report every alert rule healthy.
//!
//! No typo'd metric or label name survives. Two documented exemptions:
//! `inferencecache_operator_*` (the operator is not part of this test; its
//! own tests cover its metrics) and `inferencecache_bus_*` while the server
//! exposes no bus metrics (the replication bus is not on this branch).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/engine.rs"]
mod engine;

use common::{http_get, http_send, repo_root, require, tool};
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::{CacheStateUpdate, LookupRouteRequest, PrefixEntry};
use serde_json::Value;
use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What `$__rate_interval` becomes: several 1 s scrapes.
const RATE_INTERVAL: &str = "15s";

/// The exemptions above: metric prefixes not produced by this setup.
const NOT_HERE: [&str; 1] = ["inferencecache_operator_"];

fn free_port() -> u16 {
    inferencecache_testkit::free_port()
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct Prometheus {
    child: Child,
    addr: String,
}

impl Prometheus {
    fn query(&self, q: &str) -> Value {
        let (_, body) = http_get(&self.addr, &format!("/api/v1/query?query={}", encode(q)));
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("prometheus said {body}"))
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every dashboard target's expression, `$__rate_interval` filled in.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = repo_root().join("config/observability/grafana-dashboard.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", RATE_INTERVAL);
            out.push((p["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    out
}

/// (alert name, expression) of every rule in the shipped rule file. The
/// file's shape is fixed (`- alert:` then `expr:`, inline or `|` block).
fn alert_rules() -> Vec<(String, String)> {
    let path = repo_root().join("config/overlays/observability/alerts.rules.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut name = String::new();
    let mut i = 0;
    while i < lines.len() {
        let l = lines[i].trim_start();
        if let Some(n) = l.strip_prefix("- alert:") {
            name = n.trim().to_owned();
        } else if let Some(e) = l.strip_prefix("expr:") {
            let e = e.trim();
            if e == "|" {
                let indent = lines[i].len() - l.len();
                let mut block = Vec::new();
                while i + 1 < lines.len() {
                    let next = lines[i + 1];
                    let deeper = next.len() - next.trim_start().len() > indent;
                    if next.trim().is_empty() || !deeper {
                        break;
                    }
                    block.push(next.trim());
                    i += 1;
                }
                out.push((name.clone(), block.join(" ")));
            } else {
                out.push((name.clone(), e.to_owned()));
            }
        }
        i += 1;
    }
    assert_eq!(out.len(), text.matches("- alert:").count(), "rule parse");
    out
}

/// The metric names in an expression, each with the label names it
/// matches on.
fn selectors(expr: &str) -> Vec<(String, BTreeSet<String>)> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < b.len() && ((b[i] as char).is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let word = &expr[start..i];
            let is_metric = word.starts_with("inferencecache_") || word == "up";
            let mut labels = BTreeSet::new();
            if i < b.len() && b[i] == b'{' {
                let end = expr[i..].find('}').unwrap() + i;
                for m in expr[i + 1..end].split(',') {
                    let label: String = m
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !label.is_empty() {
                        labels.insert(label);
                    }
                }
                i = end;
            }
            if is_metric {
                out.push((word.to_owned(), labels));
            }
        } else if c == '"' {
            i += 1 + expr[i + 1..].find('"').unwrap();
        }
        i += 1;
    }
    out
}

/// Keeps LookupRoute traffic flowing (hits, misses, unknown tenants) until stopped.
fn lookup_load(grpc: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut c = InferenceCacheClient::connect(format!("http://{grpc}"))
                .await
                .unwrap();
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let (tenant, start) = match i % 4 {
                    0 => ("t", 0),
                    1 => ("u", 0),
                    2 => ("u", 50_000),
                    _ => ("nobody", 0),
                };
                let _ = c
                    .lookup_route(LookupRouteRequest {
                        model_id: "m".into(),
                        tenant_id: tenant.into(),
                        hash_scheme: "vllm".into(),
                        token_ids: (start..start + 64).collect(),
                        ..Default::default()
                    })
                    .await;
                i += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    })
}

/// One update from a producer that forgot its hash scheme: dropped at
/// ingest (`inferencecache_ingest_dropped_total{reason="no_hash_scheme"}`).
fn report_without_scheme(grpc: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = InferenceCacheClient::connect(format!("http://{grpc}"))
            .await
            .unwrap();
        let update = CacheStateUpdate {
            replica_id: "no-scheme".into(),
            model_id: "m".into(),
            tenant_id: "u".into(),
            prefixes: vec![PrefixEntry {
                prefix_hash: vec![7; 8],
                token_count: 16,
                ..Default::default()
            }],
            ..Default::default()
        };
        let stream = futures::stream::iter(vec![update]);
        c.report_cache_state(stream).await.unwrap();
    });
}

#[test]
fn every_dashboard_query_and_alert_expression_returns_data() {
    let Some(prometheus) = require("prometheus", tool("PROMETHEUS", "prometheus", "prometheus"))
    else {
        return;
    };
    let Some(py) = engine::python() else { return };
    let server = engine::serve(&["--index-max-entries", "400"]);
    let grpc = server.addr("grpc_addr");
    let control = server.addr("snapshot_addr");
    let public = server.addr("http_addr");
    // Tenant t has a quota (quota evictions); u has none and pushes the
    // index past its cap (cap evictions).
    let (status, _) = http_send(
        &control,
        "POST",
        "/policy",
        &[("Content-Type", "application/json")],
        br#"{"version":7,"policies":[{"namespace":"t"}],"tenants":[{"tenantID":"t","maxIndexEntries":100}]}"#,
    );
    assert!(status.contains("204"), "{status}");
    let mut eng_t = engine::Publisher::start(&py);
    let mut eng_u = engine::Publisher::start(&py);
    let side_t = engine::subscribe_as(&eng_t, "engine-t", "m", "t", &grpc, &[]);
    let side_u = engine::subscribe_as(&eng_u, "engine-u", "m", "u", &grpc, &[]);
    for chunk in 0..6u64 {
        let base = 1 + chunk * 50;
        let parent = (chunk > 0).then(|| base - 1);
        eng_t.store(base, 50, parent, (chunk * 800) as u32);
        eng_u.store(base, 50, parent, (chunk * 800) as u32);
        eng_u.store(
            10_000 + base,
            50,
            (chunk > 0).then(|| 10_000 + base - 1),
            100_000 + (chunk * 800) as u32,
        );
    }
    // An unknown parent: the sidecar drops the blocks (dropped_blocks_total).
    eng_t.store(90_000, 2, Some(89_999), 500_000);
    eng_u.remove(1, 10);
    report_without_scheme(&grpc);
    let stop = Arc::new(AtomicBool::new(false));
    let load = lookup_load(grpc.clone(), Arc::clone(&stop));

    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("prometheus-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rules = repo_root().join("config/overlays/observability/alerts.rules.yaml");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - {rules}\n\
         scrape_configs:\n\
         - job_name: inference-cache-server\n  static_configs:\n    - targets: ['{public}']\n\
         - job_name: inference-cache-sidecar\n  static_configs:\n    - targets: ['{}', '{}']\n",
        side_t.addr("http_addr"),
        side_u.addr("http_addr"),
        rules = rules.canonicalize().unwrap().display(),
    );
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(&prometheus)
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
        .spawn()
        .expect("spawn prometheus");
    let mut prom = Prometheus { child, addr };
    let up = Instant::now();
    while std::net::TcpStream::connect(&prom.addr).is_err()
        || !http_get(&prom.addr, "/-/ready").0.contains("200")
    {
        assert!(
            up.elapsed() < Duration::from_secs(30),
            "prometheus never became ready; see {}",
            dir.join("prometheus.log").display()
        );
        assert!(
            prom.child.try_wait().unwrap().is_none(),
            "prometheus exited; see {}",
            dir.join("prometheus.log").display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let queries = dashboard_queries();
    let alerts = alert_rules();
    assert!(queries.len() >= 15, "{} dashboard queries", queries.len());
    let (_, server_metrics) = http_get(&public, "/metrics");
    let bus_here = server_metrics.contains("inferencecache_bus_");
    let exempt = |expr: &str| {
        NOT_HERE.iter().any(|p| expr.contains(p))
            || (!bus_here && expr.contains("inferencecache_bus_"))
    };

    // Rates need a few scrapes; keep asking until every check passes or time is up.
    let started = Instant::now();
    let mut failures: Vec<String>;
    loop {
        failures = Vec::new();
        for (title, expr) in &queries {
            if exempt(expr) {
                continue;
            }
            let r = prom.query(expr);
            let n = r["data"]["result"].as_array().map_or(0, Vec::len);
            if r["status"] != "success" || n == 0 {
                failures.push(format!("dashboard {title:?}: {expr} -> {r}"));
            }
        }
        for (alert, expr) in &alerts {
            let r = prom.query(expr);
            if r["status"] != "success" {
                failures.push(format!("alert {alert}: {expr} -> {r}"));
            }
            for (metric, labels) in selectors(expr) {
                if exempt(&metric) {
                    continue;
                }
                let mut checks = vec![format!("count({metric})")];
                checks.extend(
                    labels
                        .iter()
                        .map(|l| format!("count({metric}{{{l}!=\"\"}})")),
                );
                for q in checks {
                    let r = prom.query(&q);
                    if r["data"]["result"].as_array().map_or(0, Vec::len) == 0 {
                        failures.push(format!("alert {alert}: {q} has no data"));
                    }
                }
            }
        }
        let (_, rules) = http_get(&prom.addr, "/api/v1/rules");
        let rules: Value = serde_json::from_str(&rules).unwrap_or(Value::Null);
        let loaded: Vec<&Value> = rules["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().into_iter().flatten())
            .collect();
        if loaded.len() != alerts.len() {
            failures.push(format!(
                "prometheus loaded {} rules, want {}",
                loaded.len(),
                alerts.len()
            ));
        }
        for r in loaded {
            if r["health"] != "ok" {
                failures.push(format!(
                    "rule {} health {} {}",
                    r["name"], r["health"], r["lastError"]
                ));
            }
        }
        if failures.is_empty() || started.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    assert!(
        failures.is_empty(),
        "after {:?}:\n{}",
        started.elapsed(),
        failures.join("\n")
    );
    eprintln!(
        "{} dashboard queries and {} alert rules checked against Prometheus in {:?}",
        queries.len(),
        alerts.len(),
        started.elapsed()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn selectors_find_metrics_and_matched_labels() {
    let s = selectors(
        r#"sum by (namespace) (rate(inferencecache_x_total{reason_code="NO_HINT",a!="b"}[10m])) / up{job="j"}"#,
    );
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].0, "inferencecache_x_total");
    assert_eq!(
        s[0].1.iter().cloned().collect::<Vec<_>>(),
        ["a", "reason_code"]
    );
    assert_eq!(s[1].0, "up");
}

//! The real binary against real ecosystem tools: grpcurl (reflection v1alpha),
//! promtool (Prometheus's own exposition linter) and a Python client generated
//! by grpcio-tools. `.ci/run` installs them; locally a missing tool skips its
//! test with a printed reason, unless INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{ServerProcess, grpcurl, http_get, repo_root, require, tool};
use std::path::PathBuf;
use std::process::{Command, Output};

/// A Python that can import grpcio and grpcio-tools.
fn python() -> Option<PathBuf> {
    let py = tool("INFERENCECACHE_PYTHON", "python", "python3").filter(|p| {
        Command::new(p)
            .args(["-c", "import grpc, grpc_tools"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    require("python with grpcio + grpcio-tools", py)
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("run tool");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn grpcurl_lists_both_services_through_reflection() {
    let Some(g) = grpcurl() else { return };
    let s = ServerProcess::start(&[]);
    let out = stdout(&run(Command::new(&g).args(["-plaintext", &s.grpc, "list"])));
    assert!(
        out.lines()
            .any(|l| l == "inferencecache.v1alpha1.InferenceCache"),
        "{out}"
    );
    assert!(out.lines().any(|l| l == "grpc.health.v1.Health"), "{out}");
}

#[test]
fn grpcurl_describes_the_service() {
    let Some(g) = grpcurl() else { return };
    let s = ServerProcess::start(&[]);
    let out = stdout(&run(Command::new(&g).args([
        "-plaintext",
        &s.grpc,
        "describe",
        "inferencecache.v1alpha1.InferenceCache",
    ])));
    for rpc in [
        "rpc RenderTemplate",
        "rpc LookupRoute",
        "rpc LookupPDRoute",
        "rpc GetCacheState",
        "rpc ReportCacheState ( stream",
        "rpc PublishEvent",
        "rpc StreamCacheEvents",
        "rpc StreamMetrics",
    ] {
        assert!(out.contains(rpc), "{rpc} missing from: {out}");
    }
    let msg = stdout(&run(Command::new(&g).args([
        "-plaintext",
        &s.grpc,
        "describe",
        "inferencecache.v1alpha1.LookupRouteRequest",
    ])));
    assert!(msg.contains("string adapter_id = 11;"), "{msg}");
    assert!(msg.contains("repeated uint32 token_ids = 9;"), "{msg}");
}

#[test]
fn grpcurl_lookup_route_gets_no_hint() {
    let Some(g) = grpcurl() else { return };
    let s = ServerProcess::start(&[]);
    let out = stdout(&run(Command::new(&g).args([
        "-plaintext",
        "-d",
        r#"{"modelId":"m","tenantId":"t","hashScheme":"vllm","prefixHash":"AAAAAN6tvu8="}"#,
        &s.grpc,
        "inferencecache.v1alpha1.InferenceCache/LookupRoute",
    ])));
    let v: serde_json::Value = serde_json::from_str(&out).expect("grpcurl prints JSON");
    assert_eq!(v["reasonCode"], "NO_HINT", "{out}");
    assert!(v.get("replicaScores").is_none(), "{out}");
}

#[test]
fn grpcurl_health_check_is_serving() {
    let Some(g) = grpcurl() else { return };
    let s = ServerProcess::start(&[]);
    let out = stdout(&run(Command::new(&g).args([
        "-plaintext",
        &s.grpc,
        "grpc.health.v1.Health/Check",
    ])));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "SERVING");
}

#[test]
fn promtool_accepts_the_metrics_exposition() {
    let Some(promtool) = require("promtool", tool("PROMTOOL", "promtool", "promtool")) else {
        return;
    };
    let s = ServerProcess::start(&[]);
    // Make the lazily created labelled series (counter, histogram) appear.
    if let Some(g) = tool("GRPCURL", "grpcurl", "grpcurl") {
        run(Command::new(&g).args([
            "-plaintext",
            "-d",
            r#"{"modelId":"m"}"#,
            &s.grpc,
            "inferencecache.v1alpha1.InferenceCache/LookupRoute",
        ]));
    }
    let (status, body) = http_get(&s.http, "/metrics");
    assert!(status.contains(" 200 "), "{status}");
    let file = std::env::temp_dir().join(format!("ic-metrics-{}.txt", std::process::id()));
    std::fs::write(&file, &body).unwrap();
    let out = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let lint = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "promtool rc {:?}: {lint}\n{body}",
        out.status.code()
    );
    assert!(lint.trim().is_empty(), "promtool lint findings: {lint}");
}

#[test]
fn python_grpcio_client_calls_every_rpc() {
    let Some(py) = python() else { return };
    let s = ServerProcess::start(&[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/every_rpc.py");
    let out = run(Command::new(py)
        .arg(script)
        .arg(repo_root().join("proto"))
        .arg(&s.grpc));
    assert!(
        stdout(&out).contains("8 passed, 0 failed"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn python_gateway_scenario_report_lookup_policy_stream() {
    let Some(py) = python() else { return };
    let s = ServerProcess::start(&[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/scenario.py");
    let out = run(Command::new(py)
        .arg(script)
        .arg(repo_root().join("proto"))
        .arg(&s.grpc)
        .arg(&s.control)
        .arg(&s.http));
    assert!(
        stdout(&out).contains("6 passed, 0 failed"),
        "{}",
        stdout(&out)
    );
}

//! `inferencecache doctor` against real processes: the happy path (server,
//! policy, a sidecar fed by the Python engine publisher) and three broken
//! setups (server down, a sidecar on the wrong ZMQ endpoint, a TLS
//! mismatch in both directions), each with the right remediation line.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "common/engine.rs"]
mod engine;

use common::{http_get, http_send};
use serde_json::Value;
use std::time::Duration;

/// Runs doctor with `args`; (exit code, stdout).
fn doctor(args: &[&str]) -> (i32, String) {
    common::run_doctor(args, &[])
}

/// The `--json` report's check named `name`.
fn check<'a>(report: &'a Value, name: &str) -> &'a Value {
    common::doctor_check(report, name, |n| n.starts_with(name))
}

fn free_port() -> u16 {
    inferencecache_testkit::free_port()
}

fn server_flags(server: &engine::Proc) -> Vec<String> {
    vec![
        "--server".into(),
        format!("http://{}", server.addr("grpc_addr")),
        "--http".into(),
        server.addr("http_addr"),
        "--control".into(),
        server.addr("snapshot_addr"),
    ]
}

#[test]
fn happy_path_every_check_passes() {
    let Some(py) = engine::python() else { return };
    let server = engine::serve(&[]);
    let control = server.addr("snapshot_addr");
    let (status, _) = http_send(
        &control,
        "POST",
        "/policy",
        &[("Content-Type", "application/json")],
        br#"{"version":7,"policies":[{"namespace":"t"}]}"#,
    );
    assert!(status.contains("204"), "{status}");
    let mut eng = engine::Publisher::start(&py);
    let sidecar = engine::subscribe(&eng, "engine-0", &server.addr("grpc_addr"), &[]);
    eng.store(1, 4, None, 0);
    for _ in 0..100 {
        if http_get(&control, "/snapshot").1.contains("engine-0") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }

    let mut args = server_flags(&server);
    let sidecar_url = format!("http://{}", sidecar.addr("http_addr"));
    args.extend(["--sidecar".into(), sidecar_url]);
    args.extend(["--tenant", "t", "--model", "m"].map(String::from));
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, text) = doctor(&argv);
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("0 failed"), "{text}");
    assert!(
        !text.contains("fix:"),
        "a healthy setup needs no fix:\n{text}"
    );

    let mut json_args = argv.clone();
    json_args.push("--json");
    let (code, out) = doctor(&json_args);
    assert_eq!(code, 0, "{out}");
    let report = common::healthy_report(&out);
    assert!(
        check(&report, "lookup")["detail"]
            .as_str()
            .unwrap()
            .contains("PREFIX_MATCH"),
        "{report}"
    );
    // Its lookups are shadow lookups: no request follows them, so the
    // server must record no delivery (a phantom request on that replica).
    let metrics = http_get(&server.addr("http_addr"), "/metrics").1;
    assert!(
        metrics.contains("inferencecache_delivered_hints_total 0"),
        "{metrics}"
    );
    eprintln!("{text}");
}

#[test]
fn server_down_says_start_the_server() {
    let port = free_port();
    let (code, text) = doctor(&[
        "--server",
        &format!("http://127.0.0.1:{port}"),
        "--timeout",
        "1s",
    ]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("FAIL  server.grpc"), "{text}");
    assert!(text.contains("fix: start the server"), "{text}");
    // What depends on the server is skipped, not failed twice.
    assert!(text.contains("skip  lookup"), "{text}");
    eprintln!("{text}");
}

#[test]
fn sidecar_on_a_wrong_zmq_endpoint_says_fix_engine_endpoint() {
    let Some(py) = engine::python() else { return };
    let server = engine::serve(&[]);
    let eng = engine::Publisher::start(&py);
    // The sidecar dials a port where no engine publishes.
    let wrong = format!("tcp://127.0.0.1:{}", free_port());
    let sidecar = engine::Proc::start(&[
        "subscribe",
        "--replica-id",
        "engine-0",
        "--model-id",
        "m",
        "--tenant-id",
        "t",
        "--engine-endpoint",
        &wrong,
        "--replay-endpoint",
        &eng.replay_endpoint,
        "--server",
        &server.addr("grpc_addr"),
        "--http-bind-address",
        "127.0.0.1:0",
        "--engine-metrics-url",
        "",
    ]);
    let mut args = server_flags(&server);
    args.extend([
        "--sidecar".into(),
        format!("http://{}", sidecar.addr("http_addr")),
        "--tenant".into(),
        "t".into(),
        "--model".into(),
        "m".into(),
        "--json".into(),
    ]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    // The server link needs a moment; the engine link never comes.
    let mut report = Value::Null;
    for _ in 0..50 {
        let (code, out) = doctor(&argv);
        assert_eq!(code, 1, "{out}");
        report = serde_json::from_str(&out).unwrap();
        if check(&report, "sidecar.server")["status"] == "ok" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let c = check(&report, "sidecar.engine");
    assert_eq!(c["status"], "fail", "{report}");
    let fix = c["remediation"].as_str().unwrap();
    assert!(fix.contains("--engine-endpoint"), "{fix}");
    assert!(fix.contains("kv-events-config"), "{fix}");
    assert_eq!(check(&report, "sidecar.server")["status"], "ok", "{report}");
    assert_eq!(check(&report, "server.grpc")["status"], "ok", "{report}");
}

#[test]
fn tls_mismatch_names_the_mode_to_use() {
    let dir = std::env::temp_dir().join(format!("doctor-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    common::self_signed_cert(&cert, &key, "localhost", "IP:127.0.0.1,DNS:localhost");

    // A TLS server dialled in plaintext.
    let tls_server = engine::serve(&[
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key.to_str().unwrap(),
    ]);
    let (code, text) = doctor(
        &server_flags(&tls_server)
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("speaks TLS but doctor dialled plaintext"),
        "{text}"
    );
    assert!(text.contains("fix: TLS mismatch"), "{text}");
    assert!(text.contains("--server https://HOST:PORT"), "{text}");
    // ... and with the right flags it passes.
    let mut right = server_flags(&tls_server);
    right[1] = format!("https://{}", tls_server.addr("grpc_addr"));
    right.extend(["--tls-ca-file".into(), cert.to_str().unwrap().into()]);
    let (_, text) = doctor(&right.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(text.contains("ok    server.grpc"), "{text}");

    // A plaintext server dialled with TLS.
    let plain = engine::serve(&[]);
    let mut args = server_flags(&plain);
    args[1] = format!("https://{}", plain.addr("grpc_addr"));
    args.extend(["--tls-ca-file".into(), cert.to_str().unwrap().into()]);
    let (code, text) = doctor(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("serves plaintext gRPC but doctor was asked for TLS"),
        "{text}"
    );
    assert!(text.contains("--server http://HOST:PORT"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

//! Black-box tests of the real `inferencecache` binary: exit codes, messages
//! and the shutdown lifecycle.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{BIN, EPHEMERAL, ServerProcess, http_get, wait_for_log};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn run(args: &[&str]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("{args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn unknown_flag_exits_2() {
    let o = run(&["serve", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--no-such-flag"), "{}", stderr(&o));
}

#[test]
fn malformed_address_exits_2_naming_the_flag() {
    let o = run(&["serve", "--grpc-bind-address", "not-an-address"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("--grpc-bind-address") && e.contains("HOST:PORT"),
        "{e}"
    );
}

#[test]
fn half_set_tls_flags_exit_2() {
    let o = run(&["serve", "--tls-cert-file", "/tmp/c.pem"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--tls-cert-file and --tls-key-file must both be set or both be empty"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn both_auth_flags_exit_2() {
    let o = run(&[
        "serve",
        "--allowed-controller-sa",
        "system:serviceaccount:a:b",
        "--insecure-disable-auth",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("mutually exclusive"));
}

#[test]
fn empty_audience_with_sa_exits_2() {
    let o = run(&[
        "serve",
        "--allowed-controller-sa",
        "system:serviceaccount:a:b",
        "--policy-audience",
        " ",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--policy-audience cannot be empty"));
}

#[test]
fn public_control_address_without_auth_exits_2() {
    let o = run(&["serve", "--snapshot-bind-address", "10.255.0.1:8081"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("--insecure-disable-auth"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn bad_log_format_exits_2() {
    let o = run(&["serve", "--log-format", "xml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("json or text"));
}

#[test]
fn occupied_port_exits_1_with_a_clear_message() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut args = EPHEMERAL.to_vec();
    args[1] = &addr;
    let mut full = vec!["serve"];
    full.extend(args);
    let o = run(&full);
    assert_eq!(o.status.code(), Some(1));
    let e = stderr(&o);
    assert!(
        e.contains("cannot listen on") && e.contains("--grpc-bind-address"),
        "{e}"
    );
}

#[test]
fn unreadable_tls_file_exits_1_with_the_path() {
    let mut full = vec![
        "serve",
        "--tls-cert-file",
        "/nonexistent/cert.pem",
        "--tls-key-file",
        "/nonexistent/key.pem",
    ];
    full.extend(EPHEMERAL);
    let o = run(&full);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("/nonexistent/cert.pem"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn help_teaches_the_flags() {
    let o = run(&["serve", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    for flag in [
        "--grpc-bind-address",
        "--engine-block-size",
        "--allowed-controller-sa",
        "INFERENCECACHE_",
    ] {
        assert!(out.contains(flag), "{flag} missing from help");
    }
}

#[test]
fn sigterm_runs_the_graceful_shutdown_lifecycle() {
    let mut server = ServerProcess::start(&[]);
    let (status, body) = http_get(&server.http, "/healthz");
    assert!(status.contains(" 200 "), "{status}");
    assert_eq!(body, "ok\n");

    server.signal("TERM");
    let started = wait_for_log(&mut server.lines, "graceful_shutdown_started");
    assert_eq!(started["level"], "INFO");
    wait_for_log(&mut server.lines, "graceful_shutdown_done");
    assert_eq!(server.child.wait().unwrap().code(), Some(0));
}

#[test]
fn sigint_also_shuts_down_cleanly() {
    let mut server = ServerProcess::start(&[]);
    server.signal("INT");
    wait_for_log(&mut server.lines, "graceful_shutdown_done");
    assert_eq!(server.child.wait().unwrap().code(), Some(0));
}

#[test]
fn text_log_format_is_human_readable() {
    let mut child = Command::new(BIN)
        .args(["serve", "--log-format", "text"])
        .args(EPHEMERAL)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains("INFO") || line.contains("WARN"), "{line}");
    assert!(!line.trim_start().starts_with('{'), "not JSON: {line}");
}

#[test]
fn go_style_single_dash_flags_are_accepted() {
    let o = run(&["serve", "-tls-cert-file=/tmp/x"]);
    // Parsed as --tls-cert-file, so the half-set TLS rule fires (not "unknown flag").
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("must both be set"), "{}", stderr(&o));
}

/// Log messages of a server started with `args`, up to `listening`.
fn startup_log(args: &[&str]) -> Vec<serde_json::Value> {
    use std::io::BufRead;
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let reader = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = Vec::new();
    for line in reader.lines() {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        let done = v["message"] == "listening";
        seen.push(v);
        if done {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

#[test]
fn open_producer_path_on_a_reachable_listener_warns() {
    let local = [
        "--http-bind-address",
        "127.0.0.1:0",
        "--snapshot-bind-address",
        "127.0.0.1:0",
    ];
    for (grpc, warned) in [("0.0.0.0:0", true), ("127.0.0.1:0", false)] {
        let mut args = vec!["--grpc-bind-address", grpc];
        args.extend(local);
        let log = startup_log(&args);
        let warning = log
            .iter()
            .find(|v| v["message"] == "producer_auth_disabled");
        assert_eq!(warning.is_some(), warned, "{grpc}: {log:?}");
        if let Some(w) = warning {
            assert_eq!(w["level"], "WARN");
            assert!(
                w["warning"].as_str().unwrap().contains("--producer-auth"),
                "{w}"
            );
        }
    }
}

#[test]
fn producer_mtls_without_a_client_ca_exits_2() {
    let mut full = vec!["serve", "--producer-auth", "mtls"];
    full.extend(EPHEMERAL);
    let o = run(&full);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--tls-client-ca-file"),
        "{}",
        stderr(&o)
    );
    let o = run(&["serve", "--producer-auth", "jwt"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("none, token or mtls"), "{}", stderr(&o));
}

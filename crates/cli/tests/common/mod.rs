//! Shared helpers for black-box tests of the real binary.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Stdio};

/// The binary under test.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_inferencecache");

/// Loopback ephemeral ports for every listener.
pub(crate) const EPHEMERAL: [&str; 6] = [
    "--grpc-bind-address",
    "127.0.0.1:0",
    "--http-bind-address",
    "127.0.0.1:0",
    "--snapshot-bind-address",
    "127.0.0.1:0",
];

/// The repository root.
pub(crate) fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// JSON log lines of a child's stderr.
pub(crate) type LogLines =
    std::iter::Map<std::io::Lines<BufReader<ChildStderr>>, fn(std::io::Result<String>) -> String>;

/// Reads JSON log lines until one has `message == want`.
pub(crate) fn wait_for_log(
    lines: &mut impl Iterator<Item = String>,
    want: &str,
) -> serde_json::Value {
    for line in lines {
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        if v["message"] == want {
            return v;
        }
    }
    panic!("log {want:?} never appeared");
}

/// A running `inferencecache serve` child, killed on drop.
pub(crate) struct ServerProcess {
    pub child: Child,
    pub lines: LogLines,
    pub grpc: String,
    pub http: String,
    pub control: String,
}

impl ServerProcess {
    /// Starts the binary on ephemeral loopback ports with JSON logs and
    /// waits until it reports its bound addresses.
    pub(crate) fn start(extra: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .arg("serve")
            .args(EPHEMERAL)
            .args(extra)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn");
        let unwrap: fn(std::io::Result<String>) -> String = |r| r.unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap())
            .lines()
            .map(unwrap);
        let l = wait_for_log(&mut lines, "listening");
        let addr = |k: &str| l[k].as_str().unwrap().to_owned();
        Self {
            grpc: addr("grpc_addr"),
            http: addr("http_addr"),
            control: addr("snapshot_addr"),
            child,
            lines,
        }
    }

    /// Sends a signal by name (TERM, INT).
    pub(crate) fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args(["-s", sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal HTTP/1.0 GET; returns (status line, body).
pub(crate) fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut resp = String::new();
    conn.read_to_string(&mut resp).unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

/// A minimal HTTP/1.0 request with a body; returns (status line, body).
pub(crate) fn http_send(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (String, String) {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes()).unwrap();
    // The server may answer (and close) before reading an oversized body.
    let _ = conn.write_all(body);
    let mut resp = Vec::new();
    let _ = conn.read_to_end(&mut resp);
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    (
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    )
}

/// Finds a tool: an env override, then the repo's .venv, then PATH.
pub(crate) fn tool(env: &str, venv_name: &str, path_name: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var(env) {
        return Some(PathBuf::from(p));
    }
    let venv = repo_root().join(".venv/bin").join(venv_name);
    if venv.exists() {
        return Some(venv);
    }
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {path_name}")])
        .output()
        .ok()?;
    found
        .status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&found.stdout).trim()))
}

/// A missing real part skips its test with a printed reason, unless
/// INFERENCECACHE_REQUIRE_REAL_PARTS=1 (CI), where it fails.
pub(crate) fn require(name: &str, found: Option<PathBuf>) -> Option<PathBuf> {
    if found.is_none() {
        let msg = format!("{name} not found; run .ci/run (or its install step) to install it");
        if std::env::var("INFERENCECACHE_REQUIRE_REAL_PARTS").as_deref() == Ok("1") {
            panic!("{msg}");
        }
        eprintln!("SKIPPED: {msg}");
    }
    found
}

/// The real grpcurl, if installed.
pub(crate) fn grpcurl() -> Option<PathBuf> {
    require("grpcurl", tool("GRPCURL", "grpcurl", "grpcurl"))
}

/// Runs `inferencecache doctor` with `args` and extra environment variables;
/// (exit code, stdout).
pub(crate) fn run_doctor<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
    env: &[(&str, &str)],
) -> (i32, String) {
    let out = Command::new(BIN)
        .arg("doctor")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run doctor");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The first check of a doctor `--json` report whose name satisfies `matches`.
pub(crate) fn doctor_check<'a>(
    report: &'a serde_json::Value,
    what: &str,
    matches: impl Fn(&str) -> bool,
) -> &'a serde_json::Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"].as_str().is_some_and(&matches))
        .unwrap_or_else(|| panic!("no check {what} in {report:#}"))
}

/// Writes a self-signed P-256 server certificate for `/CN={cn}` with
/// `subjectAltName={san}`, valid for a day, made by openssl.
pub(crate) fn self_signed_cert(cert: &std::path::Path, key: &std::path::Path, cn: &str, san: &str) {
    let out = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", &format!("/CN={cn}")])
        .args(["-addext", &format!("subjectAltName={san}")])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(key)
        .arg("-out")
        .arg(cert)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Parses a doctor `--json` report and checks that it is healthy with every
/// check ok.
pub(crate) fn healthy_report(out: &str) -> serde_json::Value {
    let report: serde_json::Value = serde_json::from_str(out).unwrap();
    assert_eq!(report["healthy"], true, "{report:#}");
    for c in report["checks"].as_array().unwrap() {
        assert_eq!(c["status"], "ok", "{c}");
    }
    report
}

/// One request/answer with a Python driver that speaks JSON lines on
/// stdin/stdout (the engine publisher, the Chromium driver): writes `cmd`,
/// reads one line, parses it (`who` names the driver in the panic).
pub(crate) fn json_line_exchange(
    stdin: &mut std::process::ChildStdin,
    stdout: &mut BufReader<std::process::ChildStdout>,
    cmd: &serde_json::Value,
    who: &str,
) -> serde_json::Value {
    writeln!(stdin, "{cmd}").unwrap();
    stdin.flush().unwrap();
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|_| panic!("{who} said {line:?}"))
}

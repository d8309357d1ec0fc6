//! Shared helpers for black-box tests of the real binary.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Stdio};

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_inferencecache");

/// Loopback ephemeral ports for every listener.
pub const EPHEMERAL: [&str; 6] = [
    "--grpc-bind-address",
    "127.0.0.1:0",
    "--http-bind-address",
    "127.0.0.1:0",
    "--snapshot-bind-address",
    "127.0.0.1:0",
];

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// JSON log lines of a child's stderr.
pub type LogLines =
    std::iter::Map<std::io::Lines<BufReader<ChildStderr>>, fn(std::io::Result<String>) -> String>;

/// Reads JSON log lines until one has `message == want`.
pub fn wait_for_log(lines: &mut impl Iterator<Item = String>, want: &str) -> serde_json::Value {
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
pub struct ServerProcess {
    pub child: Child,
    pub lines: LogLines,
    pub grpc: String,
    pub http: String,
    pub control: String,
}

impl ServerProcess {
    /// Starts the binary on ephemeral loopback ports with JSON logs and
    /// waits until it reports its bound addresses.
    pub fn start(extra: &[&str]) -> Self {
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
    pub fn signal(&self, sig: &str) {
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
pub fn http_get(addr: &str, path: &str) -> (String, String) {
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

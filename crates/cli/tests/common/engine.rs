//! A real engine → sidecar → server chain for black-box tests: the Python
//! engine-style KV-event publisher (pyzmq + msgspec, `python/engine_publisher.py`),
//! `inferencecache subscribe` and `inferencecache serve`, each a child
//! process on loopback. The same shapes as subscribe_e2e's private helpers,
//! shared by the status-page, doctor and dashboard tests (include it with
//! `#[path = "common/engine.rs"] mod engine;` next to `mod common;`).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use super::common::{BIN, repo_root, wait_for_log};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// A Python that can import pyzmq and msgspec (skips the test, or fails it
/// under INFERENCECACHE_REQUIRE_REAL_PARTS=1, when there is none).
pub(crate) fn python() -> Option<PathBuf> {
    let candidates = [
        std::env::var("INFERENCECACHE_PYTHON")
            .ok()
            .map(PathBuf::from),
        Some(repo_root().join(".venv/bin/python")),
        Some(PathBuf::from("python3")),
    ];
    let found = candidates.into_iter().flatten().find(|p| {
        Command::new(p)
            .args(["-c", "import zmq, msgspec"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    super::common::require(
        "python with pyzmq + msgspec (.ci/install-real-parts)",
        found,
    )
}

/// Engine hashes above i64::MAX, as vLLM's default produces.
pub(crate) fn big(h: u64) -> u64 {
    u64::MAX - 1_000_000 + h
}

/// The Python engine publisher, driven over stdin/stdout.
pub(crate) struct Publisher {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// ZMQ PUB endpoint.
    pub pub_endpoint: String,
    /// ZMQ replay ROUTER endpoint.
    pub replay_endpoint: String,
}

impl Publisher {
    /// Starts the publisher on ephemeral loopback ports.
    pub(crate) fn start(py: &PathBuf) -> Self {
        let script = repo_root().join("crates/cli/tests/python/engine_publisher.py");
        let mut child = Command::new(py)
            .arg(script)
            .arg("kv-events")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn publisher");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap();
        Self {
            pub_endpoint: v["pub"].as_str().unwrap().to_owned(),
            replay_endpoint: v["replay"].as_str().unwrap().to_owned(),
            child,
            stdin,
            stdout,
        }
    }

    /// One command; its JSON answer.
    pub(crate) fn send(&mut self, cmd: Value) -> Value {
        super::common::json_line_exchange(&mut self.stdin, &mut self.stdout, &cmd, "publisher")
    }

    /// BlockStored (vLLM map form) of `n` 16-token blocks with engine
    /// hashes `base..base+n`, tokens from `first`.
    pub(crate) fn store(&mut self, base: u64, n: u64, parent: Option<u64>, first: u32) {
        self.store_form("map", base, n, parent, first, json!({}));
    }

    /// BlockStored in `form` (`map`, `tuple`, `sglang`) with `extra` fields
    /// (`lora_id`, `medium`, ...) merged into the command.
    pub(crate) fn store_form(
        &mut self,
        form: &str,
        base: u64,
        n: u64,
        parent: Option<u64>,
        first: u32,
        extra: Value,
    ) {
        let mut cmd = json!({
            "op": "store", "form": form,
            "hashes": (base..base + n).map(big).collect::<Vec<_>>(),
            "parent": parent.map(big),
            "tokens": [first, first + 16 * n as u32],
            "block_size": 16,
        });
        for (k, v) in extra.as_object().into_iter().flatten() {
            cmd[k] = v.clone();
        }
        self.send(cmd);
    }

    /// BlockRemoved (GPU) of engine hashes `base..base+n`.
    pub(crate) fn remove(&mut self, base: u64, n: u64) {
        self.send(json!({
            "op": "remove", "form": "map",
            "hashes": (base..base + n).map(big).collect::<Vec<_>>(),
            "medium": "GPU",
        }));
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child whose JSON log is drained on a thread (so it never blocks on a
/// full pipe; the last lines are kept, see [`Proc::logs`]), killed on drop.
pub(crate) struct Proc {
    /// The process.
    pub child: Child,
    /// The `listening` log line.
    pub listening: Value,
    logs: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<String>>>,
}

/// Log lines a [`Proc`] keeps.
const KEPT_LOG_LINES: usize = 4096;

impl Proc {
    /// Spawns `inferencecache <args>` and waits for its `listening` line.
    pub(crate) fn start(args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(args)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn inferencecache");
        let unwrap: fn(std::io::Result<String>) -> String = |r| r.unwrap_or_default();
        let mut lines = BufReader::new(child.stderr.take().unwrap())
            .lines()
            .map(unwrap);
        let listening = wait_for_log(&mut lines, "listening");
        let logs = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let keep = std::sync::Arc::clone(&logs);
        std::thread::spawn(move || {
            for l in lines {
                let mut k = keep.lock().unwrap();
                if k.len() == KEPT_LOG_LINES {
                    k.pop_front();
                }
                k.push_back(l);
            }
        });
        Self {
            child,
            listening,
            logs,
        }
    }

    /// The JSON log lines after `listening` so far (the last 4096).
    pub(crate) fn logs(&self) -> Vec<String> {
        self.logs.lock().unwrap().iter().cloned().collect()
    }

    /// An address from the `listening` line.
    pub(crate) fn addr(&self, key: &str) -> String {
        self.listening[key].as_str().unwrap().to_owned()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `inferencecache serve` on ephemeral loopback ports, once `/readyz` says
/// so (the `listening` line comes just before the server marks itself ready).
pub(crate) fn serve(extra: &[&str]) -> Proc {
    let mut args = vec!["serve"];
    args.extend_from_slice(&super::common::EPHEMERAL);
    args.extend_from_slice(extra);
    let p = Proc::start(&args);
    let http = p.addr("http_addr");
    for _ in 0..200 {
        if super::common::http_get(&http, "/readyz").0.contains("200") {
            return p;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("serve never became ready");
}

/// `inferencecache subscribe` for one replica of model `m`, tenant `t`,
/// fed by `engine`, reporting to the server's gRPC address.
pub(crate) fn subscribe(
    engine: &Publisher,
    replica: &str,
    server_grpc: &str,
    extra: &[&str],
) -> Proc {
    subscribe_as(engine, replica, "m", "t", server_grpc, extra)
}

/// As [`subscribe`], for another model and tenant.
pub(crate) fn subscribe_as(
    engine: &Publisher,
    replica: &str,
    model: &str,
    tenant: &str,
    server_grpc: &str,
    extra: &[&str],
) -> Proc {
    let mut args = vec![
        "subscribe",
        "--replica-id",
        replica,
        "--model-id",
        model,
        "--tenant-id",
        tenant,
        "--engine-endpoint",
        &engine.pub_endpoint,
        "--replay-endpoint",
        &engine.replay_endpoint,
        "--server",
        server_grpc,
        "--window",
        "20ms",
        "--http-bind-address",
        "127.0.0.1:0",
        "--engine-metrics-url",
        "",
        "--replay-timeout",
        "2s",
    ];
    args.extend_from_slice(extra);
    Proc::start(&args)
}

/// Sum of the samples of a Prometheus text body whose line starts with `prefix`.
pub(crate) fn metric(body: &str, prefix: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

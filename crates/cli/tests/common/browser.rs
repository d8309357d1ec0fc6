//! A real headless Chromium (Debian's `chromium`, driven over the DevTools
//! pipe by python/chromium_driver.py) with one page open: the status-page
//! suites (the server's `/ui`, the gateway's `/inferencecache/status`).
#![allow(dead_code, unreachable_pub)]

use super::common::{repo_root, require, tool};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The real Chromium, if installed (.ci/install-real-parts installs it).
pub(crate) fn chromium() -> Option<PathBuf> {
    let found = tool("INFERENCECACHE_CHROMIUM", "chromium", "chromium")
        .or_else(|| tool("INFERENCECACHE_CHROMIUM", "chromium", "chromium-browser"));
    require("chromium", found)
}

/// Headless Chromium with one page open, driven over stdin/stdout.
pub(crate) struct Browser {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Browser {
    pub(crate) fn open(py: &PathBuf, chromium: &PathBuf, url: &str) -> Self {
        let script = repo_root().join("crates/cli/tests/python/chromium_driver.py");
        let mut child = Command::new(py)
            .arg(script)
            .arg(chromium)
            .arg(url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn chromium driver");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert!(line.contains("ready"), "chromium driver said {line:?}");
        Self {
            child,
            stdin,
            stdout,
        }
    }

    pub(crate) fn send(&mut self, cmd: Value) -> Value {
        super::common::json_line_exchange(&mut self.stdin, &mut self.stdout, &cmd, "driver")
    }

    /// Evaluates JavaScript in the page; `Null` while it throws (the page
    /// may still be loading).
    pub(crate) fn eval(&mut self, expr: &str) -> Value {
        self.send(json!({"op": "eval", "expr": expr}))["value"].clone()
    }

    /// Polls `expr` every 20 ms until it is `true`; the time it took.
    #[track_caller]
    pub(crate) fn wait_true(&mut self, expr: &str, limit: Duration) -> Duration {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.eval(expr) == Value::Bool(true) {
                return start.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("page never satisfied {expr} within {limit:?}");
    }

    pub(crate) fn screenshot(&mut self, path: &std::path::Path) {
        let r = self.send(json!({"op": "screenshot", "path": path}));
        assert_eq!(r["ok"], true, "{r}");
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, r#"{{"op":"quit"}}"#);
        let _ = self.stdin.flush();
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! Real vLLM engines (the CPU build, `.ci/install-vllm`) with a tiny
//! random-weight model made at test time, for the suites that judge hints by
//! what the engine itself reuses. Used by the real-engine correctness suite
//! and the gateway's suite alike, so there is one way to start an engine.
//!
//! Each engine is `vllm serve` in its own process group (the API server and
//! the engine core are separate processes; the core owns the KV-event
//! publisher), pinned to one core with one OpenMP thread, with prefix caching,
//! KV events on ZMQ (publisher + replay) and `--enable-prompt-tokens-details`
//! so every response says how many prompt tokens the engine reused. The group
//! is killed on drop.

use crate::{free_port, require};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The venv `.ci/install-vllm` made (`INFERENCECACHE_VLLM_VENV` overrides).
pub fn venv() -> Option<PathBuf> {
    let dir = std::env::var("INFERENCECACHE_VLLM_VENV").map_or_else(
        |_| PathBuf::from("/var/cache/inferencecache/vllm-venv"),
        PathBuf::from,
    );
    require(
        dir.join("bin/vllm").is_file(),
        &format!("real vLLM ({}; run .ci/install-vllm)", dir.display()),
    )
    .then_some(dir)
}

/// The workspace root (testkit lives at `crates/testkit`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Qwen3 tokenizer `.ci/fetch-tokenizers` fetched.
pub fn qwen3_tokenizer_dir() -> PathBuf {
    workspace_root().join(".cache/tokenizers/Qwen/Qwen3")
}

/// Which tiny model to make.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// Qwen3, 4 full-attention layers, hidden 512 (~0.2 GB), with a LoRA adapter.
    Qwen3,
    /// Gemma-3 text: 3 sliding-window layers (window 64) + 1 full-attention layer.
    Gemma3Hybrid,
}

impl ModelKind {
    fn arg(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::Gemma3Hybrid => "gemma3-hybrid",
        }
    }
}

/// A model directory (weights + the Qwen3 tokenizer and chat template).
#[derive(Debug, Clone)]
pub struct Model {
    /// Kind it was made as.
    pub kind: ModelKind,
    /// `vllm serve` model directory.
    pub dir: PathBuf,
    /// A peft LoRA adapter for it (Qwen3 only).
    pub lora: Option<PathBuf>,
}

/// Makes (once per machine; the same seed gives the same files) the tiny model.
pub fn model(venv: &Path, kind: ModelKind) -> Model {
    let root = std::env::temp_dir().join("inferencecache-vllm-models");
    std::fs::create_dir_all(&root).unwrap();
    let dir = root.join(format!("{}-v1", kind.arg()));
    let lora = (kind == ModelKind::Qwen3).then(|| root.join("qwen3-v1-lora"));
    let done = |d: &Path| d.join("config.json").is_file();
    if !done(&dir) {
        // One maker at a time across processes: a lock directory.
        let lock = root.join(format!("{}.lock", kind.arg()));
        let deadline = Instant::now() + Duration::from_secs(600);
        while std::fs::create_dir(&lock).is_err() {
            assert!(Instant::now() < deadline, "stale lock {}", lock.display());
            if done(&dir) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if !done(&dir) {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/make_model.py");
            let mut cmd = Command::new(venv.join("bin/python"));
            cmd.arg(&script)
                .arg(kind.arg())
                .arg(&dir)
                .arg(qwen3_tokenizer_dir());
            if let Some(l) = &lora {
                cmd.arg(l);
            }
            let out = cmd.env("HF_HUB_OFFLINE", "1").output().unwrap();
            let _ = std::fs::remove_dir(&lock);
            assert!(
                out.status.success(),
                "make_model.py {}: {}",
                kind.arg(),
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            let _ = std::fs::remove_dir(&lock);
        }
    }
    Model { kind, dir, lora }
}

/// How to start one engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The model.
    pub model: Model,
    /// `--served-model-name`.
    pub served_name: String,
    /// The core it is pinned to.
    pub cpu: usize,
    /// `--block-size` (a multiple of 32 on CPU).
    pub block_size: u32,
    /// `--num-gpu-blocks-override`: a small cache that evicts; `None` is 1 GiB.
    pub num_blocks: Option<u32>,
    /// Serve the model's LoRA adapter as `{served_name}-lora`.
    pub lora: bool,
    /// `VLLM_SERVER_DEV_MODE=1` (enables `POST /reset_prefix_cache`).
    pub dev_mode: bool,
    /// More `vllm serve` arguments.
    pub extra_args: Vec<String>,
    /// More environment variables (e.g. `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`).
    pub env: Vec<(String, String)>,
}

impl EngineConfig {
    /// Defaults: block size 32, 1 GiB of KV cache, no LoRA, dev mode on.
    pub fn new(model: &Model, served_name: &str, cpu: usize) -> Self {
        Self {
            model: model.clone(),
            served_name: served_name.to_owned(),
            cpu,
            block_size: 32,
            num_blocks: None,
            lora: false,
            dev_mode: true,
            extra_args: Vec::new(),
            env: Vec::new(),
        }
    }
}

/// A running `vllm serve`, its whole process group killed on drop.
#[derive(Debug)]
pub struct Engine {
    /// The configuration it was started with.
    pub config: EngineConfig,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// HTTP port.
    pub port: u16,
    /// ZMQ KV-event publisher port (bound on `*`).
    pub events_port: u16,
    /// ZMQ replay port.
    pub replay_port: u16,
    /// Its stdout + stderr.
    pub log: PathBuf,
    child: Option<Child>,
}

impl Engine {
    /// Spawns the engine (not yet ready: see [`Engine::wait_ready`]).
    pub fn spawn(venv: &Path, config: EngineConfig) -> Self {
        Self::spawn_on(venv, config, (free_port(), free_port(), free_port()))
    }

    /// Kills the engine (if it still runs) and starts it again with the same
    /// configuration and ports, as a restarted pod would come back; not yet
    /// ready (see [`Engine::wait_ready`]).
    pub fn restart(&mut self, venv: &Path) {
        self.kill();
        let ports = (self.port, self.events_port, self.replay_port);
        let next = Self::spawn_on(venv, self.config.clone(), ports);
        // `self` has no child left, so replacing it runs no kill.
        *self = next;
    }

    fn spawn_on(venv: &Path, config: EngineConfig, ports: (u16, u16, u16)) -> Self {
        let (port, events_port, replay_port) = ports;
        let log = std::env::temp_dir().join(format!(
            "ic-vllm-{}-{}-{port}.log",
            config.served_name,
            std::process::id()
        ));
        let kv_events = json!({
            "enable_kv_cache_events": true,
            "publisher": "zmq",
            "endpoint": format!("tcp://*:{events_port}"),
            "replay_endpoint": format!("tcp://*:{replay_port}"),
            "topic": "kv-events",
        });
        let mut cmd = Command::new(venv.join("bin/vllm"));
        cmd.arg("serve")
            .arg(&config.model.dir)
            .args(["--served-model-name", &config.served_name])
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--dtype", "bfloat16", "--max-model-len", "4096"])
            .args(["--enable-prefix-caching", "--enable-prompt-tokens-details"])
            .args(["--block-size", &config.block_size.to_string()])
            .args(["--kv-events-config", &kv_events.to_string()])
            .args(["--max-num-seqs", "8"]);
        if let Some(n) = config.num_blocks {
            cmd.args(["--num-gpu-blocks-override", &n.to_string()]);
        }
        if config.lora {
            let lora = config
                .model
                .lora
                .as_ref()
                .expect("this model has no LoRA adapter");
            cmd.args(["--enable-lora", "--max-lora-rank", "8", "--lora-modules"])
                .arg(format!("{}-lora={}", config.served_name, lora.display()));
        }
        cmd.args(&config.extra_args);
        cmd.env("VLLM_TARGET_DEVICE", "cpu")
            .env("VLLM_CPU_OMP_THREADS_BIND", config.cpu.to_string())
            .env("OMP_NUM_THREADS", "1")
            .env("VLLM_CPU_KVCACHE_SPACE", "1")
            .env("HF_HUB_OFFLINE", "1")
            .env("TRANSFORMERS_OFFLINE", "1")
            .env("VLLM_NO_USAGE_STATS", "1")
            .env("DO_NOT_TRACK", "1");
        if config.dev_mode {
            cmd.env("VLLM_SERVER_DEV_MODE", "1");
        }
        cmd.envs(config.env.iter().map(|(k, v)| (k, v)));
        let out = std::fs::File::create(&log).unwrap();
        let err = out.try_clone().unwrap();
        // Its own process group, so the engine core dies with the API server.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap();
        Self {
            config,
            url: format!("http://127.0.0.1:{port}"),
            port,
            events_port,
            replay_port,
            log,
            child: Some(child),
        }
    }

    /// Waits until `GET /health` answers 200 (panics with the log's tail if
    /// the engine exits or takes longer than `timeout`).
    pub async fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let http = reqwest::Client::new();
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    panic!(
                        "vLLM exited ({status}) before ready:\n{}",
                        self.log_tail(60)
                    );
                }
            }
            let ok = http
                .get(format!("{}/health", self.url))
                .timeout(Duration::from_secs(2))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "vLLM not ready in {timeout:?}:\n{}",
                self.log_tail(60)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Starts several engines at once and waits for all of them.
    pub async fn start_all(venv: &Path, configs: Vec<EngineConfig>) -> Vec<Engine> {
        let mut engines: Vec<Engine> = configs
            .into_iter()
            .map(|c| Engine::spawn(venv, c))
            .collect();
        for e in &mut engines {
            e.wait_ready(Duration::from_secs(900)).await;
        }
        engines
    }

    /// The publisher endpoint a subscriber connects to.
    pub fn events_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.events_port)
    }

    /// The replay endpoint a subscriber connects to.
    pub fn replay_endpoint(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.replay_port)
    }

    /// The last `n` lines of the engine's log.
    pub fn log_tail(&self, n: usize) -> String {
        let s = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Kills the engine's whole process group now (SIGKILL: a crash).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", c.id())])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops (`pause = true`, SIGSTOP) or continues (SIGCONT) the engine's
    /// whole process group: a hung engine, whose sockets stay connected but
    /// which answers nothing.
    pub fn pause(&self, pause: bool) {
        if let Some(c) = &self.child {
            let sig = if pause { "-STOP" } else { "-CONT" };
            let ok = Command::new("kill")
                .args([sig, "--", &format!("-{}", c.id())])
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "kill {sig} of the engine's process group failed");
        }
    }

    /// Whether the engine process is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// `POST /v1/completions` with `body` (model filled in when absent);
    /// the whole JSON response.
    pub async fn post(&self, path: &str, mut body: Value) -> Value {
        if body.get("model").is_none() {
            body["model"] = json!(self.config.served_name);
        }
        let resp = reqwest::Client::new()
            .post(format!("{}{path}", self.url))
            .json(&body)
            .timeout(Duration::from_secs(300))
            .send()
            .await
            .unwrap();
        let status = resp.status();
        let text = resp.text().await.unwrap();
        assert!(status.is_success(), "{path} {status}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// One completion of `prompt` (token ids or text), 1 token, greedy;
    /// returns (prompt tokens, cached tokens the engine reused).
    pub async fn complete(&self, prompt: Value, extra: Value) -> (u64, u64) {
        let mut body = json!({"prompt": prompt, "max_tokens": 1, "temperature": 0});
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        let v = self.post("/v1/completions", body).await;
        usage_of(&v)
    }

    /// `POST /reset_prefix_cache` (dev mode).
    pub async fn reset_prefix_cache(&self) {
        let r = reqwest::Client::new()
            .post(format!("{}/reset_prefix_cache", self.url))
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "reset_prefix_cache: {}",
            r.status()
        );
    }
}

/// (prompt tokens, cached tokens) of an OpenAI response's `usage`.
pub fn usage_of(v: &Value) -> (u64, u64) {
    let u = &v["usage"];
    (
        u["prompt_tokens"].as_u64().unwrap_or(0),
        u["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    )
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_ref() {
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{}", c.id())])
                .status();
        }
        if let Some(mut c) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(c.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", c.id())])
                .status();
            let _ = c.wait();
        }
    }
}

//! `inferencecache-bench memory-flood`: the server's memory under a
//! `prompt_text` flood and after it (issue 36, item 5).
//!
//! Starts the given server binary (release build) with a tokenizer
//! directory, warms it with one small `prompt_text` lookup (the tokenizer
//! loads on first use), records the base RSS, then runs `--concurrency`
//! clients that each send 1 MiB `prompt_text` lookups back to back for
//! `--duration` (every prompt distinct, so the prefix cache cannot shortcut
//! them), sampling the RSS every 10 ms for the peak. After the flood it
//! samples the RSS for `--settle` and prints base, peak, after (the last
//! sample) and the answers by reason. The environment is passed through, so
//! glibc's tunables (`GLIBC_TUNABLES=glibc.malloc.arena_max=2:...`) apply to
//! the server; extra server flags go after `--`.

use anyhow::Context;
use clap::Args;
use inferencecache_proto::v1alpha1::LookupRouteRequest;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Flags of `inferencecache-bench memory-flood`.
#[derive(Debug, Args)]
pub(crate) struct MemoryFloodArgs {
    /// The server binary (`cargo build --release -p inferencecache-cli`).
    #[arg(long, default_value = "target/release/inferencecache")]
    server_bin: PathBuf,
    /// Tokenizer models directory (as --tokenizer-models-dir).
    #[arg(long, default_value = ".cache/tokenizers")]
    models_dir: PathBuf,
    /// Model id inside it.
    #[arg(long, default_value = "Qwen/Qwen3")]
    model: String,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Prompt size in bytes.
    #[arg(long, default_value_t = (1 << 20) - 64)]
    prompt_bytes: usize,
    /// Flood time.
    #[arg(long, default_value = "20s", value_parser = crate::args::parse_duration)]
    duration: Duration,
    /// Prompt text: `ascii` (words; the fast encode), `unicode` (NFC
    /// accented words: the normalizer check runs), `nfd` (decomposed
    /// accents: not NFC, so every segment takes HF's encode with offsets,
    /// the costliest path).
    #[arg(long, default_value = "ascii", value_parser = ["ascii", "unicode", "nfd"])]
    text: String,
    /// Time sampled after the flood; "after" is the last sample.
    #[arg(long, default_value = "5s", value_parser = crate::args::parse_duration)]
    settle: Duration,
    /// Extra `inferencecache serve` flags.
    #[arg(last = true)]
    server_args: Vec<String>,
}

const MIB: f64 = 1024.0 * 1024.0;

/// Resident set of a process (`VmRSS` of /proc/PID/status), bytes.
fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(a: &MemoryFloodArgs) -> anyhow::Result<(Server, String, String)> {
    let mut child = Command::new(&a.server_bin)
        .arg("serve")
        .args(["--grpc-bind-address", "127.0.0.1:0"])
        .args(["--http-bind-address", "127.0.0.1:0"])
        .args(["--snapshot-bind-address", "127.0.0.1:0"])
        .arg("--tokenizer-models-dir")
        .arg(&a.models_dir)
        .args(&a.server_args)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("start {}", a.server_bin.display()))?;
    let stderr = child.stderr.take().context("server stderr")?;
    let server = Server(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                if v["message"] == "listening" {
                    if let Some(t) = tx.take() {
                        let addr = |k: &str| v[k].as_str().unwrap_or("").to_owned();
                        let _ = t.send((addr("grpc_addr"), addr("http_addr")));
                    }
                }
            }
        }
    });
    let (grpc, http) = rx
        .recv_timeout(Duration::from_secs(60))
        .context("the server never logged `listening`")?;
    Ok((server, grpc, http))
}

/// A distinct prompt of about `bytes` bytes (words, like chat text).
fn prompt(n: u64, bytes: usize, text: &str) -> String {
    let mut s = format!("request {n}: ");
    let words: &[&str] = match text {
        "unicode" => &[
            "caf\u{e9} ",
            "na\u{ef}ve ",
            "\u{fc}ber ",
            "gamma ",
            "se\u{f1}or\n",
        ],
        "nfd" => &[
            "cafe\u{301} ",
            "nai\u{308}ve ",
            "u\u{308}ber ",
            "gamma ",
            "sen\u{303}or\n",
        ],
        _ => &["alpha ", "beta ", "gamma ", "delta ", "epsilon\n"],
    };
    let mut k = n as usize;
    while s.len() + 8 < bytes {
        s.push_str(words[k % words.len()]);
        k = k.wrapping_mul(31).wrapping_add(7);
    }
    s
}

/// Runs the rig.
pub(crate) fn run(a: MemoryFloodArgs) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?
        .block_on(flood(a))
}

async fn flood(a: MemoryFloodArgs) -> anyhow::Result<()> {
    let (server, grpc, http) = start(&a)?;
    let pid = server.0.id();
    let url = format!("http://{grpc}");
    let mut c = InferenceCacheClient::connect(url.clone())
        .await
        .context("connect")?
        .max_encoding_message_size(usize::MAX);
    let req = |text: String| LookupRouteRequest {
        tenant_id: "t".into(),
        model_id: a.model.clone(),
        hash_scheme: "vllm".into(),
        prompt_text: text,
        ..Default::default()
    };
    let warm = c
        .lookup_route(req("hello there".into()))
        .await
        .context("warm-up lookup")?
        .into_inner();
    anyhow::ensure!(
        warm.reason_code != "ERROR",
        "warm-up answered {warm:?}: is {} under {}?",
        a.model,
        a.models_dir.display()
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let base = rss(pid);

    let peak = Arc::new(AtomicU64::new(base));
    let flooding = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, flooding) = (Arc::clone(&peak), Arc::clone(&flooding));
        tokio::spawn(async move {
            while flooding.load(Ordering::Relaxed) {
                peak.fetch_max(rss(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let reasons = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let next = Arc::new(AtomicU64::new(1));
    let t0 = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..a.concurrency {
        let (url, reasons, next) = (url.clone(), Arc::clone(&reasons), Arc::clone(&next));
        let (model, bytes, until) = (a.model.clone(), a.prompt_bytes, t0 + a.duration);
        let kind = a.text.clone();
        clients.push(tokio::spawn(async move {
            let mut c = InferenceCacheClient::connect(url)
                .await?
                .max_encoding_message_size(usize::MAX);
            while Instant::now() < until {
                let n = next.fetch_add(1, Ordering::Relaxed);
                let text = prompt(n, bytes, &kind);
                let reason = match c
                    .lookup_route(LookupRouteRequest {
                        tenant_id: "t".into(),
                        model_id: model.clone(),
                        hash_scheme: "vllm".into(),
                        prompt_text: text,
                        ..Default::default()
                    })
                    .await
                {
                    Ok(r) => r.into_inner().reason_code,
                    Err(s) => format!("grpc {:?}", s.code()),
                };
                if let Ok(mut m) = reasons.lock() {
                    *m.entry(reason).or_default() += 1;
                }
            }
            anyhow::Ok(())
        }));
    }
    for c in clients {
        c.await??;
    }
    let flood_took = t0.elapsed();
    flooding.store(false, Ordering::Relaxed);
    let _ = sampler.await;
    let ended = Instant::now();
    let mut after = rss(pid);
    let mut samples = Vec::new();
    while ended.elapsed() < a.settle {
        tokio::time::sleep(Duration::from_millis(250)).await;
        after = rss(pid);
        samples.push(after);
    }
    let peak = peak.load(Ordering::Relaxed).max(after);
    let answered: u64 = reasons.lock().map(|m| m.values().sum()).unwrap_or(0);
    println!(
        "{} clients x {:.2} MiB prompt_text for {:.1} s: {answered} lookups ({:.1}/s), answers {:?}",
        a.concurrency,
        a.prompt_bytes as f64 / MIB,
        flood_took.as_secs_f64(),
        answered as f64 / flood_took.as_secs_f64(),
        reasons.lock().map(|m| m.clone()).unwrap_or_default()
    );
    println!(
        "RSS MiB: base {:.0}, peak {:.0} (+{:.0}), after {:.1} s {:.0} (+{:.0}); settle samples {:?}",
        base as f64 / MIB,
        peak as f64 / MIB,
        (peak.saturating_sub(base)) as f64 / MIB,
        a.settle.as_secs_f64(),
        after as f64 / MIB,
        after.saturating_sub(base) as f64 / MIB,
        samples
            .iter()
            .map(|s| (*s as f64 / MIB).round() as u64)
            .collect::<Vec<_>>()
    );
    for line in metrics(&http).lines().filter(|l| {
        l.starts_with("inferencecache_lookup_shed_total")
            || l.starts_with("inferencecache_tokenize_memory_bytes")
    }) {
        println!("{line}");
    }
    drop(server);
    Ok(())
}

/// The server's `/metrics` body (plain HTTP/1.0 GET; empty on failure).
fn metrics(http: &str) -> String {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(http) else {
        return String::new();
    };
    let _ = write!(c, "GET /metrics HTTP/1.0\r\nHost: {http}\r\n\r\n");
    let mut body = String::new();
    let _ = c.read_to_string(&mut body);
    body
}

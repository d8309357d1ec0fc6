//! `inferencecache gateway` in front of two real vLLM engines (the CPU build,
//! the tiny random Qwen3 with a LoRA adapter, `testkit::vllm`), driven by the
//! official `openai` SDK and plain HTTP. Every hint is judged by the engine:
//! the tokens the gateway expected an engine to reuse (the
//! `x-inferencecache-reusable-tokens` header) must equal the
//! `usage.prompt_tokens_details.cached_tokens` the engine reports.
//!
//! LoRA and `cache_salt` requests go where they can be reused, and claim
//! nothing across adapters or salts. `vllm bench serve` (vLLM's own
//! benchmark client) runs through it. Fail-open
//! cases on the same engines: the hint server down (remote mode
//! pointed at a dead address), a client that disconnects mid-stream, an
//! engine killed mid-stream. Without the vLLM venv the test skips, unless
//! INFERENCECACHE_REQUIRE_REAL_PARTS=1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/browser.rs"]
mod browser;
mod common;
#[path = "common/engine.rs"]
mod engine;

use engine::{Proc, metric};
use inferencecache_testkit::vllm::{self, Engine, EngineConfig, ModelKind};
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};

fn start_gateway(engines: &[Engine], extra: &[&str]) -> Proc {
    let mut args = vec![
        "gateway".to_owned(),
        "--listen".into(),
        "127.0.0.1:0".into(),
        "--health-interval".into(),
        "300ms".into(),
    ];
    for e in engines {
        args.push("--engine".into());
        args.push(e.url.clone());
    }
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Proc::start(&refs)
}

/// One answer: (status, headers, body).
async fn post(base: &str, path: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(Duration::from_secs(300))
        .send()
        .await
        .unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    let text = r.text().await.unwrap();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn header(h: &reqwest::header::HeaderMap, k: &str) -> String {
    h.get(k)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Starts a streamed completion through the gateway and reads its first
/// chunk: (the open response, the engine it went to).
async fn start_stream(base: &str, body: &Value) -> (reqwest::Response, String) {
    let mut resp = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let engine = header(resp.headers(), "x-inferencecache-engine");
    assert!(resp.chunk().await.unwrap().is_some());
    (resp, engine)
}

async fn text(url: &str) -> String {
    reqwest::Client::new()
        .get(url)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Polls `cond` until true or `timeout` (then panics with `what`).
async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (bounded, polling the gateway's dry-run endpoint) until a repeat of
/// `body` would be routed to the engine holding its `prompt_tokens`: the
/// engine's KV events have reached the index.
async fn settle(base: &str, kind: &str, body: &Value, prompt_tokens: u64) {
    let want = (prompt_tokens - 1) / 32 * 32;
    let path = format!("/inferencecache/route/{kind}");
    wait_until(
        Duration::from_secs(15),
        "the index to hold the prompt",
        || {
            let (base, path, body) = (base.to_owned(), path.clone(), body.clone());
            async move {
                let (_, _, d) = post(&base, &path, &body).await;
                d["reusable_tokens"].as_u64().unwrap_or(0) >= want
            }
        },
    )
    .await;
}

fn long_prompt(tag: &str) -> String {
    (0..30)
        .map(|i| format!("Line {i} of the {tag} document."))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_engines_behind_the_gateway() {
    let Some(venv) = vllm::venv() else { return };
    let model = vllm::model(&venv, ModelKind::Qwen3);
    let configs = (0..2)
        .map(|cpu| {
            let mut c = EngineConfig::new(&model, "tiny", cpu);
            c.lora = true;
            c
        })
        .collect();
    let mut engines = Engine::start_all(&venv, configs).await;
    let gw = start_gateway(&engines, &["--engine-admin"]);
    let base = format!("http://{}", gw.addr("addr"));

    // 1. The openai SDK: chat and completions, streamed and not, each twice.
    let py = venv.join("bin/python");
    let script = common::repo_root().join("crates/cli/tests/python/gateway_openai.py");
    let out = Command::new(&py)
        .arg(&script)
        .args([&base, "tiny", "sdk"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "gateway_openai.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let calls: Vec<&Value> = lines.iter().filter(|l| l.get("kind").is_some()).collect();
    assert_eq!(calls.len(), 8, "{lines:?}");
    for c in &calls {
        assert!(!c["content"].as_str().unwrap_or_default().is_empty(), "{c}");
        assert_eq!(
            c["cached_tokens"], c["reusable"],
            "the engine reused exactly what the gateway expected: {c}"
        );
    }
    // Each request's repeat (two calls later in the script's order) went to
    // the engine holding it, as a prefix match.
    for pair in calls.chunks(4) {
        for i in 0..2 {
            let (first, again) = (pair[i], pair[i + 2]);
            assert_eq!(first["engine"], again["engine"], "{first} / {again}");
            // By the index, or (when its events are still on the way) by
            // the gateway's own record of where it sent the first.
            assert!(
                again["route"] == "prefix_match" || again["route"] == "pending_match",
                "{again}"
            );
            assert!(again["reusable"].as_u64().unwrap() > 0, "{again}");
        }
    }
    let models = &lines.last().unwrap()["models"];
    assert_eq!(models, &json!(["tiny", "tiny-lora"]));

    // 2. LoRA: cached per adapter; the base model does not claim the
    // adapter's blocks.
    let lora_body = json!({"model": "tiny-lora", "prompt": long_prompt("lora"), "max_tokens": 2, "temperature": 0});
    let (s1, h1, b1) = post(&base, "/v1/completions", &lora_body).await;
    assert_eq!(s1, 200, "{b1}");
    settle(&base, "completions", &lora_body, vllm::usage_of(&b1).0).await;
    let (_, h2, b2) = post(&base, "/v1/completions", &lora_body).await;
    assert_eq!(
        header(&h1, "x-inferencecache-engine"),
        header(&h2, "x-inferencecache-engine")
    );
    assert!(
        ["prefix_match", "pending_match"].contains(&header(&h2, "x-inferencecache-route").as_str())
    );
    let (_, cached) = vllm::usage_of(&b2);
    assert!(cached > 0);
    assert_eq!(
        header(&h2, "x-inferencecache-reusable-tokens"),
        cached.to_string()
    );
    let base_body =
        json!({"model": "tiny", "prompt": long_prompt("lora"), "max_tokens": 2, "temperature": 0});
    let (_, h3, b3) = post(&base, "/v1/completions", &base_body).await;
    let (_, cached) = vllm::usage_of(&b3);
    assert_eq!(
        header(&h3, "x-inferencecache-reusable-tokens"),
        cached.to_string(),
        "{b3}"
    );

    // Salts: a repeat under the same salt reuses; another salt (or none)
    // claims nothing of it.
    let salted = |salt: Option<&str>| {
        let mut b = json!({"model": "tiny", "prompt": long_prompt("salted"), "max_tokens": 2, "temperature": 0});
        if let Some(s) = salt {
            b["cache_salt"] = json!(s);
        }
        b
    };
    let (s1, _, b1) = post(&base, "/v1/completions", &salted(Some("alice"))).await;
    assert_eq!(s1, 200, "{b1}");
    settle(
        &base,
        "completions",
        &salted(Some("alice")),
        vllm::usage_of(&b1).0,
    )
    .await;
    let (_, h, b) = post(&base, "/v1/completions", &salted(Some("alice"))).await;
    let (_, cached) = vllm::usage_of(&b);
    assert!(cached > 0, "{b}");
    assert_eq!(
        header(&h, "x-inferencecache-reusable-tokens"),
        cached.to_string()
    );
    for other in [Some("bob"), None] {
        let (_, h, b) = post(&base, "/v1/completions", &salted(other)).await;
        let (_, cached) = vllm::usage_of(&b);
        assert_eq!(cached, 0, "{other:?}: {b}");
        assert_eq!(
            header(&h, "x-inferencecache-reusable-tokens"),
            "0",
            "{other:?}"
        );
    }

    // A stream whose client did not ask for usage: the gateway asks the
    // engine for it (to judge the hint) and strips the usage chunk, so the
    // client gets exactly the stream it asked for.
    let checks = || {
        let b = base.clone();
        async move {
            metric(
                &text(&format!("{b}/metrics")).await,
                "inferencecache_gateway_hint_checks_total",
            )
        }
    };
    let before = checks().await;
    let plain = json!({"model": "tiny", "prompt": long_prompt("plain stream"), "max_tokens": 3,
        "temperature": 0, "stream": true});
    let (s, _, b) = post(&base, "/v1/completions", &plain).await;
    let sse = b.as_str().unwrap_or_default().to_owned();
    assert_eq!(s, 200, "{sse}");
    assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
    assert!(
        !sse.contains("usage"),
        "the client did not ask for usage: {sse}"
    );
    let events = sse.lines().filter(|l| l.starts_with("data: {")).count();
    assert!(events >= 1, "{sse}");
    assert_eq!(checks().await, before + 1.0, "the answer was judged");

    // 3. Accuracy metrics: every checked response, no over-claim.
    let m = text(&format!("{base}/metrics")).await;
    assert!(
        metric(&m, "inferencecache_gateway_hint_checks_total") >= 15.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "inferencecache_gateway_hint_overclaims_total"),
        0.0,
        "{m}"
    );

    // 4. vLLM's own benchmark client through the gateway: shared-prefix
    // traffic, two at a time; every request answered, hints used, none
    // over-claimed.
    let results = std::env::temp_dir().join(format!("ic-gw-bench-{}", std::process::id()));
    std::fs::create_dir_all(&results).unwrap();
    let out = Command::new(venv.join("bin/vllm"))
        .args(["bench", "serve", "--backend", "vllm", "--base-url", &base])
        .args(["--model", "tiny", "--tokenizer"])
        .arg(&model.dir)
        .args(["--dataset-name", "prefix_repetition"])
        .args([
            "--prefix-repetition-prefix-len",
            "256",
            "--prefix-repetition-suffix-len",
            "32",
        ])
        .args([
            "--prefix-repetition-num-prefixes",
            "2",
            "--prefix-repetition-output-len",
            "4",
        ])
        .args([
            "--num-prompts",
            "16",
            "--max-concurrency",
            "2",
            "--seed",
            "1",
        ])
        .args([
            "--disable-tqdm",
            "--save-result",
            "--result-filename",
            "bench.json",
        ])
        .arg("--result-dir")
        .arg(&results)
        .env("HF_HUB_OFFLINE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vllm bench serve: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let bench: Value =
        serde_json::from_str(&std::fs::read_to_string(results.join("bench.json")).unwrap())
            .unwrap();
    assert_eq!(bench["completed"], 16, "{bench}");
    assert_eq!(bench["failed"].as_u64().unwrap_or(0), 0, "{bench}");
    let _ = std::fs::remove_dir_all(&results);
    let m = text(&format!("{base}/metrics")).await;
    assert!(
        metric(
            &m,
            "inferencecache_gateway_routing_decisions_total{reason=\"prefix_match\"}"
        ) + metric(
            &m,
            "inferencecache_gateway_routing_decisions_total{reason=\"pending_match\"}"
        ) >= 6.0,
        "{m}"
    );
    assert_eq!(
        metric(&m, "inferencecache_gateway_hint_overclaims_total"),
        0.0,
        "{m}"
    );

    // 5. The hint server down: a second gateway asks a dead address; every
    // request is still answered, routed by load.
    let dead = format!("127.0.0.1:{}", inferencecache_testkit::free_port());
    let remote = start_gateway(&engines, &["--server", &dead, "--block-size", "32"]);
    let rbase = format!("http://{}", remote.addr("addr"));
    for i in 0..3 {
        let body = json!({"model": "tiny", "messages": [{"role": "user", "content": format!("down {i}")}], "max_tokens": 2});
        let (s, h, b) = post(&rbase, "/v1/chat/completions", &body).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(header(&h, "x-inferencecache-route"), "least_loaded");
    }
    let m = text(&format!("{rbase}/metrics")).await;
    assert!(
        metric(
            &m,
            "inferencecache_gateway_fallbacks_total{cause=\"hint_server_unavailable\"}"
        ) + metric(
            &m,
            "inferencecache_gateway_fallbacks_total{cause=\"timeout\"}"
        ) >= 3.0,
        "{m}"
    );
    // Engine changes are off unless asked for.
    let r = reqwest::Client::new()
        .delete(format!("{rbase}/inferencecache/engines/x"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 403);
    assert!(r.text().await.unwrap().contains("--engine-admin"));
    drop(remote);

    // 6. A client that disconnects mid-stream: the engine stops working on
    // it and the gateway's load returns to zero.
    let long = json!({"model": "tiny", "prompt": "count forever", "max_tokens": 3000,
        "ignore_eos": true, "stream": true});
    let (resp, victim) = start_stream(&base, &long).await;
    let engine_url = engines
        .iter()
        .find(|e| e.url.ends_with(&victim))
        .map(|e| e.url.clone())
        .unwrap();
    let running = || {
        let (b, e) = (base.clone(), engine_url.clone());
        async move {
            let g = metric(
                &text(&format!("{b}/metrics")).await,
                "inferencecache_gateway_running_requests",
            );
            let v = metric(
                &text(&format!("{e}/metrics")).await,
                "vllm:num_requests_running",
            );
            (g, v)
        }
    };
    assert!(running().await.0 >= 1.0);
    drop(resp);
    wait_until(
        Duration::from_secs(30),
        "the aborted request to end everywhere",
        || {
            let r = running();
            async move { r.await == (0.0, 0.0) }
        },
    )
    .await;

    // 7. Engines removed and added while the gateway runs: a removed
    // engine takes nothing new; added back, it is attached again (models,
    // KV-event subscriber) and its hints are right again.
    let ids: Vec<String> = engines
        .iter()
        .map(|e| e.url.trim_start_matches("http://").to_owned())
        .collect();
    let admin = reqwest::Client::new();
    let r = admin
        .delete(format!("{base}/inferencecache/engines/{}", ids[1]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.text().await.unwrap());
    let listed: Value =
        serde_json::from_str(&text(&format!("{base}/inferencecache/engines")).await).unwrap();
    assert_eq!(listed["engines"].as_array().unwrap().len(), 1, "{listed}");
    for i in 0..4 {
        let body =
            json!({"model": "tiny", "prompt": format!("one engine left {i}"), "max_tokens": 2});
        let (s, h, b) = post(&base, "/v1/completions", &body).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(header(&h, "x-inferencecache-engine"), ids[0]);
    }
    let r = admin
        .post(format!("{base}/inferencecache/engines"))
        .json(&json!({"engine": engines[1].url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201, "{}", r.text().await.unwrap());
    let r = admin
        .post(format!("{base}/inferencecache/engines"))
        .json(&json!({"engine": engines[1].url}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 409, "one engine per id");
    // New prompts spread over both again; one that lands on the re-added
    // engine is indexed from its events (not only the gateway's own record)
    // and its repeat reuses exactly what the gateway claims.
    let mut on_added = None;
    for i in 0..24 {
        let body = json!({"model": "tiny", "prompt": long_prompt(&format!("re-added {i}")),
            "max_tokens": 2, "temperature": 0});
        let (s, h, b) = post(&base, "/v1/completions", &body).await;
        assert_eq!(s, 200, "{b}");
        if header(&h, "x-inferencecache-engine") == ids[1] {
            on_added = Some((body, vllm::usage_of(&b).0));
            break;
        }
    }
    let (body, prompt_tokens) = on_added.expect("the re-added engine takes new prompts");
    let want = (prompt_tokens - 1) / 32 * 32;
    wait_until(
        Duration::from_secs(20),
        "the re-added engine's events to reach the index",
        || {
            let (b, body) = (base.clone(), body.clone());
            async move {
                let (_, _, d) = post(&b, "/inferencecache/route/completions", &body).await;
                d["hint"]["candidates"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["matched_tokens"].as_u64() >= Some(want))
            }
        },
    )
    .await;
    let (_, h, b) = post(&base, "/v1/completions", &body).await;
    assert_eq!(header(&h, "x-inferencecache-engine"), ids[1]);
    assert_eq!(
        header(&h, "x-inferencecache-reusable-tokens"),
        vllm::usage_of(&b).1.to_string()
    );

    // The status page: per engine, requests, hit rate and the hints as the
    // engines judged them.
    let page = text(&format!("{base}/inferencecache/status")).await;
    assert!(page.contains("status.json"), "{page}");
    let status: Value =
        serde_json::from_str(&text(&format!("{base}/inferencecache/status.json")).await).unwrap();
    for e in status["engines"].as_array().unwrap() {
        assert!(e["requests"].as_u64().unwrap() > 0, "{e}");
        assert!(e["hints"]["exact"].as_u64().unwrap() > 0, "{e}");
        assert_eq!(e["hints"]["over"], 0, "{e}");
        assert!(e["hit_rate"].as_f64().is_some(), "{e}");
    }
    // ... as a browser shows it: a row per engine with its requests, and no
    // over-claim.
    if let Some(chromium) = browser::chromium() {
        let mut page =
            browser::Browser::open(&py, &chromium, &format!("{base}/inferencecache/status"));
        page.wait_true(
            "(() => { const rows = [...document.querySelectorAll('#engines tbody tr')]; \
             return rows.length === 2 && rows.every(r => +r.cells[2].textContent > 0 \
             && r.cells[6].textContent === '0' && r.cells[4].textContent.endsWith('%')); })()",
            Duration::from_secs(10),
        );
    }

    // 8. An engine killed mid-stream: the client gets an OpenAI error event,
    // and the next requests go to the engine that is left.
    let (mut resp, victim) = start_stream(&base, &long).await;
    let (dead_engine, survivor) = if engines[0].url.ends_with(&victim) {
        (0, 1)
    } else {
        (1, 0)
    };
    engines[dead_engine].kill();
    let mut rest = Vec::new();
    while let Ok(Some(c)) = resp.chunk().await {
        rest.extend_from_slice(&c);
    }
    let rest = String::from_utf8_lossy(&rest);
    assert!(rest.contains("failed mid-stream"), "{rest}");
    let left = engines[survivor]
        .url
        .trim_start_matches("http://")
        .to_owned();
    for i in 0..4 {
        let body =
            json!({"model": "tiny", "prompt": format!("after the crash {i}"), "max_tokens": 2});
        let (s, h, b) = post(&base, "/v1/completions", &body).await;
        assert_eq!(s, 200, "{b}");
        assert_eq!(header(&h, "x-inferencecache-engine"), left);
    }
    let health: Value = serde_json::from_str(&text(&format!("{base}/health")).await).unwrap();
    assert_eq!(health["healthy_engines"], json!([left]));
}

//! RenderTemplate, LookupPDRoute and the contract gaps of issue 15, against
//! the real binary with the real grpcurl: every reason code of both RPCs,
//! file reload, push replace-on-write and its limits, the stable-prefix cut,
//! determinism, the probe tenant on a live event stream, LRU hot prefixes
//! and tiktoken prompt_text.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use base64::Engine as _;
use common::{ServerProcess, grpcurl, http_get, http_send, wait_for_log};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SVC: &str = "inferencecache.v1alpha1.InferenceCache";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(v.as_str().unwrap_or(""))
        .unwrap()
}

/// One unary (or client-streaming, with several JSON messages) call.
fn call(g: &Path, s: &ServerProcess, method: &str, body: &str) -> Value {
    let mut child = Command::new(g)
        .args(["-plaintext", "-d", "@", &s.grpc, &format!("{SVC}/{method}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(body.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{method} {body}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ic-it15-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Polls `f` until it returns true (file reloads are polled every 2 s).
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn metrics(s: &ServerProcess) -> String {
    http_get(&s.http, "/metrics").1
}

fn post(s: &ServerProcess, path: &str, body: &str) -> (String, String) {
    http_send(&s.control, "POST", path, &[], body.as_bytes())
}

const SUPPORT: &str = "namespace: team-a
name: support
revision: v1
body: \"System: {{ system }}\\nUser: {{ question }}\\n\"
slots:
  - name: system
    type: Stable
    required: true
  - name: question
    type: Mutable
    required: true
";

fn render(g: &Path, s: &ServerProcess, template: &str, vars: Value) -> Value {
    call(
        g,
        s,
        "RenderTemplate",
        &json!({"templateRef": template, "variables": vars, "tenantId": "t"}).to_string(),
    )
}

fn stable_hash(text: &str) -> String {
    b64(&xxhash_rust::xxh3::xxh3_64_with_seed(text.as_bytes(), 1337).to_be_bytes())
}

#[test]
fn render_template_keys_the_stable_prefix_and_is_deterministic() {
    let Some(g) = grpcurl() else { return };
    let dir = temp_dir("render");
    std::fs::write(dir.join("support.yaml"), SUPPORT).unwrap();
    let s = ServerProcess::start(&["--templates-dir", dir.to_str().unwrap()]);
    let vars = json!({"system": "be brief", "question": "why?"});
    let r = render(&g, &s, "team-a/support", vars.clone());
    assert_eq!(r["reasonCode"], "OK", "{r}");
    assert_eq!(
        unb64(&r["renderedPrompt"]),
        b"System: be brief\nUser: why?\n"
    );
    assert_eq!(
        r["stablePrefixHash"],
        stable_hash("System: be brief\nUser: ")
    );
    assert_eq!(unb64(&r["tenantNamespace"]), b"team-a");
    assert_eq!(r["templateRevision"], "v1");
    // Same (ref, variables, revision): the same bytes, every time.
    for _ in 0..3 {
        assert_eq!(render(&g, &s, "team-a/support", vars.clone()), r);
    }
    // Another question keeps the key; another system prompt changes it.
    let other_q = render(
        &g,
        &s,
        "team-a/support",
        json!({"system": "be brief", "question": "how?"}),
    );
    assert_eq!(other_q["stablePrefixHash"], r["stablePrefixHash"]);
    assert_ne!(other_q["renderedPrompt"], r["renderedPrompt"]);
    let other_sys = render(
        &g,
        &s,
        "team-a/support",
        json!({"system": "be long", "question": "why?"}),
    );
    assert_ne!(other_sys["stablePrefixHash"], r["stablePrefixHash"]);
}

#[test]
fn a_template_whose_mutable_slot_comes_first_has_no_stable_key() {
    let Some(g) = grpcurl() else { return };
    let dir = temp_dir("mutable-first");
    std::fs::write(
        dir.join("q.json"),
        json!({"namespace": "team-a", "name": "q-first",
               "body": "{{ question }} (asked of {{ system }})",
               "slots": [{"name": "question", "type": "Mutable"},
                         {"name": "system", "type": "Stable"}]})
        .to_string(),
    )
    .unwrap();
    let s = ServerProcess::start(&["--templates-dir", dir.to_str().unwrap()]);
    let r = render(
        &g,
        &s,
        "team-a/q-first",
        json!({"question": "why?", "system": "sys"}),
    );
    assert_eq!(r["reasonCode"], "OK", "{r}");
    assert_eq!(unb64(&r["renderedPrompt"]), b"why? (asked of sys)");
    assert!(
        r.get("stablePrefixHash").is_none(),
        "empty prefix, no key: {r}"
    );
    // No revision given: the first 16 hex digits of SHA-256(body).
    let rev = r["templateRevision"].as_str().unwrap();
    assert_eq!(rev.len(), 16);
    assert!(rev.bytes().all(|b| b.is_ascii_hexdigit()), "{rev}");
}

#[test]
fn render_template_reason_codes_are_counted_and_logged() {
    let Some(g) = grpcurl() else { return };
    let dir = temp_dir("reasons");
    std::fs::write(dir.join("support.yaml"), SUPPORT).unwrap();
    std::fs::write(
        dir.join("undef.json"),
        r#"{"namespace":"team-a","name":"undef","body":"{{ nowhere }}"}"#,
    )
    .unwrap();
    let mut s = ServerProcess::start(&["--templates-dir", dir.to_str().unwrap()]);
    let r = render(&g, &s, "team-a/absent", json!({}));
    assert_eq!(r["reasonCode"], "TEMPLATE_NOT_FOUND");
    assert!(r.get("renderedPrompt").is_none(), "{r}");
    let r = render(&g, &s, "team-a/support", json!({"system": "s"}));
    assert_eq!(r["reasonCode"], "RENDER_ERROR", "missing required slot");
    assert!(r.get("renderedPrompt").is_none(), "{r}");
    let log = wait_for_log(&mut s.lines, "render_template_failed");
    assert_eq!(log["reason"], "missing_slot", "{log}");
    assert!(
        !log.to_string().contains("\"s\""),
        "variable values are never logged: {log}"
    );
    let r = render(&g, &s, "team-a/undef", json!({}));
    assert_eq!(r["reasonCode"], "RENDER_ERROR", "undefined variable");
    let log = wait_for_log(&mut s.lines, "render_template_failed");
    assert_eq!(log["reason"], "undefined", "{log}");
    let m = metrics(&s);
    for line in [
        "inferencecache_render_template_calls_total{reason_code=\"TEMPLATE_NOT_FOUND\"} 1",
        "inferencecache_render_template_calls_total{reason_code=\"RENDER_ERROR\"} 2",
        "inferencecache_templates 2",
        "inferencecache_template_updates_total{source=\"file\",result=\"applied\"} 1",
    ] {
        assert!(m.contains(line), "missing {line}\n{m}");
    }
}

#[test]
fn templates_dir_reloads_on_change_and_keeps_the_last_good_set() {
    let Some(g) = grpcurl() else { return };
    let dir = temp_dir("reload");
    let file = dir.join("support.yaml");
    std::fs::write(&file, SUPPORT).unwrap();
    let mut s = ServerProcess::start(&["--templates-dir", dir.to_str().unwrap()]);
    let vars = json!({"system": "s", "question": "q"});
    assert_eq!(
        render(&g, &s, "team-a/support", vars.clone())["templateRevision"],
        "v1"
    );
    std::fs::write(&file, SUPPORT.replace("revision: v1", "revision: v2")).unwrap();
    eventually("revision v2", || {
        render(&g, &s, "team-a/support", vars.clone())["templateRevision"] == "v2"
    });
    // A new file in the directory is picked up too.
    std::fs::write(
        dir.join("extra.json"),
        r#"{"namespace":"team-b","name":"x","body":"hi"}"#,
    )
    .unwrap();
    eventually("the new template", || {
        render(&g, &s, "team-b/x", json!({}))["reasonCode"] == "OK"
    });
    // A broken edit is refused whole: both templates stay as they were.
    std::fs::write(
        &file,
        "namespace: team-a\nname: support\nbody: '{% if %}'\n",
    )
    .unwrap();
    let log = wait_for_log(&mut s.lines, "templates_dir_reload_failed");
    assert!(
        log["error"].as_str().unwrap().contains("team-a/support"),
        "{log}"
    );
    assert_eq!(
        render(&g, &s, "team-a/support", vars)["templateRevision"],
        "v2"
    );
    assert_eq!(render(&g, &s, "team-b/x", json!({}))["reasonCode"], "OK");
    assert!(
        metrics(&s).contains(
            "inferencecache_template_updates_total{source=\"file\",result=\"rejected\"} 1"
        )
    );
}

#[test]
fn templates_push_replaces_on_write_with_the_policy_limits() {
    let Some(g) = grpcurl() else { return };
    let s = ServerProcess::start(&[]);
    let two = json!([
        {"namespace": "n", "name": "a", "revision": "ra", "body": "A {{ x }}",
         "slots": [{"name": "x", "type": "Mutable", "required": true, "description": "the ask"}]},
        {"namespace": "n", "name": "b", "body": "B"}
    ]);
    let (status, _) = post(&s, "/templates", &two.to_string());
    assert!(status.contains(" 204 "), "{status}");
    assert_eq!(render(&g, &s, "n/a", json!({"x": "1"}))["reasonCode"], "OK");
    assert_eq!(render(&g, &s, "n/b", json!({}))["reasonCode"], "OK");

    let snap: Value = serde_json::from_str(&http_get(&s.control, "/snapshot").1).unwrap();
    assert_eq!(
        snap["templates"][0],
        json!({"namespace": "n", "name": "a", "revision": "ra"})
    );
    assert_eq!(snap["templates"].as_array().unwrap().len(), 2);

    // Replace-on-write: what the push leaves out is gone.
    let (status, _) = post(
        &s,
        "/templates",
        r#"[{"namespace":"n","name":"b","body":"B2"}]"#,
    );
    assert!(status.contains(" 204 "), "{status}");
    assert_eq!(
        render(&g, &s, "n/a", json!({"x": "1"}))["reasonCode"],
        "TEMPLATE_NOT_FOUND"
    );
    assert_eq!(
        unb64(&render(&g, &s, "n/b", json!({}))["renderedPrompt"]),
        b"B2"
    );

    // Refused bodies get 400 with the reason and keep the set in force.
    for (body, want) in [
        ("not json".to_owned(), "decode templates: "),
        (
            r#"[{"namespace":"n","name":"c","body":"{% if %}"}]"#.to_owned(),
            "template n/c",
        ),
        (
            r#"[{"namespace":"n","name":"c","body":"x"},{"namespace":"n","name":"c","body":"y"}]"#
                .to_owned(),
            "more than once",
        ),
        (
            format!("[{}]", " ".repeat(1 << 20)),
            "decode templates: http: request body too large",
        ),
    ] {
        let (status, text) = post(&s, "/templates", &body);
        assert!(status.contains(" 400 "), "{status}: {text}");
        assert!(text.contains(want), "{text}");
    }
    assert_eq!(render(&g, &s, "n/b", json!({}))["reasonCode"], "OK");

    let (status, _) = http_get(&s.control, "/templates");
    assert!(status.contains(" 405 "), "{status}");
    let (status, _) = http_send(&s.http, "POST", "/templates", &[], b"[]");
    assert!(
        status.contains(" 404 "),
        "not on the public listener: {status}"
    );
    let m = metrics(&s);
    assert!(
        m.contains("inferencecache_template_updates_total{source=\"http\",result=\"rejected\"} 4"),
        "{m}"
    );
    assert!(m.contains("inferencecache_templates 1"), "{m}");
}

const PD: &str = "- namespace: team-a
  name: pd
  prefillReplicas: [p1, p2]
  decodeReplicas: [d1, d2]
  transport: Mooncake
- namespace: team-a
  name: no-prefill
  prefillReplicas: []
  decodeReplicas: [d1]
  transport: NIXL
";

/// One CacheStateUpdate message for grpcurl.
fn update(replica: &str, prefix: Option<&[u8]>, pressure: f64) -> Value {
    let mut u = json!({
        "replicaId": replica, "modelId": "m", "tenantId": "team-a", "hashScheme": "vllm",
        "stats": {"replicaId": replica, "pressure": pressure, "hitRate": 0.5}
    });
    if let Some(p) = prefix {
        u["prefixes"] = json!([{"prefixHash": b64(p), "tokenCount": 128}]);
    }
    u
}

fn report(g: &Path, s: &ServerProcess, updates: &[Value]) {
    let body: Vec<String> = updates.iter().map(Value::to_string).collect();
    let ack = call(g, s, "ReportCacheState", &body.join("\n"));
    assert_eq!(ack["accepted"], true, "{ack}");
}

fn pd(g: &Path, s: &ServerProcess, topology: &str, tenant: &str, prefix: &[u8]) -> Value {
    call(
        g,
        s,
        "LookupPDRoute",
        &json!({"modelId": "m", "tenantId": tenant, "prefixHash": b64(prefix),
                "prefixTokenCount": 128, "pdTopologyRef": topology})
        .to_string(),
    )
}

#[test]
fn lookup_pd_route_answers_every_reason_code() {
    let Some(g) = grpcurl() else { return };
    let dir = temp_dir("pd");
    let file = dir.join("pd.yaml");
    std::fs::write(&file, PD).unwrap();
    let s = ServerProcess::start(&["--pd-topology-file", file.to_str().unwrap()]);
    let cached = [7u8; 8];
    report(
        &g,
        &s,
        &[
            update("p1", None, 0.1),
            update("p2", Some(&cached), 0.6),
            update("d1", None, 0.9),
            update("d2", None, 0.2),
            update("elsewhere", Some(&[9u8; 8]), 0.0),
        ],
    );

    // The prefill replica holding the prefix wins over the less loaded one.
    let r = pd(&g, &s, "team-a/pd", "team-a", &cached);
    assert_eq!(
        r,
        json!({"prefillReplicaId": "p2", "decodeReplicaId": "d2",
               "transportHint": "Mooncake", "reasonCode": "PREFIX_MATCH"})
    );
    // No prefill replica holds it (a replica outside the pool does): by load.
    let r = pd(&g, &s, "team-a/pd", "team-a", &[9u8; 8]);
    assert_eq!(
        r,
        json!({"prefillReplicaId": "p1", "decodeReplicaId": "d2",
               "transportHint": "Mooncake", "reasonCode": "AFFINITY_HINT"})
    );
    // Fail-open NO_HINT: unknown topology, an empty pool, the probe tenant.
    for (topology, tenant) in [
        ("team-a/nope", "team-a"),
        ("team-a/no-prefill", "team-a"),
        ("team-a/pd", "inferencecache.io/probe"),
    ] {
        let r = pd(&g, &s, topology, tenant, &cached);
        assert_eq!(r, json!({"reasonCode": "NO_HINT"}), "{topology} {tenant}");
    }
    let m = metrics(&s);
    for line in [
        "inferencecache_lookup_pd_route_calls_total{reason_code=\"PREFIX_MATCH\"} 1",
        "inferencecache_lookup_pd_route_calls_total{reason_code=\"AFFINITY_HINT\"} 1",
        "inferencecache_lookup_pd_route_calls_total{reason_code=\"NO_HINT\"} 3",
        "inferencecache_pd_topologies 2",
    ] {
        assert!(m.contains(line), "missing {line}\n{m}");
    }
    let snap: Value = serde_json::from_str(&http_get(&s.control, "/snapshot").1).unwrap();
    assert_eq!(
        snap["pdTopologies"][1],
        json!({"namespace": "team-a", "name": "pd", "transport": "Mooncake",
               "prefillReplicas": ["p1", "p2"], "decodeReplicas": ["d1", "d2"]})
    );
}

/// The affinity rule: SHA-256(seed) → big-endian u64 of the first 8 bytes,
/// modulo the byte-sorted candidates.
fn affinity_pick<'a>(seed: &[u8], sorted: &[&'a str]) -> &'a str {
    use sha2::Digest;
    let d = sha2::Sha256::digest(seed);
    let v = u64::from_be_bytes(d[..8].try_into().unwrap());
    sorted[(v % sorted.len() as u64) as usize]
}

#[test]
fn equal_loads_are_broken_by_the_affinity_rule() {
    let Some(g) = grpcurl() else { return };
    let dir = temp_dir("pd-ties");
    let file = dir.join("pd.json");
    std::fs::write(
        &file,
        json!([{"namespace": "n", "name": "pd", "prefillReplicas": ["pa", "pb", "pc"],
                "decodeReplicas": ["dc", "da", "db"], "transport": "Direct"}])
        .to_string(),
    )
    .unwrap();
    let s = ServerProcess::start(&["--pd-topology-file", file.to_str().unwrap()]);
    let mut decodes = std::collections::BTreeSet::new();
    for i in 0u8..12 {
        let seed = [i; 8];
        let r = pd(&g, &s, "n/pd", "nobody", &seed);
        assert_eq!(r["reasonCode"], "AFFINITY_HINT");
        assert_eq!(r["transportHint"], "Direct");
        assert_eq!(
            r["prefillReplicaId"],
            affinity_pick(&seed, &["pa", "pb", "pc"])
        );
        assert_eq!(
            r["decodeReplicaId"],
            affinity_pick(&seed, &["da", "db", "dc"])
        );
        assert_eq!(pd(&g, &s, "n/pd", "nobody", &seed), r, "stable per prefix");
        decodes.insert(r["decodeReplicaId"].as_str().unwrap().to_owned());
    }
    assert!(decodes.len() > 1, "ties spread over the pool: {decodes:?}");
}

#[test]
fn pd_topologies_reload_from_the_file_and_pushes_replace_on_write() {
    let Some(g) = grpcurl() else { return };
    let dir = temp_dir("pd-reload");
    let file = dir.join("pd.yaml");
    std::fs::write(&file, PD).unwrap();
    let mut s = ServerProcess::start(&["--pd-topology-file", file.to_str().unwrap()]);
    let seed = [1u8; 8];
    assert_eq!(
        pd(&g, &s, "team-a/pd", "t", &seed)["transportHint"],
        "Mooncake"
    );
    std::fs::write(&file, PD.replace("transport: Mooncake", "transport: NIXL")).unwrap();
    eventually("NIXL", || {
        pd(&g, &s, "team-a/pd", "t", &seed)["transportHint"] == "NIXL"
    });
    std::fs::write(
        &file,
        "- namespace: team-a\n  name: pd\n  transport: Pigeon\n",
    )
    .unwrap();
    wait_for_log(&mut s.lines, "pd_topology_file_reload_failed");
    assert_eq!(pd(&g, &s, "team-a/pd", "t", &seed)["transportHint"], "NIXL");

    // A push replaces the whole set.
    let (status, text) = post(
        &s,
        "/pd-topologies",
        r#"[{"namespace":"b","name":"x","prefillReplicas":["p"],"decodeReplicas":["d"],"transport":"Direct"}]"#,
    );
    assert!(status.contains(" 204 "), "{status}: {text}");
    assert_eq!(pd(&g, &s, "team-a/pd", "t", &seed)["reasonCode"], "NO_HINT");
    assert_eq!(
        pd(&g, &s, "b/x", "t", &seed),
        json!({"prefillReplicaId": "p", "decodeReplicaId": "d",
               "transportHint": "Direct", "reasonCode": "AFFINITY_HINT"})
    );
    for (body, want) in [
        ("{}".to_owned(), "decode pd topologies: "),
        (
            format!("[{}]", " ".repeat(1 << 20)),
            "decode pd topologies: http: request body too large",
        ),
    ] {
        let (status, text) = post(&s, "/pd-topologies", &body);
        assert!(status.contains(" 400 "), "{status}: {text}");
        assert!(text.contains(want), "{text}");
    }
    assert_eq!(pd(&g, &s, "b/x", "t", &seed)["reasonCode"], "AFFINITY_HINT");
    let (status, _) = http_send(&s.control, "DELETE", "/pd-topologies", &[], b"");
    assert!(status.contains(" 405 "), "{status}");
}

#[test]
fn the_probe_tenant_never_appears_on_a_live_event_stream() {
    let Some(g) = grpcurl() else { return };
    let s = ServerProcess::start(&[]);
    // An unfiltered watcher.
    let mut watcher = Command::new(&g)
        .args([
            "-plaintext",
            "-d",
            "{}",
            &s.grpc,
            &format!("{SVC}/StreamCacheEvents"),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = watcher.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Wait until the stream is open, then run the self-test (it writes and
    // removes probe-tenant entries) and report one real update.
    eventually("the watcher", || {
        metrics(&s).contains("inferencecache_stream_subscribers{type=\"events\"} 1")
    });
    let (status, text) = post(
        &s,
        "/probe",
        r#"{"backend":"b","model":"m","hashScheme":"vllm"}"#,
    );
    assert!(status.contains(" 200 "), "{status}: {text}");
    report(&g, &s, &[update("r-live", Some(&[3u8; 8]), 0.0)]);
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.contains("r-live") && Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.push_str(&line);
            seen.push('\n');
        }
    }
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert!(seen.contains("r-live"), "the real event arrives: {seen}");
    assert!(!seen.contains("inferencecache.io/probe"), "{seen}");
}

#[test]
fn hot_prefixes_count_delivered_hits_for_lru_tenants() {
    let Some(g) = grpcurl() else { return };
    let s = ServerProcess::start(&[]);
    let prefix = [5u8; 8];
    report(&g, &s, &[update("r1", Some(&prefix), 0.0)]);
    let state = |s: &ServerProcess| {
        call(
            &g,
            s,
            "GetCacheState",
            r#"{"modelId":"m","tenantId":"team-a"}"#,
        )
    };
    assert!(
        state(&s)["summary"].get("hotPrefixes").is_none(),
        "no hit yet"
    );
    // No policy pushed: team-a is an LRU tenant.
    let r = call(
        &g,
        &s,
        "LookupRoute",
        &json!({"modelId": "m", "tenantId": "team-a", "hashScheme": "vllm",
                "prefixHash": b64(&prefix), "prefixTokenCount": 128})
        .to_string(),
    );
    assert_eq!(r["reasonCode"], "PREFIX_MATCH", "{r}");
    assert_eq!(state(&s)["summary"]["hotPrefixes"], "1");
    let snap: Value = serde_json::from_str(&http_get(&s.control, "/snapshot").1).unwrap();
    assert_eq!(snap["hotPrefixes"], 1);
}

#[test]
fn prompt_text_works_for_a_tiktoken_model() {
    let Some(g) = grpcurl() else { return };
    let root = temp_dir("tiktoken");
    let model = root.join("acme/tiny");
    std::fs::create_dir_all(&model).unwrap();
    // A byte-level vocabulary plus a few merges, in tiktoken's file format.
    let mut lines: Vec<String> = (0u8..=255).map(|b| format!("{} {b}", b64(&[b]))).collect();
    for (i, m) in [
        "he", "ll", "llo", "hello", " w", "or", " wor", "ld", " world",
    ]
    .iter()
    .enumerate()
    {
        lines.push(format!("{} {}", b64(m.as_bytes()), 256 + i));
    }
    std::fs::write(model.join("tiny.tiktoken"), lines.join("\n")).unwrap();
    std::fs::write(
        model.join("tokenizer_config.json"),
        json!({
            "added_tokens_decoder": {"1000": {"content": "<|user|>"}},
            "chat_template": "{% for m in messages %}<|user|>{{ m.content }}{% endfor %}"
        })
        .to_string(),
    )
    .unwrap();
    let s = ServerProcess::start(&[
        "--tokenizer-models-dir",
        root.to_str().unwrap(),
        "--engine-block-size",
        "2",
    ]);
    let r = call(
        &g,
        &s,
        "LookupRoute",
        &json!({"modelId": "acme/tiny", "tenantId": "t", "hashScheme": "vllm",
                "promptText": "hello world"})
        .to_string(),
    );
    // "<|user|>" → 1000, "hello" → 259, " world" → 264.
    assert_eq!(r["tokenIds"], json!([1000, 259, 264]), "{r}");
}

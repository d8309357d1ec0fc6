//! Black-box tests of `lookup`, `state`, `snapshot` and `watch` against the
//! real binary serving on ephemeral ports.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{BIN, ServerProcess};
use inferencecache_client::{
    CacheStateUpdate, Client, ClientConfig, PrefixEntry, ReplicaStats, block_hashes,
};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Runs the binary to completion (killed after 20 s).
fn run(args: &[&str]) -> Output {
    let child = Command::new(BIN)
        .args(args)
        .env_remove("INFERENCECACHE_SERVER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait(child, Duration::from_secs(20))
}

fn wait(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

fn prompt() -> Vec<u32> {
    (0..80).collect()
}

fn csv(tokens: &[u32]) -> String {
    tokens
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Reports, through the SDK, that `replica` caches `tokens` for t/m.
fn report(grpc: &str, replica: &str, tokens: &[u32]) {
    let (hashes, counts) = block_hashes(tokens, 16);
    let update = CacheStateUpdate {
        replica_id: replica.into(),
        tenant_id: "t".into(),
        model_id: "m".into(),
        hash_scheme: "vllm".into(),
        prefixes: vec![PrefixEntry {
            block_hashes: hashes,
            block_token_counts: counts,
            ..Default::default()
        }],
        stats: Some(ReplicaStats {
            cache_memory_bytes: 3 << 20,
            hit_rate: 0.5,
            ..Default::default()
        }),
        ..Default::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = Client::connect(ClientConfig::new(grpc)).await.unwrap();
        assert!(client.report_state(vec![update]).await.unwrap().accepted);
    });
}

#[test]
fn lookup_prints_the_hint_as_json_and_readably() {
    let s = ServerProcess::start(&[]);
    report(&s.grpc, "r1", &prompt());
    // The prompt plus its next token: the engine recomputes a prompt's last
    // token, so all 80 cached tokens are reusable only with one more.
    let tokens = csv(&[prompt(), vec![7]].concat());
    let base = [
        "lookup", "--server", &s.grpc, "--tenant", "t", "--model", "m",
    ];

    let o = run(&[&base[..], &["--tokens", &tokens, "--json"]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["reason_code"], "PREFIX_MATCH", "{v}");
    assert_eq!(v["hint"], "prefix_match");
    assert_eq!(v["candidates"][0]["replica_id"], "r1");
    assert_eq!(v["candidates"][0]["matched_tokens"], 80);
    assert_eq!(v["candidates"][0]["tier"], "T1");
    assert!(v["latency_us"].as_u64().unwrap() > 0);

    // The same chain fingerprinted by the tool, and read from a file.
    let o = run(&[
        &base[..],
        &["--tokens", &tokens, "--client-fingerprint", "--json"],
    ]
    .concat());
    assert_eq!(json(&o)["candidates"][0]["matched_tokens"], 80);
    let file = std::env::temp_dir().join(format!("ic-tokens-{}.txt", std::process::id()));
    std::fs::write(&file, format!("[{}]\n", tokens.replace(',', ", "))).unwrap();
    let o = run(&[
        &base[..],
        &["--tokens-file", file.to_str().unwrap(), "--json"],
    ]
    .concat());
    std::fs::remove_file(&file).ok();
    assert_eq!(json(&o)["reason_code"], "PREFIX_MATCH");

    let o = run(&[&base[..], &["--tokens", &tokens]].concat());
    let text = stdout(&o);
    assert!(text.starts_with("PREFIX_MATCH  in "), "{text}");
    assert!(
        text.contains("REPLICA") && text.contains("r1") && text.contains("80"),
        "{text}"
    );
}

/// The server's count of delivered hints, from its /metrics.
fn delivered_hints(s: &ServerProcess) -> String {
    let metrics = common::http_get(&s.http, "/metrics").1;
    metrics
        .lines()
        .find(|l| l.starts_with("inferencecache_delivered_hints_total "))
        .unwrap_or_else(|| panic!("no delivered-hints count in {metrics}"))
        .to_owned()
}

#[test]
fn lookup_shadow_answers_without_recording_a_delivery() {
    let s = ServerProcess::start(&[]);
    report(&s.grpc, "r1", &prompt());
    let tokens = csv(&[prompt(), vec![7]].concat());
    let base = [
        "lookup", "--server", &s.grpc, "--tenant", "t", "--model", "m", "--tokens", &tokens,
        "--json",
    ];

    // The same answer as a lookup, and no request recorded for it.
    let o = run(&[&base[..], &["--shadow"]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(json(&o)["candidates"][0]["matched_tokens"], 80);
    assert_eq!(
        delivered_hints(&s),
        "inferencecache_delivered_hints_total 0"
    );

    // Without the flag the server counts the request about to land.
    let o = run(&base);
    assert_eq!(json(&o)["candidates"][0]["matched_tokens"], 80);
    assert_eq!(
        delivered_hints(&s),
        "inferencecache_delivered_hints_total 1"
    );
}

#[test]
fn lookup_explains_a_wrong_tenant_and_exits_0() {
    let s = ServerProcess::start(&[]);
    report(&s.grpc, "r1", &prompt());
    let tokens = csv(&prompt());
    let args = [
        "lookup", "--server", &s.grpc, "--tenant", "nobody", "--model", "m", "--tokens", &tokens,
    ];
    let o = run(&args);
    assert_eq!(o.status.code(), Some(0));
    let text = stdout(&o);
    assert!(text.starts_with("UNKNOWN_TENANT"), "{text}");
    assert!(text.contains("check --tenant"), "{text}");
    let o = run(&[&args[..], &["--json"]].concat());
    assert_eq!(json(&o)["reason_code"], "UNKNOWN_TENANT");
    assert_eq!(json(&o)["candidates"], serde_json::json!([]));
}

#[test]
fn tools_say_what_to_do_when_the_server_is_down() {
    // A privileged port nothing here listens on: a freed ephemeral port was
    // taken by another test's server in a full workspace run (the tool then
    // connected and failed mid-call instead of being refused).
    let closed = "127.0.0.1:1".to_string();
    assert!(
        std::net::TcpStream::connect(&closed).is_err(),
        "something listens on {closed}"
    );
    for tool in [
        &["lookup", "--tenant", "t", "--model", "m", "--tokens", "1"][..],
        &["state", "--tenant", "t", "--model", "m"][..],
        &["watch"][..],
    ] {
        let o = run(&[tool, &["--server", &closed]].concat());
        assert_eq!(o.status.code(), Some(1), "{tool:?}");
        let e = stderr(&o);
        assert!(
            e.contains(&format!("could not connect to {closed}"))
                && e.contains("is `inferencecache serve` running? pass --server"),
            "{tool:?}: {e}"
        );
    }
    let o = run(&["snapshot", "--url", &closed]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("pass --url"), "{}", stderr(&o));
}

#[test]
fn bad_flags_exit_2() {
    let base = ["lookup", "--tenant", "t", "--model", "m"];
    for extra in [
        &[][..],
        &["--tokens", "1", "--text", "hi"][..],
        &["--hashes", "xyz"][..],
        &["--hashes", "00ff", "--token-counts", "1,2"][..],
        &["--tokens", "-1"][..],
        &["--tokens", "1", "--deadline", "soon"][..],
    ] {
        let o = run(&[&base[..], extra].concat());
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", stderr(&o));
        assert!(!stderr(&o).is_empty());
    }
    let o = run(&[
        "lookup",
        "--server",
        "ftp://x:1",
        "--tenant",
        "t",
        "--model",
        "m",
        "--tokens",
        "1",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--server"), "{}", stderr(&o));
    let o = run(&["watch", "--type", "sometimes"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn state_lists_replicas() {
    let s = ServerProcess::start(&[]);
    report(&s.grpc, "r1", &prompt());
    let args = [
        "state", "--server", &s.grpc, "--tenant", "t", "--model", "m",
    ];
    let o = run(&[&args[..], &["--json"]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["replicas"][0]["replica_id"], "r1");
    assert_eq!(v["replicas"][0]["cache_memory_bytes"], 3 << 20);
    assert_eq!(v["summary"]["total_prefixes"], 5);
    let text = stdout(&run(&args));
    assert!(text.starts_with("t/m: 5 prefixes indexed"), "{text}");
    assert!(text.contains("r1") && text.contains("3.0 MiB"), "{text}");
}

#[test]
fn snapshot_summarizes_and_prints_json() {
    let s = ServerProcess::start(&[]);
    report(&s.grpc, "r1", &prompt());
    let o = run(&["snapshot", "--url", &s.control]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.starts_with("5 prefixes indexed"), "{text}");
    assert!(text.contains("TENANT") && text.contains("r1"), "{text}");
    let o = run(&[
        "snapshot",
        "--url",
        &format!("http://{}/snapshot", s.control),
        "--json",
    ]);
    let v = json(&o);
    assert_eq!(v["totalPrefixes"], 5);
    assert_eq!(v["replicas"][0]["replicaId"], "r1");
    assert!(stdout(&o).contains("\n  \""), "pretty-printed");
}

/// Starts `watch` and returns once its stream is open, with a thread that
/// drains the rest of its stderr (so the child never blocks on a full pipe).
fn start_watch(args: &[&str]) -> (Child, std::thread::JoinHandle<String>) {
    let mut child = Command::new(BIN)
        .arg("watch")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().expect("a stderr line").unwrap();
    assert!(first.starts_with("watching "), "{first}");
    let rest =
        std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>().join("\n"));
    (child, rest)
}

#[test]
fn watch_prints_events_as_they_happen() {
    let s = ServerProcess::start(&[]);
    let (child, errors) = start_watch(&[
        "--server",
        &s.grpc,
        "--tenant",
        "t",
        "--type",
        "prefix-added",
        "--json",
        "--count",
        "1",
        "--for",
        "20s",
    ]);
    report(&s.grpc, "r1", &prompt());
    let o = wait(child, Duration::from_secs(20));
    assert_eq!(o.status.code(), Some(0), "{}", errors.join().unwrap());
    let lines: Vec<serde_json::Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "--count 1: {}", stdout(&o));
    assert_eq!(lines[0]["type"], "PREFIX_ADDED");
    assert_eq!(lines[0]["replica_id"], "r1");
    assert_eq!(lines[0]["tenant_id"], "t");
    assert_eq!(lines[0]["prefix_hash"].as_str().unwrap().len(), 16);
}

#[test]
fn watch_exits_cleanly_on_ctrl_c() {
    let s = ServerProcess::start(&[]);
    let (child, errors) = start_watch(&["--server", &s.grpc]);
    let ok = Command::new("kill")
        .args(["-s", "INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let o = wait(child, Duration::from_secs(10));
    assert_eq!(o.status.code(), Some(0), "{}", errors.join().unwrap());
}

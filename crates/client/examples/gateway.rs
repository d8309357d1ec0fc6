//! A toy gateway: report what one replica caches (as a producer would), then
//! route a few prompts with a fail-open lookup and a round-robin fallback.
//!
//! ```text
//! cargo run -p inferencecache-client --example gateway                 # in-process server
//! cargo run -p inferencecache-client --example gateway -- --server http://127.0.0.1:9090
//! ```
//!
//! With `--server`, the example reports state to that server under tenant
//! `example`, so it does not disturb real tenants.

use inferencecache_client::{
    CacheStateUpdate, Client, ClientConfig, DEFAULT_BLOCK_SIZE, PrefixEntry, RoundRobin,
    RouteInput, RouteQuery, block_hashes,
};
use std::time::Duration;

const TENANT: &str = "example";
const MODEL: &str = "demo-model";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let server = match (args.next().as_deref(), args.next()) {
        (Some("--server"), Some(url)) => Some(url),
        (None, _) => None,
        _ => return Err("usage: gateway [--server http://HOST:9090]".into()),
    };

    // Without --server, run the real server in this process on ephemeral ports.
    let (endpoint, _server) = match server {
        Some(url) => (url, None),
        None => {
            let s = inferencecache_server::Server::bind(
                &inferencecache_server::ServerConfig::ephemeral(),
            )
            .await?;
            let url = format!("http://{}", s.grpc_addr());
            let stop = tokio_util::sync::CancellationToken::new();
            let task = tokio::spawn(s.serve(stop.clone()));
            println!("started an in-process server at {url}");
            (url, Some((stop.drop_guard(), task)))
        }
    };

    // A gateway connects lazily once; lookups never wait more than 20 ms.
    let client = Client::connect_lazy(ClientConfig::new(endpoint))?;

    // Producer side: replica "vllm-1" caches a 96-token system prompt. The
    // kvevent-subscriber does this for real engines.
    let system_prompt: Vec<u32> = (1000..1096).collect();
    let (hashes, counts) = block_hashes(&system_prompt, DEFAULT_BLOCK_SIZE);
    let ack = client
        .report_state(vec![CacheStateUpdate {
            replica_id: "vllm-1".into(),
            tenant_id: TENANT.into(),
            model_id: MODEL.into(),
            hash_scheme: "vllm".into(),
            prefixes: vec![PrefixEntry {
                block_hashes: hashes,
                block_token_counts: counts,
                ..Default::default()
            }],
            ..Default::default()
        }])
        .await?;
    println!("reported vllm-1's cache: accepted={}", ack.accepted);

    // Gateway side.
    let replicas: Vec<String> = ["vllm-0", "vllm-1", "vllm-2"].map(String::from).to_vec();
    let fallback = RoundRobin::new();
    let prompts: [(&str, Vec<u32>); 3] = [
        (
            "shares the system prompt",
            [system_prompt.clone(), (1..40).collect()].concat(),
        ),
        ("novel", (5000..5100).collect()),
        ("too short for one block", vec![1, 2, 3]),
    ];
    for (label, tokens) in prompts {
        let mut query = RouteQuery::new(TENANT, MODEL, RouteInput::TokenIds(tokens));
        query.deadline = Some(Duration::from_millis(50));
        let answer = client.lookup_route(&query).await;
        let replica = fallback.pick(&answer.hint, &replicas);
        let matched = answer.hint.best().map_or(0, |c| c.matched_tokens);
        println!(
            "{label:<26} {:<14} matched={matched:<4} → {replica:<7} ({:?})",
            answer.hint.reason_code(),
            answer.latency
        );
    }
    Ok(())
}

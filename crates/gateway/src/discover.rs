//! What the gateway asks each engine at startup and on every health check:
//! what it serves (`GET /v1/models`: base models, LoRA adapters and, for a
//! local model directory, where its tokenizer is), its KV block size (vLLM's
//! `vllm:cache_config_info` metric) and where it publishes KV events
//! (`GET /kv_event_sources`, vLLM 0.32+: the resolved publisher and replay
//! endpoints per data-parallel rank, `*` standing for the engine's host).

use crate::config::EngineSpec;
use crate::engine::Served;
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

/// Timeout of one discovery or health request.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

async fn get(http: &reqwest::Client, url: &str) -> Result<reqwest::Response, String> {
    let r = http
        .get(url)
        .timeout(PROBE_TIMEOUT)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !r.status().is_success() {
        return Err(format!("GET {url}: HTTP {}", r.status()));
    }
    Ok(r)
}

async fn get_json(http: &reqwest::Client, url: &str) -> Result<Value, String> {
    let body = get(http, url)
        .await?
        .bytes()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    serde_json::from_slice(&body).map_err(|e| format!("GET {url}: not JSON: {e}"))
}

/// `GET /health` answers 2xx.
pub async fn healthy(http: &reqwest::Client, base: &str) -> bool {
    get(http, &format!("{base}/health")).await.is_ok()
}

/// What the engine serves, and its base models' local directories.
pub async fn models(
    http: &reqwest::Client,
    base: &str,
) -> Result<(Served, Vec<(String, PathBuf)>), String> {
    let v = get_json(http, &format!("{base}/v1/models")).await?;
    let served = Served::from_models_json(&v);
    let roots = v["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["parent"].is_null())
        .filter_map(|m| {
            Some((
                m["id"].as_str()?.to_owned(),
                PathBuf::from(m["root"].as_str()?),
            ))
        })
        .filter(|(_, dir)| dir.join("tokenizer.json").is_file())
        .collect();
    Ok((served, roots))
}

/// The engine's KV block size from `vllm:cache_config_info`, if it says.
pub async fn block_size(http: &reqwest::Client, base: &str) -> Option<u32> {
    let text = get(http, &format!("{base}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    block_size_from_metrics(&text)
}

fn block_size_from_metrics(text: &str) -> Option<u32> {
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:cache_config_info{"))?;
    label(line, "block_size")?.parse().ok()
}

/// The value of label `key` in a Prometheus sample line.
fn label<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let mut rest = &line[line.find('{')? + 1..];
    loop {
        let eq = rest.find("=\"")?;
        let (k, after) = (&rest[..eq], &rest[eq + 2..]);
        let end = after.find('"')?;
        if k == key {
            return Some(&after[..end]);
        }
        rest = after[end + 1..].trim_start_matches(',');
    }
}

/// Where one engine publishes KV events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSources {
    /// Rank 0's publisher endpoint (rank r's port is rank 0's plus r, the
    /// rule vLLM and the subscriber share).
    pub endpoint: String,
    /// Rank 0's replay endpoint.
    pub replay: Option<String>,
    /// The topic.
    pub topic: String,
    /// Data-parallel ranks.
    pub ranks: u32,
}

fn localize(endpoint: &str, host: &str) -> String {
    endpoint.replacen("://*:", &format!("://{host}:"), 1)
}

/// The engine's event endpoints: `spec`'s overrides, else `GET
/// /kv_event_sources`. An engine that publishes nothing is an error that
/// says what to do.
pub async fn event_sources(
    http: &reqwest::Client,
    spec: &EngineSpec,
) -> Result<EventSources, String> {
    let host = spec.host();
    if let Some(endpoint) = &spec.events {
        return Ok(EventSources {
            endpoint: endpoint.clone(),
            replay: spec.replay.clone(),
            topic: "kv-events".into(),
            ranks: 1,
        });
    }
    let url = format!("{}/kv_event_sources", spec.url);
    let v = get_json(http, &url).await.map_err(|e| {
        format!("{e}; this engine does not say where it publishes KV events (vLLM < 0.32?): give them with --engine URL,events=tcp://HOST:PORT[,replay=tcp://HOST:PORT]")
    })?;
    let ranks = v.as_object().map_or(0, |o| o.len());
    let rank0 = &v["0"];
    let endpoint = rank0["endpoint"].as_str().filter(|_| rank0["publisher"] == "zmq").ok_or_else(|| {
        format!("{url} lists no ZMQ publisher for rank 0 ({v}); start the engine with --kv-events-config '{{\"enable_kv_cache_events\":true,\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:5557\",\"replay_endpoint\":\"tcp://*:5558\"}}'")
    })?;
    Ok(EventSources {
        endpoint: localize(endpoint, host),
        replay: spec
            .replay
            .clone()
            .or_else(|| rank0["replay_endpoint"].as_str().map(|r| localize(r, host))),
        topic: rank0["topic"].as_str().unwrap_or_default().to_owned(),
        ranks: u32::try_from(ranks).unwrap_or(1).max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_size_is_read_from_the_exact_label() {
        let m = "# HELP x\nvllm:cache_config_info{_block_size_resolved=\"True\",block_size=\"32\",hash_block_size=\"None\",mamba_block_size=\"None\"} 1.0\n";
        assert_eq!(block_size_from_metrics(m), Some(32));
        let m = "vllm:cache_config_info{mamba_block_size=\"8\",block_size=\"16\"} 1.0\n";
        assert_eq!(block_size_from_metrics(m), Some(16));
        assert_eq!(block_size_from_metrics("other 1\n"), None);
    }

    #[test]
    fn a_star_host_becomes_the_engines_host() {
        assert_eq!(localize("tcp://*:5557", "10.1.2.3"), "tcp://10.1.2.3:5557");
        assert_eq!(localize("tcp://10.0.0.9:5557", "h"), "tcp://10.0.0.9:5557");
    }
}

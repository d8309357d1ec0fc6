//! The ingest flood of `inferencecache-bench grpc --flood-streams N`: N producers, each on
//! its own connection, re-report `--flood-prefixes` distinct legacy prefixes
//! in updates of `--flood-batch` as fast as the server takes them, while the
//! lookup workers measure LookupRoute. Keys cycle, so the index does not grow
//! past N × prefixes entries.

use anyhow::Context;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::{CacheStateUpdate, PrefixEntry};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// Flood shape.
#[derive(Debug, Clone, Copy)]
pub(super) struct Flood {
    /// Concurrent producer streams.
    pub streams: usize,
    /// Distinct prefixes per stream.
    pub prefixes: usize,
    /// Prefixes per update.
    pub batch: usize,
}

/// One producer: updates of `batch` prefixes until `stop`.
async fn producer(
    stream: usize,
    flood: Flood,
    channel: Channel,
    measuring: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let mut client = InferenceCacheClient::new(channel)
        .max_decoding_message_size(usize::MAX)
        .max_encoding_message_size(usize::MAX);
    let batch = flood.batch.max(1);
    let prefixes = flood.prefixes.max(batch);
    let updates = futures::stream::unfold(0usize, move |next| {
        let stop = stop.clone();
        let measuring = Arc::clone(&measuring);
        let sent = Arc::clone(&sent);
        async move {
            if stop.is_cancelled() {
                return None;
            }
            let entries = (0..batch)
                .map(|i| {
                    let k = ((next + i) % prefixes) as u64;
                    PrefixEntry {
                        prefix_hash: ((stream as u64) << 40 | k).to_be_bytes().to_vec(),
                        token_count: 16,
                        ..Default::default()
                    }
                })
                .collect();
            if measuring.load(Ordering::Acquire) {
                sent.fetch_add(batch as u64, Ordering::AcqRel);
            }
            let u = CacheStateUpdate {
                replica_id: format!("flood-{stream}"),
                model_id: "flood-model".into(),
                tenant_id: "flood".into(),
                hash_scheme: "vllm".into(),
                prefixes: entries,
                ..Default::default()
            };
            Some((u, (next + batch) % prefixes))
        }
    });
    client
        .report_cache_state(updates)
        .await
        .context("flood ReportCacheState")?;
    Ok(())
}

/// Starts the producers, each on a fresh connection to `url`.
pub(super) async fn start(
    url: &str,
    flood: Flood,
    measuring: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    stop: CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<anyhow::Result<()>>>> {
    let mut tasks = Vec::new();
    for s in 0..flood.streams {
        let channel = Channel::from_shared(url.to_owned())?
            .connect()
            .await
            .with_context(|| format!("connect flood producer to {url}"))?;
        tasks.push(tokio::spawn(producer(
            s,
            flood,
            channel,
            Arc::clone(&measuring),
            Arc::clone(&sent),
            stop.clone(),
        )));
    }
    Ok(tasks)
}

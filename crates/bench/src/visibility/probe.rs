//! Latency samples: poll LookupRoute with a chain's `token_ids` every 1 ms
//! until the answer flips, and keep the times in an HDR histogram.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::{LookupRouteRequest, LookupRouteResponse};
use tonic::transport::Channel;

use super::rig::REPLICA;

const POLL: Duration = Duration::from_millis(1);
/// A sample not seen by then is counted as missed.
const GIVE_UP: Duration = Duration::from_secs(5);

/// The lookup a gateway would send for a chain.
pub(super) fn request(tokens: Range<u32>) -> LookupRouteRequest {
    LookupRouteRequest {
        model_id: "m".into(),
        tenant_id: "t".into(),
        hash_scheme: "vllm".into(),
        token_ids: tokens.collect(),
        ..Default::default()
    }
}

/// PREFIX_MATCH, and the sidecar's replica matches all `tokens` of it.
pub(super) fn full_match(r: &LookupRouteResponse, tokens: usize) -> bool {
    r.reason_code == inferencecache_proto::Reason::PrefixMatch.as_str()
        && r.replica_scores
            .iter()
            .any(|s| s.replica_id == REPLICA && s.matched_tokens as usize >= tokens)
}

/// Polls until `done` holds; the time since `from`, or `None` after
/// [`GIVE_UP`]. Failed lookups are retried like unchanged answers.
pub(super) async fn poll_until(
    client: &mut InferenceCacheClient<Channel>,
    req: &LookupRouteRequest,
    from: Instant,
    done: impl Fn(&LookupRouteResponse) -> bool,
) -> Option<Duration> {
    while from.elapsed() < GIVE_UP {
        if let Ok(r) = client.lookup_route(req.clone()).await {
            if done(r.get_ref()) {
                return Some(from.elapsed());
            }
        }
        tokio::time::sleep(POLL).await;
    }
    None
}

/// One latency series, shared by the sampling tasks.
#[derive(Clone)]
pub(super) struct Latencies {
    hist: Arc<Mutex<Histogram<u64>>>,
    missed: Arc<AtomicU64>,
}

/// p50 / p99 / max in ms, over `samples`, plus the missed count.
pub(super) struct Summary {
    pub samples: u64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub missed: u64,
}

impl Latencies {
    pub(super) fn new() -> anyhow::Result<Self> {
        Ok(Self {
            hist: Arc::new(Mutex::new(Histogram::new(3)?)),
            missed: Arc::new(AtomicU64::new(0)),
        })
    }

    /// Records a sample, or a miss for `None`.
    pub(super) fn add(&self, latency: Option<Duration>) {
        match latency {
            Some(d) => {
                if let Ok(mut h) = self.hist.lock() {
                    let _ = h.record((d.as_micros() as u64).max(1));
                }
            }
            None => {
                self.missed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    pub(super) fn summary(&self) -> Summary {
        let missed = self.missed.load(Ordering::Relaxed);
        let Ok(h) = self.hist.lock() else {
            return Summary {
                samples: 0,
                p50: 0.0,
                p99: 0.0,
                max: 0.0,
                missed,
            };
        };
        let ms = |us: u64| us as f64 / 1000.0;
        Summary {
            samples: h.len(),
            p50: ms(h.value_at_quantile(0.5)),
            p99: ms(h.value_at_quantile(0.99)),
            max: ms(h.max()),
            missed,
        }
    }
}

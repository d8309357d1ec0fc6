//! Per-policy results: summary figures, time series, and the table, JSON and
//! CSV renderings.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// What the simulator remembers about one routed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// Arrival, µs of simulated time.
    pub arrival_us: u64,
    /// Replica index.
    pub replica: usize,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens found cached.
    pub cached_tokens: u32,
    /// Time to first token, µs.
    pub ttft_us: u64,
    /// Reason code of the hint, for server-backed policies.
    pub reason: Option<String>,
    /// Client-side lookup latency (wall clock), µs.
    pub lookup_us: Option<u64>,
}

/// One time bucket of a policy's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeriesPoint {
    /// Bucket start, seconds of trace time.
    pub t_seconds: f64,
    /// Requests arriving in the bucket.
    pub requests: u64,
    /// Cached / prompt tokens of those requests.
    pub hit_rate: f64,
    /// Median TTFT of those requests, ms.
    pub ttft_p50_ms: f64,
}

/// One policy's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyResult {
    /// Policy name.
    pub policy: String,
    /// Requests routed.
    pub requests: u64,
    /// Prompt tokens of all requests.
    pub prompt_tokens: u64,
    /// Of which served from a replica's cache.
    pub cached_tokens: u64,
    /// `cached_tokens / prompt_tokens`.
    pub hit_rate: f64,
    /// TTFT percentiles and mean, ms.
    pub ttft_p50_ms: f64,
    /// 99th percentile TTFT, ms.
    pub ttft_p99_ms: f64,
    /// Mean TTFT, ms.
    pub ttft_mean_ms: f64,
    /// Requests routed to each replica.
    pub requests_per_replica: Vec<u64>,
    /// Max over mean of `requests_per_replica` (1.0 = perfectly even).
    pub balance_max_mean: f64,
    /// LookupRoute calls made.
    pub lookups: u64,
    /// Client-side lookup latency percentiles, µs (wall clock).
    pub lookup_p50_us: Option<f64>,
    /// 99th percentile lookup latency, µs.
    pub lookup_p99_us: Option<f64>,
    /// LookupRoute answers by reason code.
    pub hint_mix: BTreeMap<String, u64>,
    /// Hit rate and TTFT over trace time.
    pub series: Vec<SeriesPoint>,
    /// Digest of every routing decision and cache hit (equal digests = the
    /// same run, decision for decision).
    pub decisions_digest: String,
    /// Wall time of this policy's run, seconds.
    pub wall_seconds: f64,
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    // Nearest rank: the smallest value with at least p% of samples at or below it.
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

impl PolicyResult {
    /// Summarises a run's records into `buckets` time buckets.
    pub fn from_records(
        policy: &str,
        records: &[RequestRecord],
        replicas: usize,
        buckets: usize,
        wall_seconds: f64,
    ) -> Self {
        let prompt_tokens: u64 = records.iter().map(|r| u64::from(r.prompt_tokens)).sum();
        let cached_tokens: u64 = records.iter().map(|r| u64::from(r.cached_tokens)).sum();
        let mut ttft: Vec<u64> = records.iter().map(|r| r.ttft_us).collect();
        ttft.sort_unstable();
        let mut lookup: Vec<u64> = records.iter().filter_map(|r| r.lookup_us).collect();
        lookup.sort_unstable();
        let mut per_replica = vec![0u64; replicas];
        let mut hint_mix = BTreeMap::new();
        let mut digest = inferencecache_fingerprint::SEED;
        for r in records {
            per_replica[r.replica] += 1;
            if let Some(reason) = &r.reason {
                *hint_mix.entry(reason.clone()).or_insert(0) += 1;
            }
            digest = inferencecache_fingerprint::chain_step(
                digest,
                (r.replica as u64) << 32 | u64::from(r.cached_tokens),
            );
        }
        let mean = records.len() as f64 / replicas.max(1) as f64;
        let max = per_replica.iter().copied().max().unwrap_or(0) as f64;
        let n = records.len() as f64;
        Self {
            policy: policy.to_owned(),
            requests: records.len() as u64,
            prompt_tokens,
            cached_tokens,
            hit_rate: if prompt_tokens == 0 {
                0.0
            } else {
                cached_tokens as f64 / prompt_tokens as f64
            },
            ttft_p50_ms: percentile(&ttft, 50.0) / 1000.0,
            ttft_p99_ms: percentile(&ttft, 99.0) / 1000.0,
            ttft_mean_ms: ttft.iter().sum::<u64>() as f64 / n.max(1.0) / 1000.0,
            requests_per_replica: per_replica,
            balance_max_mean: if mean > 0.0 { max / mean } else { 0.0 },
            lookups: lookup.len() as u64,
            lookup_p50_us: (!lookup.is_empty()).then(|| percentile(&lookup, 50.0)),
            lookup_p99_us: (!lookup.is_empty()).then(|| percentile(&lookup, 99.0)),
            hint_mix,
            series: series(records, buckets),
            decisions_digest: format!("{digest:016x}"),
            wall_seconds,
        }
    }

    /// True when two runs made the same decisions with the same outcomes
    /// (wall-clock latencies aside).
    pub fn same_outcome(&self, other: &Self) -> bool {
        self.decisions_digest == other.decisions_digest
            && self.hit_rate == other.hit_rate
            && self.ttft_p50_ms == other.ttft_p50_ms
            && self.ttft_p99_ms == other.ttft_p99_ms
            && self.requests_per_replica == other.requests_per_replica
            && self.hint_mix == other.hint_mix
            && self.series == other.series
    }
}

fn series(records: &[RequestRecord], buckets: usize) -> Vec<SeriesPoint> {
    let (Some(first), Some(last)) = (records.first(), records.last()) else {
        return Vec::new();
    };
    let buckets = buckets.max(1);
    let span = (last.arrival_us - first.arrival_us).max(1);
    let width = span.div_ceil(buckets as u64).max(1);
    let mut acc: Vec<(u64, u64, Vec<u64>)> = vec![(0, 0, Vec::new()); buckets];
    for r in records {
        let b = (((r.arrival_us - first.arrival_us) / width) as usize).min(buckets - 1);
        acc[b].0 += u64::from(r.prompt_tokens);
        acc[b].1 += u64::from(r.cached_tokens);
        acc[b].2.push(r.ttft_us);
    }
    acc.into_iter()
        .enumerate()
        .filter(|(_, (_, _, t))| !t.is_empty())
        .map(|(i, (prompt, cached, mut t))| {
            t.sort_unstable();
            SeriesPoint {
                t_seconds: (i as u64 * width) as f64 / 1e6,
                requests: t.len() as u64,
                hit_rate: if prompt == 0 {
                    0.0
                } else {
                    cached as f64 / prompt as f64
                },
                ttft_p50_ms: percentile(&t, 50.0) / 1000.0,
            }
        })
        .collect()
}

/// Everything one `simulate` run produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    /// Trace file (or a label).
    pub trace: String,
    /// Requests replayed.
    pub requests: u64,
    /// Simulated span of the trace, seconds (after `--speedup`).
    pub trace_seconds: f64,
    /// The settings used.
    pub settings: crate::config::Settings,
    /// One result per policy, in the order run.
    pub policies: Vec<PolicyResult>,
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

impl SimReport {
    /// One line naming the run's shape, including the production delays the
    /// figures assume (every table starts with it).
    pub fn header(&self) -> String {
        let s = &self.settings;
        format!(
            "{} requests over {:.0} s of trace, {} replicas × {} blocks, speedup {}, \
             event delay {} ms, stats interval {} s, seed {}",
            self.requests,
            self.trace_seconds,
            s.replicas,
            s.cache_blocks,
            s.speedup,
            s.event_delay_ms,
            s.stats_interval_ms as f64 / 1000.0,
            s.seed
        )
    }

    /// A plain-text table, one row per policy.
    pub fn table(&self) -> String {
        let mut out = self.header();
        out.push('\n');
        let _ = writeln!(
            out,
            "{:<18} {:>8} {:>10} {:>10} {:>9} {:>14}  hint mix",
            "policy", "hit rate", "TTFT p50", "TTFT p99", "max/mean", "lookup p50/p99"
        );
        for p in &self.policies {
            let mix = if p.hint_mix.is_empty() {
                "-".to_owned()
            } else {
                p.hint_mix
                    .iter()
                    .map(|(k, v)| {
                        format!("{k} {:.0}%", 100.0 * *v as f64 / p.lookups.max(1) as f64)
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let _ = writeln!(
                out,
                "{:<18} {:>7.1}% {:>8.0}ms {:>8.0}ms {:>9.2} {:>14}  {}",
                p.policy,
                100.0 * p.hit_rate,
                p.ttft_p50_ms,
                p.ttft_p99_ms,
                p.balance_max_mean,
                format!(
                    "{}/{} µs",
                    fmt_opt(p.lookup_p50_us),
                    fmt_opt(p.lookup_p99_us)
                ),
                mix
            );
        }
        out
    }

    /// A Markdown table (for BENCHMARKS.md).
    pub fn markdown(&self) -> String {
        let mut out = format!("{}\n\n", self.header());
        out.push_str(
            "| policy | hit rate | TTFT p50 | TTFT p99 | requests/replica max/mean | lookup p50 / p99 | hint mix |\n| --- | ---: | ---: | ---: | ---: | ---: | --- |\n",
        );
        for p in &self.policies {
            let mix = p
                .hint_mix
                .iter()
                .map(|(k, v)| format!("{k} {:.0}%", 100.0 * *v as f64 / p.lookups.max(1) as f64))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                out,
                "| {} | {:.1}% | {:.0} ms | {:.0} ms | {:.2} | {} | {} |",
                p.policy,
                100.0 * p.hit_rate,
                p.ttft_p50_ms,
                p.ttft_p99_ms,
                p.balance_max_mean,
                match (p.lookup_p50_us, p.lookup_p99_us) {
                    (Some(a), Some(b)) => format!("{a:.0} / {b:.0} µs"),
                    _ => "-".into(),
                },
                if mix.is_empty() { "-".into() } else { mix }
            );
        }
        out
    }

    /// The whole report as pretty JSON (with a trailing newline).
    pub fn json(&self) -> String {
        // Every field is a plain number, string, list or map: this cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
    }

    /// CSV: one row per policy.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "policy,requests,prompt_tokens,cached_tokens,hit_rate,ttft_p50_ms,ttft_p99_ms,ttft_mean_ms,balance_max_mean,requests_per_replica,lookups,lookup_p50_us,lookup_p99_us,hint_mix,wall_seconds\n",
        );
        for p in &self.policies {
            let per = p
                .requests_per_replica
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(";");
            let mix = p
                .hint_mix
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(";");
            let opt = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v}"));
            let _ = writeln!(
                out,
                "{},{},{},{},{:.6},{:.3},{:.3},{:.3},{:.4},{},{},{},{},{},{:.2}",
                p.policy,
                p.requests,
                p.prompt_tokens,
                p.cached_tokens,
                p.hit_rate,
                p.ttft_p50_ms,
                p.ttft_p99_ms,
                p.ttft_mean_ms,
                p.balance_max_mean,
                per,
                p.lookups,
                opt(p.lookup_p50_us),
                opt(p.lookup_p99_us),
                mix,
                p.wall_seconds
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(t: u64, replica: usize, cached: u32, ttft: u64) -> RequestRecord {
        RequestRecord {
            arrival_us: t,
            replica,
            prompt_tokens: 100,
            cached_tokens: cached,
            ttft_us: ttft,
            reason: None,
            lookup_us: None,
        }
    }

    #[test]
    fn summary_figures() {
        let r = PolicyResult::from_records(
            "x",
            &[
                rec(0, 0, 50, 1000),
                rec(10, 0, 0, 3000),
                rec(20, 1, 100, 2000),
            ],
            2,
            2,
            0.0,
        );
        assert_eq!(r.hit_rate, 0.5);
        assert_eq!(r.requests_per_replica, vec![2, 1]);
        assert!((r.balance_max_mean - 2.0 / 1.5).abs() < 1e-12);
        assert_eq!(r.ttft_p50_ms, 2.0);
        assert_eq!(r.ttft_p99_ms, 3.0);
        assert_eq!(r.series.len(), 2);
        assert_eq!(r.series[0].hit_rate, 0.5);
        assert_eq!(r.series[1].hit_rate, 0.5);
    }
}

//! Engine metrics → [`EngineStats`] (spec A.8): the vLLM and SGLang profiles.

use super::exposition::Sample;
use super::{CacheTierGauge, EngineLoad, EngineStats};

/// Which engine's metric names to read (`--hash-scheme sglang` → SGLang).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// `vllm:*`.
    Vllm,
    /// `sglang:*`.
    Sglang,
}

impl Profile {
    /// The profile a hash scheme selects.
    pub fn for_scheme(scheme: &str) -> Self {
        if scheme == "sglang" {
            Self::Sglang
        } else {
            Self::Vllm
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Self::Vllm => "vllm:",
            Self::Sglang => "sglang:",
        }
    }
}

/// Why a scrape is rejected (fail loud: zero stats are never reported as
/// if they were real).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    /// None of the profile's metrics is there.
    #[error("no {0} metrics found: wrong engine, port or --hash-scheme?")]
    WrongEngine(&'static str),
    /// A load gauge is missing (after the model filter).
    #[error(
        "load gauge {0} missing (engine without --enable-metrics, or --engine-model-name filters it out)"
    )]
    MissingLoad(&'static str),
}

/// Settings of the computation.
#[derive(Debug, Clone)]
pub struct ProfileConfig {
    /// Metric names to read.
    pub profile: Profile,
    /// `--engine-model-name`: only series with this `model_name` count.
    pub model_name: Option<String>,
    /// `--max-concurrency-ceiling`: pressure denominator (0 disables).
    pub max_concurrency_ceiling: f64,
    /// `--engine-cache-size-bytes`: multiplied by the usage ratio.
    pub cache_size_bytes: i64,
    /// `--cache-tier`: which usage gauge to read.
    pub cache_tier: CacheTierGauge,
}

/// Counter baseline kept between scrapes for the vLLM hit-rate delta.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HitBaseline {
    hits: f64,
    queries: f64,
    set: bool,
}

struct View<'a> {
    samples: &'a [Sample],
    model: Option<&'a str>,
}

impl View<'_> {
    fn series<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s Sample> + 's {
        self.samples.iter().filter(move |s| {
            s.name == name && self.model.is_none_or(|m| s.label("model_name") == Some(m))
        })
    }

    fn sum(&self, name: &str) -> Option<f64> {
        let mut it = self
            .series(name)
            .filter(|s| s.label("priority").is_none_or(str::is_empty))
            .peekable();
        it.peek()?;
        Some(it.map(|s| s.value).sum())
    }

    fn max(&self, name: &str) -> Option<f64> {
        self.series(name).map(|s| s.value).reduce(f64::max)
    }

    /// A counter as `name_total`, else the bare name (OpenMetrics fixtures).
    fn counter(&self, name: &str) -> Option<f64> {
        self.sum(&format!("{name}_total"))
            .or_else(|| self.sum(name))
    }
}

fn clamp01(v: f64) -> f64 {
    if v.is_finite() {
        v.clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// Computes stats from one scrape. `baseline` is advanced only on success.
pub fn compute(
    samples: &[Sample],
    config: &ProfileConfig,
    baseline: &mut HitBaseline,
) -> Result<EngineStats, ProfileError> {
    let prefix = config.profile.prefix();
    if !samples.iter().any(|s| s.name.starts_with(prefix)) {
        return Err(ProfileError::WrongEngine(prefix));
    }
    let v = View {
        samples,
        model: config.model_name.as_deref(),
    };
    let (running, waiting) = match config.profile {
        Profile::Vllm => ("vllm:num_requests_running", "vllm:num_requests_waiting"),
        Profile::Sglang => ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
    };
    let running_v = v.sum(running).ok_or(ProfileError::MissingLoad(running))?;
    let waiting_v = v.sum(waiting).ok_or(ProfileError::MissingLoad(waiting))?;
    let load = running_v + waiting_v;
    let pressure = if config.max_concurrency_ceiling > 0.0 && load > 0.0 {
        clamp01(load / config.max_concurrency_ceiling)
    } else {
        0.0
    };
    let mut stats = EngineStats {
        pressure,
        ..EngineStats::default()
    };
    let usage = match config.profile {
        Profile::Vllm => {
            let kv = v.max("vllm:kv_cache_usage_perc");
            let gpu = v.max("vllm:gpu_cache_usage_perc");
            let cpu = v.max("vllm:cpu_cache_usage_perc");
            match config.cache_tier {
                CacheTierGauge::Auto => kv.or_else(|| match (gpu, cpu) {
                    (Some(g), Some(c)) => Some(g.max(c)),
                    (g, c) => g.or(c),
                }),
                CacheTierGauge::Kv => kv,
                CacheTierGauge::Gpu => gpu,
                CacheTierGauge::Cpu => cpu,
            }
        }
        Profile::Sglang => match config.cache_tier {
            CacheTierGauge::Auto | CacheTierGauge::Kv => v.max("sglang:token_usage"),
            CacheTierGauge::Gpu | CacheTierGauge::Cpu => None,
        },
    };
    stats.cache_memory_bytes =
        (clamp01(usage.unwrap_or(0.0)) * config.cache_size_bytes as f64) as i64;
    stats.load = EngineLoad {
        running: count(running_v),
        waiting: count(waiting_v),
        kv_usage: clamp01(usage.unwrap_or(0.0)),
        kv_capacity_tokens: capacity_tokens(samples, config.profile),
    };
    match config.profile {
        Profile::Vllm => {
            if let (Some(h), Some(q)) = (
                v.counter("vllm:prefix_cache_hits"),
                v.counter("vllm:prefix_cache_queries"),
            ) {
                if baseline.set {
                    let (dh, dq) = (h - baseline.hits, q - baseline.queries);
                    if dh >= 0.0 && dq > 0.0 {
                        stats.hit_rate = clamp01(dh / dq);
                    }
                }
                *baseline = HitBaseline {
                    hits: h,
                    queries: q,
                    set: true,
                };
            }
            stats.t2_hit_tokens =
                v.counter("vllm:external_prefix_cache_hits").unwrap_or(0.0) as i64;
            stats.t2_query_tokens = v
                .counter("vllm:external_prefix_cache_queries")
                .unwrap_or(0.0) as i64;
        }
        Profile::Sglang => {
            stats.hit_rate = clamp01(v.max("sglang:cache_hit_rate").unwrap_or(0.0));
        }
    }
    stats.client_version = detect_version(samples, config.profile);
    Ok(stats)
}

/// A request-count gauge as a count (non-finite or negative → 0).
fn count(v: f64) -> u32 {
    if v.is_finite() && v > 0.0 {
        v.round().min(f64::from(u32::MAX)) as u32
    } else {
        0
    }
}

/// The engine's KV cache capacity in tokens, 0 when it does not say. vLLM
/// exports its cache config as the labels of `vllm:cache_config_info`:
/// `kv_cache_size_tokens` is group-aware (right for hybrid models) where
/// the version has it, else `num_gpu_blocks × block_size`. SGLang exports
/// `sglang:max_total_num_tokens`. The info series carries no `model_name`,
/// so the model filter does not apply.
fn capacity_tokens(samples: &[Sample], profile: Profile) -> u64 {
    let label_u64 = |s: &Sample, k: &str| s.label(k).and_then(|v| v.parse::<u64>().ok());
    match profile {
        Profile::Vllm => samples
            .iter()
            .filter(|s| s.name == "vllm:cache_config_info")
            .find_map(|s| {
                label_u64(s, "kv_cache_size_tokens").or_else(|| {
                    Some(
                        label_u64(s, "num_gpu_blocks")?.saturating_mul(label_u64(s, "block_size")?),
                    )
                })
            })
            .unwrap_or(0),
        Profile::Sglang => samples
            .iter()
            .filter(|s| s.name == "sglang:max_total_num_tokens")
            .map(|s| s.value)
            .find(|v| v.is_finite() && *v > 0.0)
            .map_or(0, |v| v as u64),
    }
}

/// An engine version from an info-style series (`*_info{version="…"}`),
/// e.g. vLLM's `vllm:cache_config_info` carries none but some builds export
/// `vllm:version_info`/`sglang:version_info`; reported as `vllm/<version>`.
fn detect_version(samples: &[Sample], profile: Profile) -> String {
    let prefix = profile.prefix();
    samples
        .iter()
        .filter(|s| s.name.starts_with(prefix) && s.name.ends_with("_info"))
        .find_map(|s| s.label("version").filter(|v| !v.is_empty()))
        .map(|v| format!("{}/{v}", prefix.trim_end_matches(':')))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::exposition::parse;

    fn cfg(profile: Profile) -> ProfileConfig {
        ProfileConfig {
            profile,
            model_name: None,
            max_concurrency_ceiling: 256.0,
            cache_size_bytes: 1_000_000,
            cache_tier: CacheTierGauge::Auto,
        }
    }

    const VLLM: &str = "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.42\n\
        vllm:prefix_cache_hits_total{model_name=\"m\"} 25\n\
        vllm:prefix_cache_queries_total{model_name=\"m\"} 100\n\
        vllm:num_requests_running{model_name=\"m\"} 3\n\
        vllm:num_requests_waiting{model_name=\"m\"} 5\n\
        vllm:external_prefix_cache_hits_total{model_name=\"m\"} 750\n\
        vllm:external_prefix_cache_queries_total{model_name=\"m\"} 1000\n";

    #[test]
    fn vllm_profile_matches_the_reference_fixture() {
        let mut b = HitBaseline::default();
        let s = compute(&parse(VLLM).0, &cfg(Profile::Vllm), &mut b).unwrap();
        assert_eq!(s.pressure, 8.0 / 256.0);
        assert_eq!(s.cache_memory_bytes, 420_000);
        assert_eq!(s.hit_rate, 0.0, "first scrape only sets the baseline");
        assert_eq!((s.t2_hit_tokens, s.t2_query_tokens), (750, 1000));
        assert_eq!(
            s.load,
            EngineLoad {
                running: 3,
                waiting: 5,
                kv_usage: 0.42,
                kv_capacity_tokens: 0,
            }
        );
        let tick2 = VLLM
            .replace(
                "hits_total{model_name=\"m\"} 25",
                "hits_total{model_name=\"m\"} 95",
            )
            .replace(
                "queries_total{model_name=\"m\"} 100",
                "queries_total{model_name=\"m\"} 200",
            );
        let s = compute(&parse(&tick2).0, &cfg(Profile::Vllm), &mut b).unwrap();
        assert!((s.hit_rate - 0.70).abs() < 1e-9);
    }

    #[test]
    fn openmetrics_counters_without_total_suffix() {
        let body = "vllm:prefix_cache_hits 10\nvllm:prefix_cache_queries 20\n\
            vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n# EOF\n";
        let mut b = HitBaseline::default();
        compute(&parse(body).0, &cfg(Profile::Vllm), &mut b).unwrap();
        let body2 = body
            .replace("hits 10", "hits 20")
            .replace("queries 20", "queries 40");
        let s = compute(&parse(&body2).0, &cfg(Profile::Vllm), &mut b).unwrap();
        assert_eq!(s.hit_rate, 0.5);
    }

    #[test]
    fn sglang_profile_sums_ranks_and_skips_priority_series() {
        let body = "sglang:num_running_reqs{dp=\"0\"} 1\nsglang:num_running_reqs{dp=\"1\"} 2\n\
            sglang:num_running_reqs{priority=\"high\"} 99\nsglang:num_queue_reqs 5\n\
            sglang:token_usage 0.63\nsglang:cache_hit_rate 0.75\n\
            sglang:version_info{version=\"0.5.1\"} 1\n";
        let s = compute(
            &parse(body).0,
            &cfg(Profile::Sglang),
            &mut HitBaseline::default(),
        )
        .unwrap();
        assert_eq!(s.pressure, 8.0 / 256.0);
        assert_eq!(s.hit_rate, 0.75);
        assert_eq!(s.cache_memory_bytes, 630_000);
        assert_eq!(s.client_version, "sglang/0.5.1");
        assert_eq!((s.load.running, s.load.waiting), (3, 5));
        assert_eq!(s.load.kv_usage, 0.63);
        assert_eq!(s.load.kv_capacity_tokens, 0, "no max_total_num_tokens");
        let body = format!("{body}sglang:max_total_num_tokens 65536\n");
        let s = compute(
            &parse(&body).0,
            &cfg(Profile::Sglang),
            &mut HitBaseline::default(),
        )
        .unwrap();
        assert_eq!(s.load.kv_capacity_tokens, 65536);
    }

    #[test]
    fn vllm_capacity_from_cache_config_info_despite_the_model_filter() {
        let info = "vllm:cache_config_info{block_size=\"32\",engine=\"0\",\
            num_gpu_blocks=\"256\",kv_cache_size_tokens=\"None\"} 1.0\n";
        let mut c = cfg(Profile::Vllm);
        c.model_name = Some("m".into());
        let body = format!("{VLLM}{info}");
        let s = compute(&parse(&body).0, &c, &mut HitBaseline::default()).unwrap();
        assert_eq!(s.load.kv_capacity_tokens, 256 * 32, "blocks × block size");
        let body = body.replace("\"None\"", "\"4000\"");
        let s = compute(&parse(&body).0, &c, &mut HitBaseline::default()).unwrap();
        assert_eq!(s.load.kv_capacity_tokens, 4000, "the group-aware size wins");
        let body = VLLM.replace("} 3\n", "} -1\n").replace("} 5\n", "} 2.6\n");
        let s = compute(&parse(&body).0, &c, &mut HitBaseline::default()).unwrap();
        assert_eq!((s.load.running, s.load.waiting), (0, 3));
    }

    #[test]
    fn wrong_engine_and_missing_load_fail_without_moving_the_baseline() {
        let mut b = HitBaseline::default();
        assert_eq!(
            compute(
                &parse("process_cpu_seconds_total 1\n").0,
                &cfg(Profile::Vllm),
                &mut b
            ),
            Err(ProfileError::WrongEngine("vllm:"))
        );
        assert!(matches!(
            compute(
                &parse("vllm:prefix_cache_hits_total 3\n").0,
                &cfg(Profile::Vllm),
                &mut b
            ),
            Err(ProfileError::MissingLoad(_))
        ));
        assert_eq!(b, HitBaseline::default());
    }

    #[test]
    fn model_filter_excludes_unlabelled_and_other_models() {
        let body = "vllm:num_requests_running{model_name=\"primary\"} 2\n\
            vllm:num_requests_running{model_name=\"other\"} 50\n\
            vllm:num_requests_waiting{model_name=\"primary\"} 2\n\
            vllm:num_requests_waiting 7\n";
        let mut c = cfg(Profile::Vllm);
        c.model_name = Some("primary".into());
        let s = compute(&parse(body).0, &c, &mut HitBaseline::default()).unwrap();
        assert_eq!(s.pressure, 4.0 / 256.0);
    }
}

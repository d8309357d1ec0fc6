//! Server configuration: listen addresses, control-endpoint authentication and
//! TLS, validated once at startup so that a bad combination is refused before
//! anything binds.

use crate::error::ConfigError;
pub use crate::listen::{ListenAddr, TlsFiles};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

/// Default audience of the `/snapshot` and `/probe` TokenReviews.
pub const DEFAULT_CONTROLLER_AUDIENCE: &str = "inferencecache.io/controller";
/// Default audience of the `/policy` TokenReview.
pub const DEFAULT_POLICY_AUDIENCE: &str = "inferencecache.io/policy";
/// Default period of StreamMetrics samples.
pub const DEFAULT_METRICS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// Default engine block size used to fingerprint `token_ids` and `prompt_text`.
pub const DEFAULT_ENGINE_BLOCK_SIZE: u32 = 16;

/// How the control endpoints (`/snapshot`, `/policy`, `/probe`) authenticate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlAuth {
    /// Bearer tokens checked with a Kubernetes TokenReview.
    TokenReview {
        /// Expected username, e.g. `system:serviceaccount:ns:name`.
        allowed_sa: String,
        /// Audience of `/snapshot` and `/probe` reviews.
        controller_audience: String,
        /// Audience of `/policy` reviews.
        policy_audience: String,
    },
    /// `--insecure-disable-auth`: served without authentication.
    Disabled,
    /// Neither flag: served without authentication, loopback only.
    LoopbackOnly,
}

/// Raw authentication flags, exactly as given on the command line.
#[derive(Debug, Clone, Default)]
pub struct AuthFlags {
    /// `--allowed-controller-sa`.
    pub allowed_controller_sa: String,
    /// `--insecure-disable-auth`.
    pub insecure_disable_auth: bool,
    /// `--controller-audience`.
    pub controller_audience: String,
    /// `--policy-audience`.
    pub policy_audience: String,
}

impl AuthFlags {
    /// Applies the reference's rules (first failing rule wins), with one
    /// deliberate change: neither flag is not an error but loopback-only mode.
    pub fn validate(&self) -> Result<ControlAuth, ConfigError> {
        let sa = &self.allowed_controller_sa;
        if !sa.is_empty() && self.insecure_disable_auth {
            return Err(ConfigError::Auth(
                "--allowed-controller-sa and --insecure-disable-auth are mutually exclusive; pass one"
                    .into(),
            ));
        }
        if self.insecure_disable_auth {
            return Ok(ControlAuth::Disabled);
        }
        if sa.is_empty() {
            return Ok(ControlAuth::LoopbackOnly);
        }
        if sa.trim() != sa {
            return Err(ConfigError::Auth(format!(
                "--allowed-controller-sa has leading/trailing whitespace ({sa:?}); remove it"
            )));
        }
        check_audience("--controller-audience", &self.controller_audience)?;
        check_audience("--policy-audience", &self.policy_audience)?;
        Ok(ControlAuth::TokenReview {
            allowed_sa: sa.clone(),
            controller_audience: self.controller_audience.clone(),
            policy_audience: self.policy_audience.clone(),
        })
    }
}

fn check_audience(flag: &str, value: &str) -> Result<(), ConfigError> {
    if value.trim().is_empty() {
        return Err(ConfigError::Auth(format!(
            "{flag} cannot be empty or whitespace-only when --allowed-controller-sa is set; \
             leave it unset to use the default"
        )));
    }
    if value.trim() != value {
        return Err(ConfigError::Auth(format!(
            "{flag} has leading/trailing whitespace ({value:?}); remove it"
        )));
    }
    Ok(())
}

/// Resolves the control listener address under the chosen auth mode.
///
/// Without an auth flag the control endpoints are unauthenticated, so they are
/// only reachable from the pod itself: an all-interfaces address becomes
/// loopback (the caller logs a warning), and an explicit non-loopback address
/// is refused.
pub fn control_listen_addr(
    requested: ListenAddr,
    auth: &ControlAuth,
) -> Result<(ListenAddr, bool), ConfigError> {
    match auth {
        ControlAuth::LoopbackOnly if requested.is_unspecified() => {
            let ip = match requested.0.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            };
            Ok((ListenAddr(SocketAddr::new(ip, requested.0.port())), true))
        }
        ControlAuth::LoopbackOnly if !requested.is_loopback() => {
            Err(ConfigError::ControlNeedsAuth(requested.to_string()))
        }
        _ => Ok((requested, false)),
    }
}

/// Everything `serve` needs, already validated.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// gRPC listener (InferenceCache, health, reflection).
    pub grpc_addr: ListenAddr,
    /// Public HTTP listener (`/healthz`, `/readyz`, `/metrics`).
    pub http_addr: ListenAddr,
    /// Control HTTP listener (`/snapshot`, `/policy`, `/probe`).
    pub control_addr: ListenAddr,
    /// Control-endpoint authentication.
    pub control_auth: ControlAuth,
    /// gRPC TLS, if enabled.
    pub tls: Option<TlsFiles>,
    /// Block size used to fingerprint `token_ids` / `prompt_text`.
    pub engine_block_size: u32,
    /// Directory of tokenizers for `prompt_text`, if any.
    pub tokenizer_models_dir: Option<PathBuf>,
    /// Bytes of encoded `prompt_text` prefixes kept per model for reuse
    /// (`--tokenize-prefix-cache-bytes`; 0 disables the cache).
    pub tokenize_prefix_cache_bytes: usize,
    /// Policy file (YAML or JSON, the `/policy` schema), if any.
    pub policy_file: Option<PathBuf>,
    /// Directory of prompt templates (one YAML/JSON file each), if any.
    pub templates_dir: Option<PathBuf>,
    /// PD topology list (YAML or JSON), if any.
    pub pd_topology_file: Option<PathBuf>,
    /// Kubeconfig for TokenReview outside a cluster (else KUBECONFIG / in-cluster).
    pub kubeconfig: Option<PathBuf>,
    /// Index cap, TTL and sweep period.
    pub index: crate::core::IndexSettings,
    /// Period of StreamMetrics samples.
    pub stream_metrics_interval: std::time::Duration,
    /// Resource limits.
    pub limits: crate::limits::Limits,
    /// Bus mode (`--nats-url`): active-active replicas on one stream.
    pub bus: Option<crate::replicate::BusSettings>,
    /// Warm restarts (`--state-dir`).
    pub state: Option<crate::state::StateSettings>,
    /// Producer authorization, ingest limits and consumer auth (issue 19).
    pub producer: crate::producer::ProducerConfig,
}

impl ServerConfig {
    /// A config for tests and embedding: every listener on an ephemeral
    /// loopback port, auth disabled, plaintext.
    pub fn ephemeral() -> Self {
        let any = ListenAddr(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0));
        Self {
            grpc_addr: any,
            http_addr: any,
            control_addr: any,
            control_auth: ControlAuth::Disabled,
            tls: None,
            engine_block_size: DEFAULT_ENGINE_BLOCK_SIZE,
            tokenizer_models_dir: None,
            tokenize_prefix_cache_bytes: crate::tokenize::prefix::DEFAULT_BUDGET_BYTES,
            policy_file: None,
            templates_dir: None,
            pd_topology_file: None,
            kubeconfig: None,
            index: crate::core::IndexSettings::default(),
            stream_metrics_interval: DEFAULT_METRICS_INTERVAL,
            limits: crate::limits::Limits::default(),
            bus: None,
            state: None,
            producer: crate::producer::ProducerConfig::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(sa: &str, insecure: bool, ca: &str, pa: &str) -> AuthFlags {
        AuthFlags {
            allowed_controller_sa: sa.into(),
            insecure_disable_auth: insecure,
            controller_audience: ca.into(),
            policy_audience: pa.into(),
        }
    }

    fn err(f: AuthFlags) -> String {
        f.validate().expect_err("must be rejected").to_string()
    }

    const SA: &str = "system:serviceaccount:ns:ctrl";
    const CA: &str = DEFAULT_CONTROLLER_AUDIENCE;
    const PA: &str = DEFAULT_POLICY_AUDIENCE;

    #[test]
    fn auth_flag_matrix() {
        assert!(err(flags(SA, true, CA, PA)).contains("mutually exclusive"));
        assert_eq!(
            flags("", false, CA, PA).validate().ok(),
            Some(ControlAuth::LoopbackOnly)
        );
        assert_eq!(
            flags("", true, CA, PA).validate().ok(),
            Some(ControlAuth::Disabled)
        );
        assert!(err(flags(" sa", false, CA, PA)).contains("leading/trailing whitespace"));
        assert!(err(flags("sa\t", false, CA, PA)).contains("leading/trailing whitespace"));
        assert!(err(flags(SA, false, "", PA)).contains("--controller-audience cannot be empty"));
        assert!(err(flags(SA, false, "  ", PA)).contains("--controller-audience cannot be empty"));
        assert!(err(flags(SA, false, " a", PA)).contains("leading/trailing whitespace"));
        assert!(err(flags(SA, false, CA, "")).contains("--policy-audience cannot be empty"));
        assert!(err(flags(SA, false, CA, "a ")).contains("leading/trailing whitespace"));
        assert!(matches!(
            flags(SA, false, CA, PA).validate(),
            Ok(ControlAuth::TokenReview { .. })
        ));
        // Audiences are only checked when TokenReview is on.
        assert_eq!(
            flags("", true, "", "").validate().ok(),
            Some(ControlAuth::Disabled)
        );
    }

    #[test]
    fn first_failing_rule_wins() {
        // Whitespace SA and empty audience: the SA rule comes first.
        assert!(err(flags(" sa ", false, "", "")).contains("--allowed-controller-sa has"));
        // Both audiences bad: controller audience reported first.
        assert!(err(flags(SA, false, "", "")).contains("--controller-audience"));
    }

    #[test]
    fn listen_addresses_parse_go_forms() {
        let p = |s| ListenAddr::parse("--x", s);
        assert_eq!(
            p(":9090").ok().map(|a| a.to_string()),
            Some("0.0.0.0:9090".into())
        );
        assert_eq!(
            p("127.0.0.1:1").ok().map(|a| a.to_string()),
            Some("127.0.0.1:1".into())
        );
        assert_eq!(
            p("[::1]:80").ok().map(|a| a.to_string()),
            Some("[::1]:80".into())
        );
        assert_eq!(
            p("localhost:8").ok().map(|a| a.to_string()),
            Some("127.0.0.1:8".into())
        );
        for bad in ["9090", "host:9090", ":99999", ":", "1.2.3:4", ""] {
            let e = p(bad).expect_err(bad).to_string();
            assert!(e.contains("--x"), "{e}");
        }
    }

    #[test]
    fn control_listener_defaults_to_loopback_without_auth() {
        let all = ListenAddr::parse("--s", ":8081").expect("valid");
        let (addr, narrowed) =
            control_listen_addr(all, &ControlAuth::LoopbackOnly).expect("narrowed");
        assert!(narrowed);
        assert_eq!(addr.to_string(), "127.0.0.1:8081");

        let lo = ListenAddr::parse("--s", "127.0.0.2:8081").expect("valid");
        assert_eq!(
            control_listen_addr(lo, &ControlAuth::LoopbackOnly).ok(),
            Some((lo, false))
        );

        let pub_ip = ListenAddr::parse("--s", "10.1.2.3:8081").expect("valid");
        assert!(control_listen_addr(pub_ip, &ControlAuth::LoopbackOnly).is_err());
        assert_eq!(
            control_listen_addr(all, &ControlAuth::Disabled).ok(),
            Some((all, false))
        );
    }

    #[test]
    fn tls_flags_are_both_or_neither() {
        assert_eq!(TlsFiles::from_flags("", "", "").ok(), Some(None));
        assert!(TlsFiles::from_flags("c", "", "").is_err());
        assert!(TlsFiles::from_flags("", "k", "").is_err());
        assert!(matches!(TlsFiles::from_flags("c", "k", ""), Ok(Some(_))));
        assert!(matches!(
            TlsFiles::from_flags("", "", "ca"),
            Err(ConfigError::ClientCaWithoutTls)
        ));
        assert!(matches!(
            TlsFiles::from_flags("c", "k", "ca"),
            Ok(Some(TlsFiles {
                client_ca: Some(_),
                ..
            }))
        ));
    }
}

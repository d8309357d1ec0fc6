//! `inferencecache serve`: validate flags, bind, serve until SIGINT/SIGTERM.

use crate::args::ServeArgs;
use inferencecache_server::config::{
    AuthFlags, ControlAuth, DEFAULT_ENGINE_BLOCK_SIZE, ListenAddr, TlsFiles, control_listen_addr,
};
use inferencecache_server::{ConfigError, Server, ServerConfig};
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

use crate::runtime::{EXIT_FAILURE, EXIT_USAGE};

/// Runs the server; returns the process exit code.
pub(crate) fn run(args: ServeArgs) -> ExitCode {
    // The flag's env var would otherwise be ignored without a word.
    if std::env::var_os("INFERENCECACHE_INDEX_SLOT_TABLE").is_some() {
        eprintln!(
            "inferencecache serve: INFERENCECACHE_INDEX_SLOT_TABLE is set, but the slot table \
             was removed (the index has one storage engine, docs/decisions.md issue 35); unset it"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let config = match build_config(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("inferencecache serve: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime = match crate::runtime::multi_thread("serve", None) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match runtime.block_on(serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "serve_error");
            eprintln!("inferencecache serve: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

fn build_config(args: &ServeArgs) -> Result<ServerConfig, ConfigError> {
    let control_auth = AuthFlags {
        allowed_controller_sa: args.allowed_controller_sa.clone(),
        insecure_disable_auth: args.insecure_disable_auth,
        controller_audience: args.controller_audience.clone(),
        policy_audience: args.policy_audience.clone(),
    }
    .validate()?;
    let grpc_addr = ListenAddr::parse("--grpc-bind-address", &args.grpc_bind_address)?;
    let http_addr = ListenAddr::parse("--http-bind-address", &args.http_bind_address)?;
    let requested_control =
        ListenAddr::parse("--snapshot-bind-address", &args.snapshot_bind_address)?;
    let (control_addr, narrowed) = control_listen_addr(requested_control, &control_auth)?;
    if narrowed {
        tracing::warn!(
            requested = %requested_control,
            bound = %control_addr,
            reason = "neither --allowed-controller-sa nor --insecure-disable-auth is set",
            "controller_auth_disabled_loopback_only"
        );
    }
    let tls = TlsFiles::from_flags(
        &args.tls_cert_file,
        &args.tls_key_file,
        &args.tls_client_ca_file,
    )?;
    let producer = inferencecache_server::producer::ProducerConfig {
        auth: args.producer_auth,
        audience: args.producer_audience.clone(),
        tenants_file: args.producer_tenants_file.clone(),
        limits: inferencecache_server::producer::ratelimit::Limits {
            blocks_per_second: args.producer_max_blocks_per_second,
            burst_blocks: args.producer_burst_blocks,
            max_streams: args.producer_max_streams,
        },
        consumer_auth: args.consumer_auth,
        consumer_audience: args.consumer_audience.clone(),
        ..inferencecache_server::producer::ProducerConfig::default()
    };
    producer.validate(tls.as_ref())?;
    if let Some(warning) = producer.exposure_warning(&grpc_addr) {
        tracing::warn!(grpc_addr = %grpc_addr, warning = %warning, "producer_auth_disabled");
    }
    let engine_block_size = u32::try_from(args.engine_block_size)
        .ok()
        .filter(|&n| n > 0)
        .unwrap_or(DEFAULT_ENGINE_BLOCK_SIZE);
    let tokenizer_models_dir =
        (!args.tokenizer_models_dir.is_empty()).then(|| args.tokenizer_models_dir.clone().into());
    Ok(ServerConfig {
        grpc_addr,
        http_addr,
        control_addr,
        control_auth,
        tls,
        engine_block_size,
        tokenizer_models_dir,
        tokenize_prefix_cache_bytes: args.tokenize_prefix_cache_bytes,
        policy_file: args.policy_file.clone(),
        templates_dir: args.templates_dir.clone(),
        pd_topology_file: args.pd_topology_file.clone(),
        kubeconfig: args.kubeconfig.clone(),
        index: inferencecache_server::core::IndexSettings {
            max_entries: args.index_max_entries,
            default_ttl: args.index_ttl,
            sweep_interval: args.index_sweep_interval,
            ranking: args.ranking,
            max_replicas: args.index_max_replicas,
            producer_silence: (!args.producer_silence.is_zero()).then_some(args.producer_silence),
            eviction_foresight: !args.no_eviction_foresight,
        },
        stream_metrics_interval: args.stream_metrics_interval,
        limits: inferencecache_server::limits::Limits {
            max_id_bytes: args.max_id_bytes,
            max_hash_bytes: args.max_hash_bytes,
            accept_empty_replica_id: args.accept_empty_replica_id,
            max_grpc_message_bytes: args.max_grpc_message_bytes.max(1),
            tokenize_concurrency: args.tokenize_concurrency.max(1),
            tokenize_memory_budget: args.tokenize_memory_budget_bytes,
            http_header_timeout: args.http_header_timeout,
            http_body_timeout: args.http_body_timeout,
            lenient_policy_validation: args.lenient_policy_validation,
            ingest_lanes: args
                .ingest_lanes
                .unwrap_or_else(inferencecache_server::ingest_lane::default_lanes),
            grpc_write_coalescing: args.grpc_write_coalescing,
        },
        bus: args
            .bus
            .config(args.index_ttl.saturating_mul(2))
            .map_err(ConfigError::Bus)?
            .map(
                |(config, limits)| inferencecache_server::replicate::BusSettings {
                    replica_name: config.client_name.clone(),
                    config,
                    limits,
                    load_interval: args.bus_load_interval,
                },
            ),
        state: args.state.settings(),
        producer,
    })
}

fn log_auth_mode(auth: &ControlAuth) {
    match auth {
        ControlAuth::TokenReview {
            allowed_sa,
            controller_audience,
            policy_audience,
        } => tracing::info!(
            expected_sa = %allowed_sa,
            controller_audience = %controller_audience,
            policy_audience = %policy_audience,
            "controller_auth_enabled"
        ),
        ControlAuth::Disabled => tracing::warn!(
            reason = "--insecure-disable-auth",
            "controller_auth_disabled"
        ),
        ControlAuth::LoopbackOnly => tracing::warn!(
            reason = "no auth flag; control endpoints reachable from loopback only",
            "controller_auth_disabled"
        ),
    }
}

async fn serve(config: ServerConfig) -> anyhow::Result<()> {
    let shutdown = CancellationToken::new();
    // Before "listening": a signal sent the moment that line appears must
    // already mean "shut down gracefully".
    let stop = crate::signals::Stop::install()
        .map_err(|e| anyhow::anyhow!("cannot handle SIGINT/SIGTERM: {e}"))?;
    tokio::spawn(stop.forward(shutdown.clone()));

    log_auth_mode(&config.control_auth);
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        grpc_addr = %config.grpc_addr,
        grpc_tls = config.tls.is_some(),
        http_addr = %config.http_addr,
        snapshot_addr = %config.control_addr,
        engine_block_size = config.engine_block_size,
        "startup"
    );
    let server = Server::bind(&config).await?;
    // The bound addresses differ from the flags when a port is 0.
    tracing::info!(
        grpc_addr = %server.grpc_addr(),
        http_addr = %server.http_addr(),
        snapshot_addr = %server.control_addr(),
        "listening"
    );
    server.serve(shutdown).await?;
    Ok(())
}

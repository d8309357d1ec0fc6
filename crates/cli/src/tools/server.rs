//! What every gRPC tool shares: the `--server` flags, the runtime, the
//! connection and its error messages, and the exit codes.

use clap::Args;
use inferencecache_client::{Client, ClientConfig, ClientError, TlsOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The tool worked (for `lookup`: the server answered, whatever the hint).
pub(crate) const OK: u8 = 0;
/// The server could not be reached or the call failed.
pub(crate) const RUNTIME_ERROR: u8 = 1;
/// The flags are unusable.
pub(crate) const BAD_FLAGS: u8 = 2;

/// Where the server is and how to dial it.
#[derive(Debug, Args)]
pub(crate) struct ServerArgs {
    /// gRPC address of the server: http://HOST:PORT, https://HOST:PORT, or
    /// HOST:PORT (plaintext).
    #[arg(
        long,
        env = "INFERENCECACHE_SERVER",
        default_value = "http://127.0.0.1:9090"
    )]
    pub server: String,

    /// PEM CA that signed the server certificate (https:// servers).
    #[arg(long, value_name = "PATH")]
    pub tls_ca_file: Option<PathBuf>,

    /// PEM client certificate for servers that require mTLS (with --tls-key-file).
    #[arg(long, value_name = "PATH", requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// PEM private key of --tls-cert-file.
    #[arg(long, value_name = "PATH", requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,

    /// Name to verify the server certificate against, when it differs from
    /// the --server host (e.g. inference-cache.inference-cache-system.svc).
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
}

impl ServerArgs {
    /// The client configuration these flags describe.
    pub(crate) fn config(&self) -> ClientConfig {
        let mut config =
            ClientConfig::new(self.server.clone()).connect_timeout(Duration::from_secs(3));
        let any_tls = self.tls_ca_file.is_some()
            || self.tls_cert_file.is_some()
            || self.tls_server_name.is_some();
        if any_tls {
            config = config.tls(TlsOptions {
                ca_cert: self.tls_ca_file.clone(),
                client_cert: self.tls_cert_file.clone(),
                client_key: self.tls_key_file.clone(),
                domain: self.tls_server_name.clone(),
            });
        }
        config
    }

    /// Dials the server now, turning failures into advice.
    pub(crate) async fn connect(&self, config: ClientConfig) -> Result<Client, Failure> {
        Client::connect(config)
            .await
            .map_err(|e| Failure::from_client(&e, &self.server))
    }
}

/// A tool failure: the message to print and the exit code.
#[derive(Debug)]
pub(crate) struct Failure {
    /// What went wrong and what to do next.
    pub message: String,
    /// `RUNTIME_ERROR` or `BAD_FLAGS`.
    pub code: u8,
}

impl Failure {
    /// A runtime failure (exit 1).
    pub(crate) fn runtime(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: RUNTIME_ERROR,
        }
    }

    /// A flag problem (exit 2).
    pub(crate) fn flags(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: BAD_FLAGS,
        }
    }

    /// Explains a client error in terms of the tool's flags.
    pub(crate) fn from_client(err: &ClientError, server: &str) -> Self {
        match err {
            ClientError::InvalidEndpoint { .. } | ClientError::Tls(_) => {
                Self::flags(format!("{err} (check --server and the --tls-* flags)"))
            }
            e if e.is_unreachable() => Self::runtime(format!(
                "could not connect to {server} — is `inferencecache serve` running? \
                 pass --server or set INFERENCECACHE_SERVER ({err})"
            )),
            ClientError::DeadlineExceeded(d) => Self::runtime(format!(
                "{server} did not answer within {d:?} — the server may be overloaded or \
                 the address may point at something that is not an inference-cache server"
            )),
            _ => Self::runtime(format!("{server}: {err}")),
        }
    }

    /// Prints the message as `inferencecache TOOL: ...` and returns the code.
    pub(crate) fn report(self, tool: &str) -> ExitCode {
        eprintln!("inferencecache {tool}: {}", self.message);
        ExitCode::from(self.code)
    }
}

/// Runs `work` on a fresh current-thread runtime: the tools make a handful
/// of calls, so one thread is plenty.
pub(crate) fn block_on<F: Future<Output = Result<u8, Failure>>>(tool: &str, work: F) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return Failure::runtime(format!("cannot start the runtime: {e}")).report(tool),
    };
    match runtime.block_on(work) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => failure.report(tool),
    }
}

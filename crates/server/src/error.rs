//! Errors of the server crate. Configuration errors mean "fix your flags"
//! (exit 2); serve errors mean the environment refused us (exit 1).

use std::path::PathBuf;

/// A flag value or combination that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A listen address that is not `host:port`.
    #[error("{flag}: {value:?} is not a listen address; use HOST:PORT, :PORT or [IPV6]:PORT")]
    BadAddress {
        /// The flag that carried the value.
        flag: &'static str,
        /// The rejected value.
        value: String,
    },
    /// One of the authentication rules failed.
    #[error("{0}")]
    Auth(String),
    /// Non-loopback control listener without any auth flag.
    #[error(
        "--snapshot-bind-address {0} is not loopback, but no auth flag is set; \
         pass --allowed-controller-sa (TokenReview) or --insecure-disable-auth, or bind 127.0.0.1"
    )]
    ControlNeedsAuth(String),
    /// Only one of the two TLS flags.
    #[error("server: --tls-cert-file and --tls-key-file must both be set or both be empty")]
    HalfTls,
    /// Unusable `--nats-*` flags.
    #[error("{0}")]
    Bus(String),
    /// `--producer-auth mtls` without a client CA.
    #[error(
        "--producer-auth mtls needs --tls-client-ca-file (and --tls-cert-file/--tls-key-file): \
         the identity comes from the verified client certificate"
    )]
    ProducerMtlsWithoutClientCa,
    /// mTLS without server TLS.
    #[error(
        "--tls-client-ca-file needs --tls-cert-file and --tls-key-file (mTLS runs over server TLS)"
    )]
    ClientCaWithoutTls,
}

/// A failure while starting or running the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A listener could not bind.
    #[error(
        "cannot listen on {addr} ({what}): {source}; pick another {flag} or stop the process using it"
    )]
    Bind {
        /// Which listener.
        what: &'static str,
        /// The flag that sets its address.
        flag: &'static str,
        /// The address that was refused.
        addr: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A TLS file could not be read.
    #[error("read {what} {}: {source}", path.display())]
    TlsRead {
        /// "certificate" or "private key".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A TLS file was read but is unusable.
    #[error("TLS file {}: {message}", path.display())]
    TlsInvalid {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The state directory could not be read or created.
    #[error("{0}")]
    State(#[source] crate::state::StateError),
    /// The bus settings are unusable.
    #[error("{0}")]
    Bus(#[source] inferencecache_bus::BusError),
    /// The gRPC server stopped with an error.
    #[error("gRPC server: {0}")]
    Grpc(#[from] tonic::transport::Error),
    /// An HTTP listener stopped with an error.
    #[error("HTTP server ({what}): {source}")]
    Http {
        /// Which listener.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The Kubernetes client for TokenReview could not be built.
    #[error("{0}")]
    Kube(String),
    /// `--policy-file` could not be loaded at startup.
    #[error("policy file: {0}")]
    PolicyFile(String),
    /// `--templates-dir` could not be loaded at startup.
    #[error("templates dir: {0}")]
    TemplatesDir(String),
    /// `--pd-topology-file` could not be loaded at startup.
    #[error("pd topology file: {0}")]
    PdTopologyFile(String),
    /// Producer authorization could not be set up (issue 19).
    #[error("producer auth: {0}")]
    Producer(String),
    /// Reflection could not be built from the embedded descriptors.
    #[error("gRPC reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
}

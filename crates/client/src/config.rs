//! How to reach the server: endpoint, deadlines and TLS.

use std::path::PathBuf;
use std::time::Duration;

/// Default hard deadline of one `lookup_route`: a routing hint that arrives
/// later than this costs the request more than it can save.
pub const DEFAULT_LOOKUP_DEADLINE: Duration = Duration::from_millis(20);

/// Default bound on establishing a TCP (+TLS) connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Default bound on the non-lookup unary calls (`get_cache_state`,
/// `report_state`, `publish_event`), so a tool never hangs on a stalled peer.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Settings of a [`Client`](crate::Client).
///
/// ```
/// use inferencecache_client::ClientConfig;
/// use std::time::Duration;
/// let config = ClientConfig::new("127.0.0.1:9090") // no scheme means http
///     .lookup_deadline(Duration::from_millis(10));
/// assert_eq!(config.lookup_deadline, Duration::from_millis(10));
/// ```
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Server address: `http://host:port`, `https://host:port`, or bare
    /// `host:port` (plaintext, the server's default).
    pub endpoint: String,
    /// Hard deadline of one `lookup_route` unless the query sets its own.
    pub lookup_deadline: Duration,
    /// Bound on establishing a connection.
    pub connect_timeout: Duration,
    /// Bound on `get_cache_state`, `report_state` and `publish_event`.
    pub request_timeout: Duration,
    /// TLS settings; `None` for plaintext. An `https://` endpoint without
    /// them still uses TLS, but this build carries no system roots, so set
    /// [`TlsOptions::ca_cert`] to the CA that signed the server certificate.
    pub tls: Option<TlsOptions>,
}

impl ClientConfig {
    /// Defaults for `endpoint`: 20 ms lookups, 1 s connect, 10 s other calls,
    /// plaintext.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            lookup_deadline: DEFAULT_LOOKUP_DEADLINE,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            tls: None,
        }
    }

    /// Sets the default hard deadline of `lookup_route`.
    pub fn lookup_deadline(mut self, deadline: Duration) -> Self {
        self.lookup_deadline = deadline;
        self
    }

    /// Sets the connection timeout.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets the timeout of the non-lookup unary calls.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Dials with TLS.
    pub fn tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// TLS for the gRPC connection. Files are PEM and read once, when the client
/// is created.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// CA bundle that signed the server certificate.
    pub ca_cert: Option<PathBuf>,
    /// Client certificate chain, for servers that require mTLS (set with
    /// `client_key`).
    pub client_cert: Option<PathBuf>,
    /// Private key of `client_cert`.
    pub client_key: Option<PathBuf>,
    /// Name to verify the server certificate against, when it differs from
    /// the endpoint host (e.g. dialling an IP with a cert for the Service
    /// FQDN).
    pub domain: Option<String>,
}

impl TlsOptions {
    /// Verifies the server against `ca_cert`.
    pub fn with_ca(ca_cert: impl Into<PathBuf>) -> Self {
        Self {
            ca_cert: Some(ca_cert.into()),
            ..Self::default()
        }
    }

    /// Presents a client certificate (mTLS).
    pub fn identity(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some(cert.into());
        self.client_key = Some(key.into());
        self
    }

    /// Verifies the server certificate against `domain`.
    pub fn domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }
}

//! The gRPC channel to the policy server: plaintext or TLS (tonic's
//! `tls-ring`), optionally with a client certificate for mTLS.

use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::error::SidecarError;

/// TLS settings for the server connection.
#[derive(Debug, Clone, Default)]
pub struct ServerTls {
    /// `--server-tls-ca`: PEM bundle the server certificate must chain to.
    pub ca_file: PathBuf,
    /// `--server-tls-cert` / `--server-tls-key`: client identity for mTLS.
    pub client_identity: Option<(PathBuf, PathBuf)>,
    /// `--server-tls-server-name`: name to verify instead of the address host.
    pub server_name: Option<String>,
}

fn read(path: &PathBuf, what: &'static str) -> Result<Vec<u8>, SidecarError> {
    std::fs::read(path).map_err(|source| SidecarError::File {
        what,
        path: path.clone(),
        source,
    })
}

/// `--server` as a URI: `host:port` gets `http://` (or `https://` with TLS);
/// a value with a scheme is used as given.
pub fn server_uri(server: &str, tls: bool) -> String {
    if server.contains("://") {
        server.to_owned()
    } else {
        let scheme = if tls { "https" } else { "http" };
        format!("{scheme}://{server}")
    }
}

/// A lazily connecting channel: creating it never fails because the server
/// is down; the first RPC connects (and reconnects after a failure).
pub fn connect_lazy(
    server: &str,
    tls: Option<&ServerTls>,
    connect_timeout: Duration,
) -> Result<Channel, SidecarError> {
    let uri = server_uri(server, tls.is_some());
    let mut endpoint = Endpoint::from_shared(uri.clone())
        .map_err(|e| SidecarError::Server {
            server: server.to_owned(),
            reason: e.to_string(),
        })?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(10))
        .keep_alive_while_idle(true);
    if let Some(t) = tls {
        let mut cfg = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read(&t.ca_file, "--server-tls-ca")?));
        if let Some((cert, key)) = &t.client_identity {
            cfg = cfg.identity(Identity::from_pem(
                read(cert, "--server-tls-cert")?,
                read(key, "--server-tls-key")?,
            ));
        }
        if let Some(name) = &t.server_name {
            cfg = cfg.domain_name(name.clone());
        }
        endpoint = endpoint.tls_config(cfg).map_err(|e| SidecarError::Server {
            server: server.to_owned(),
            reason: format!("TLS: {e}"),
        })?;
    }
    Ok(endpoint.connect_lazy())
}

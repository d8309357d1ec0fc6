//! What a listener is given: its address (`host:port`, in the reference's Go
//! forms) and, for gRPC, its TLS files. Kept apart from `config` so that the
//! modules `config` assembles (the producer gate, TLS) can name them without
//! depending on the whole configuration.

use crate::error::ConfigError;
use std::net::SocketAddr;
use std::path::PathBuf;

/// A parsed `host:port` listen address.
///
/// Accepts the reference's Go forms: `:9090` (every interface), `0.0.0.0:9090`,
/// `127.0.0.1:9090`, `[::1]:9090` and `localhost:9090`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenAddr(pub SocketAddr);

impl ListenAddr {
    /// Parses a listen address (the forms every listener of the binary
    /// shares, `inferencecache_control_api::listen`); the error names them.
    pub fn parse(flag: &'static str, value: &str) -> Result<Self, ConfigError> {
        inferencecache_control_api::listen::parse_listen_addr(value)
            .map(Self)
            .map_err(|_| ConfigError::BadAddress {
                flag,
                value: value.to_owned(),
            })
    }

    /// True for `:PORT`, `0.0.0.0:PORT` and `[::]:PORT`.
    pub fn is_unspecified(&self) -> bool {
        self.0.ip().is_unspecified()
    }

    /// True for 127.0.0.0/8 and ::1.
    pub fn is_loopback(&self) -> bool {
        self.0.ip().is_loopback()
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// PEM files for gRPC TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
    /// CA whose client certificates are accepted (mTLS); `None` = no client auth.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// Both flags or neither: one alone is a configuration error. A client CA
    /// needs server TLS.
    pub fn from_flags(cert: &str, key: &str, client_ca: &str) -> Result<Option<Self>, ConfigError> {
        let client_ca = (!client_ca.is_empty()).then(|| PathBuf::from(client_ca));
        match (cert.is_empty(), key.is_empty()) {
            (true, true) if client_ca.is_some() => Err(ConfigError::ClientCaWithoutTls),
            (true, true) => Ok(None),
            (false, false) => Ok(Some(Self {
                cert: cert.into(),
                key: key.into(),
                client_ca,
            })),
            _ => Err(ConfigError::HalfTls),
        }
    }
}

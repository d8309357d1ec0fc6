//! The webhook listener's TLS: `tls.crt` / `tls.key` from a certificate
//! directory (cert-manager's Secret layout), reloaded when either file
//! changes. The check runs on each handshake (one `stat` pair), so a rotated
//! certificate is served from the next connection; a broken new pair is
//! logged and the last good one keeps serving.

use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

/// Why the certificate directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The PEM content is unusable.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
}

struct Loaded {
    stamp: Option<SystemTime>,
    key: Arc<CertifiedKey>,
}

/// Serves the directory's current certificate.
pub struct CertDir {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Loaded>,
}

impl std::fmt::Debug for CertDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertDir").field("cert", &self.cert).finish()
    }
}

fn stamp(files: &[&Path]) -> Option<SystemTime> {
    files
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max()
}

fn load(cert: &Path, key: &Path, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| TlsError::Read {
            path: p.to_owned(),
            source,
        })
    };
    let invalid = |p: &Path, message: String| TlsError::Invalid {
        path: p.to_owned(),
        message,
    };
    let (cert_pem, key_pem) = (read(cert)?, read(key)?);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(cert, format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(invalid(cert, "no CERTIFICATE block".into()));
    }
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| invalid(key, format!("not a PEM private key: {e}")))?;
    CertifiedKey::from_der(chain, key_der, provider)
        .map_err(|e| invalid(key, format!("key does not match the certificate: {e}")))
}

impl CertDir {
    /// Loads `dir/tls.crt` and `dir/tls.key`; fails if they are unusable now.
    pub fn open(dir: &Path) -> Result<Arc<Self>, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let s = stamp(&[&cert, &key]);
        let loaded = load(&cert, &key, &provider)?;
        Ok(Arc::new(Self {
            cert,
            key,
            provider,
            current: RwLock::new(Loaded {
                stamp: s,
                key: Arc::new(loaded),
            }),
        }))
    }

    fn current(&self) -> Option<Arc<CertifiedKey>> {
        let now = stamp(&[&self.cert, &self.key]);
        {
            let cur = self.current.read().ok()?;
            if cur.stamp == now {
                return Some(cur.key.clone());
            }
        }
        let mut cur = self.current.write().ok()?;
        if cur.stamp != now {
            match load(&self.cert, &self.key, &self.provider) {
                Ok(k) => {
                    tracing::info!(cert = %self.cert.display(), "webhook certificate reloaded");
                    cur.key = Arc::new(k);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "webhook certificate reload failed; keeping the previous one")
                }
            }
            cur.stamp = now;
        }
        Some(cur.key.clone())
    }

    /// A rustls server config serving this directory.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig, TlsError> {
        let mut cfg = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Invalid {
                path: self.cert.clone(),
                message: e.to_string(),
            })?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(cfg)
    }
}

impl ResolvesServerCert for CertDir {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

//! gRPC TLS (`server.md` §6, decision 8): rustls with TLS ≥ 1.2, a certificate
//! that is reloaded when its files change (checked on every handshake, so a
//! rotation is picked up by the next connection; a bad new pair is logged and
//! the last good one keeps serving), and optional mTLS against a client CA.

use crate::error::ServeError;
use crate::listen::TlsFiles;
use crate::write_coalesce::CoalescedWrites;
use futures::Stream;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// A handshake that takes longer is dropped.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn load_pair(
    cert: &Path,
    key: &Path,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, ServeError> {
    let read = |what: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| ServeError::TlsRead {
            what,
            path: path.to_owned(),
            source,
        })
    };
    let bad = |path: &Path, msg: String| ServeError::TlsInvalid {
        path: path.to_owned(),
        message: msg,
    };
    let cert_pem = read("certificate", cert)?;
    let key_pem = read("private key", key)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| bad(cert, format!("not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(bad(cert, "no CERTIFICATE block found".into()));
    }
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| bad(key, format!("not a PEM private key: {e}")))?;
    CertifiedKey::from_der(chain, key_der, provider).map_err(|e| {
        bad(
            key,
            format!("key does not match the certificate or is unsupported: {e}"),
        )
    })
}

fn newest_mtime(files: &[&Path]) -> Option<SystemTime> {
    files
        .iter()
        .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .max()
}

struct Loaded {
    stamp: Option<SystemTime>,
    key: Arc<CertifiedKey>,
}

/// Serves the current certificate, reloading it when either file's
/// modification time moves.
pub(crate) struct ReloadingCert {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Loaded>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Loads the pair once; failure here is a startup error.
    pub(crate) fn load(
        files: &TlsFiles,
        provider: Arc<CryptoProvider>,
    ) -> Result<Self, ServeError> {
        let stamp = newest_mtime(&[&files.cert, &files.key]);
        let key = load_pair(&files.cert, &files.key, &provider)?;
        Ok(Self {
            cert: files.cert.clone(),
            key: files.key.clone(),
            provider,
            current: RwLock::new(Loaded {
                stamp,
                key: Arc::new(key),
            }),
        })
    }

    fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(g) => Arc::clone(&g.key),
            Err(p) => Arc::clone(&p.into_inner().key),
        }
    }

    /// Reloads if the files changed since the last attempt. A failed reload
    /// remembers the new stamp, so it is retried only on the next change
    /// (e.g. when the key file of a rotation lands after the certificate).
    fn refresh(&self) {
        let stamp = newest_mtime(&[&self.cert, &self.key]);
        let seen = match self.current.read() {
            Ok(g) => g.stamp,
            Err(p) => p.into_inner().stamp,
        };
        if stamp.is_none() || stamp <= seen {
            return;
        }
        let mut guard = match self.current.write() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if stamp <= guard.stamp {
            return; // another handshake reloaded first
        }
        guard.stamp = stamp;
        match load_pair(&self.cert, &self.key, &self.provider) {
            Ok(key) => {
                guard.key = Arc::new(key);
                tracing::info!(cert_file = %self.cert.display(), "grpc_tls_reloaded");
            }
            Err(e) => tracing::error!(
                err = %e,
                cert_file = %self.cert.display(),
                effect = "keeping the last good certificate",
                "grpc_tls_reload"
            ),
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.refresh();
        Some(self.current())
    }
}

/// Builds the acceptor: TLS 1.2 and 1.3, ALPN h2, optional client-cert
/// verification against `files.client_ca`.
pub(crate) fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, ServeError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = Arc::new(ReloadingCert::load(files, Arc::clone(&provider))?);
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| ServeError::TlsInvalid {
            path: files.cert.clone(),
            message: e.to_string(),
        })?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let bad = |message: String| ServeError::TlsInvalid {
                path: ca.clone(),
                message,
            };
            let pem = std::fs::read(ca).map_err(|source| ServeError::TlsRead {
                what: "client CA",
                path: ca.clone(),
                source,
            })?;
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| bad(format!("not a PEM certificate: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| bad(format!("unusable CA certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(bad("no CERTIFICATE block found".into()));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| bad(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Accepts TCP connections and yields completed TLS streams. Handshakes run
/// concurrently, so one slow or hostile client cannot stall the listener;
/// failed handshakes (plaintext clients, untrusted client certs) are dropped.
pub(crate) fn incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    coalesce_writes: bool,
    stop: CancellationToken,
) -> impl Stream<Item = std::io::Result<TlsStream<CoalescedWrites<TcpStream>>>> {
    let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = stop.cancelled() => return,
                a = listener.accept() => a,
            };
            let (tcp, peer) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "grpc_accept_error");
                    continue;
                }
            };
            // Same reason as the plaintext listener: no Nagle delay on small responses.
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(%peer, error = %e, "grpc_set_nodelay_failed");
            }
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(
                    HANDSHAKE_TIMEOUT,
                    acceptor.accept(CoalescedWrites::new(tcp, coalesce_writes)),
                )
                .await
                {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "grpc_tls_handshake_failed"),
                    Err(_) => tracing::debug!(%peer, "grpc_tls_handshake_timeout"),
                }
            });
        }
    });
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

//! The HTTPS listener and the three admission handlers.

use super::inject::{self, Decision, InjectConfig};
use super::tls::{CertDir, TlsError};
use super::validate::{self, Op};
use crate::crd::{CacheBackend, CachePolicy, CacheTenant};
use crate::metrics::Metrics;
use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::routing::post;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// Largest admission review accepted (the apiserver caps objects at 3 MiB).
const MAX_REVIEW_BYTES: usize = 4 << 20;
/// A TLS handshake that takes longer is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the webhook listener could not start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// The certificate directory is unusable.
    #[error("webhook certificates: {0}")]
    Tls(#[from] TlsError),
    /// The address cannot be bound.
    #[error("bind webhook listener {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// What the handlers need.
#[derive(Clone)]
pub struct WebhookState {
    /// Lists sibling objects and CacheBackends.
    pub client: Client,
    /// Sidecar settings.
    pub inject: Arc<InjectConfig>,
    /// Review counters.
    pub metrics: Metrics,
}

/// A bound HTTPS listener.
pub struct WebhookServer {
    listener: TcpListener,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for WebhookServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookServer")
            .field("addr", &self.listener.local_addr().ok())
            .finish_non_exhaustive()
    }
}

impl WebhookServer {
    /// Loads the certificates from `cert_dir` and binds `addr`.
    pub async fn bind(addr: &str, cert_dir: &Path) -> Result<Self, WebhookError> {
        let certs = CertDir::open(cert_dir)?;
        let acceptor = TlsAcceptor::from(Arc::new(certs.server_config()?));
        let bind_err = |source| WebhookError::Bind {
            addr: addr.to_owned(),
            source,
        };
        // `:9443` (the default) is Go's "every interface".
        let parsed = inferencecache_control_api::listen::parse_listen_addr(addr)
            .map_err(|e| bind_err(e.into()))?;
        let listener = TcpListener::bind(parsed).await.map_err(bind_err)?;
        Ok(Self { listener, acceptor })
    }

    /// The bound address.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.local_addr().ok()
    }

    /// Serves until `shutdown`.
    pub async fn serve(self, state: WebhookState, shutdown: CancellationToken) {
        let app = Router::new()
            .route(super::VALIDATE_CACHEPOLICY, post(validate_policy))
            .route(super::VALIDATE_CACHETENANT, post(validate_tenant))
            .route(super::MUTATE_POD, post(mutate_pod))
            .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
            .with_state(state);
        let (tx, rx) = mpsc::channel(64);
        let addr = self.local_addr();
        let accept = tokio::spawn(accept_loop(
            self.listener,
            self.acceptor,
            tx,
            shutdown.clone(),
        ));
        let listener = TlsListener { rx, addr };
        let stop = shutdown.clone();
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
        {
            tracing::error!(error = %e, "webhook listener failed");
        }
        accept.abort();
    }
}

/// Accepts TCP connections and hands each handshake its own task, so a
/// slow client cannot stall the others.
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    shutdown: CancellationToken,
) {
    loop {
        let (tcp, peer) = tokio::select! {
            () = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "webhook accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (acceptor, tx) = (acceptor.clone(), tx.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => tracing::debug!(error = %e, %peer, "webhook TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "webhook TLS handshake timed out"),
            }
        });
    }
}

struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: Option<SocketAddr>,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop ended (shutdown): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.addr
            .ok_or_else(|| std::io::Error::other("webhook listener has no address"))
    }
}

type Review = Json<AdmissionReview<DynamicObject>>;

/// Decodes a review; the error is the response to send.
// Built once per request and sent at once: boxing it buys nothing.
#[allow(clippy::result_large_err)]
fn decode<T: Resource + DeserializeOwned>(
    body: &[u8],
) -> Result<AdmissionRequest<T>, AdmissionResponse> {
    let review: AdmissionReview<T> = serde_json::from_slice(body)
        .map_err(|e| AdmissionResponse::invalid(format!("decode AdmissionReview: {e}")))?;
    review
        .try_into()
        .map_err(|_| AdmissionResponse::invalid("AdmissionReview has no request"))
}

fn op(o: &Operation) -> Option<Op> {
    match o {
        Operation::Create => Some(Op::Create),
        Operation::Update => Some(Op::Update),
        _ => None,
    }
}

async fn siblings<K>(client: &Client, ns: &str) -> Result<Vec<K>, kube::Error>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    Ok(api.list(&ListParams::default()).await?.items)
}

fn respond(state: &WebhookState, webhook: &str, resp: AdmissionResponse) -> Review {
    let result = if resp.allowed {
        if resp.patch.is_some() {
            "patched"
        } else {
            "allowed"
        }
    } else {
        "denied"
    };
    state.metrics.review(webhook, result);
    Json(resp.into_review())
}

async fn validate_policy(State(state): State<WebhookState>, body: Bytes) -> Review {
    let req = match decode::<CachePolicy>(&body) {
        Ok(r) => r,
        Err(resp) => return respond(&state, "cachepolicy", resp),
    };
    let resp = AdmissionResponse::from(&req);
    let (Some(o), Some(new)) = (op(&req.operation), req.object.as_ref()) else {
        return respond(&state, "cachepolicy", resp);
    };
    let ns = req.namespace.clone().unwrap_or_default();
    let others = if o == Op::Create {
        match siblings::<CachePolicy>(&state.client, &ns).await {
            Ok(v) => v,
            Err(e) => {
                return respond(
                    &state,
                    "cachepolicy",
                    resp.deny(format!("cannot list CachePolicies in {ns:?}: {e}")),
                );
            }
        }
    } else {
        Vec::new()
    };
    let resp = match validate::cache_policy(o, new, req.old_object.as_ref(), &others) {
        Some(msg) => resp.deny(msg),
        None => resp,
    };
    respond(&state, "cachepolicy", resp)
}

async fn validate_tenant(State(state): State<WebhookState>, body: Bytes) -> Review {
    let req = match decode::<CacheTenant>(&body) {
        Ok(r) => r,
        Err(resp) => return respond(&state, "cachetenant", resp),
    };
    let resp = AdmissionResponse::from(&req);
    let (Some(o), Some(new)) = (op(&req.operation), req.object.as_ref()) else {
        return respond(&state, "cachetenant", resp);
    };
    let ns = req.namespace.clone().unwrap_or_default();
    let others = match siblings::<CacheTenant>(&state.client, &ns).await {
        Ok(v) => v,
        Err(e) => {
            return respond(
                &state,
                "cachetenant",
                resp.deny(format!("cannot list CacheTenants in {ns:?}: {e}")),
            );
        }
    };
    let resp = match validate::cache_tenant(o, new, req.old_object.as_ref(), &others) {
        Some(msg) => resp.deny(msg),
        None => resp,
    };
    respond(&state, "cachetenant", resp)
}

async fn mutate_pod(State(state): State<WebhookState>, body: Bytes) -> Review {
    let req = match decode::<Pod>(&body) {
        Ok(r) => r,
        Err(resp) => return respond(&state, "pod", resp),
    };
    let resp = AdmissionResponse::from(&req);
    let Some(pod) = req
        .object
        .as_ref()
        .filter(|_| req.operation == Operation::Create)
    else {
        return respond(&state, "pod", resp);
    };
    let ns = req.namespace.clone().unwrap_or_default();
    let backends = match siblings::<CacheBackend>(&state.client, &ns).await {
        Ok(v) => v,
        Err(e) => {
            // Fail open: an engine pod without a sidecar still serves.
            tracing::warn!(error = %e, namespace = %ns, "pod webhook cannot list CacheBackends; admitting unchanged");
            state.metrics.review("pod", "error");
            return Json(resp.into_review());
        }
    };
    let name = pod
        .metadata
        .name
        .clone()
        .or_else(|| pod.metadata.generate_name.clone())
        .unwrap_or_default();
    match inject::decide(&state.inject, pod, &backends) {
        Decision::Skip(reason) => {
            tracing::debug!(namespace = %ns, pod = %name, reason, "pod not injected");
            respond(&state, "pod", resp)
        }
        Decision::Deny(msg) => respond(&state, "pod", resp.deny(msg)),
        Decision::Mutate(new) => {
            let (Ok(before), Ok(after)) = (serde_json::to_value(pod), serde_json::to_value(&new))
            else {
                state.metrics.review("pod", "error");
                return Json(resp.into_review());
            };
            let patch = json_patch::diff(&before, &after);
            match resp.clone().with_patch(patch) {
                Ok(r) => {
                    tracing::info!(namespace = %ns, pod = %name, "injected the kvevent-subscriber sidecar");
                    respond(&state, "pod", r)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pod webhook cannot encode its patch; admitting unchanged");
                    state.metrics.review("pod", "error");
                    Json(resp.into_review())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::selfsigned::{Bundle, Lifetimes};

    fn cert_dir() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ic-webhook-bind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let b = Bundle::issue(
            &["svc.ns.svc".to_owned()],
            std::time::SystemTime::now(),
            Lifetimes::default(),
        )
        .unwrap();
        std::fs::write(dir.join("tls.crt"), b.tls_crt).unwrap();
        std::fs::write(dir.join("tls.key"), b.tls_key).unwrap();
        dir
    }

    #[tokio::test]
    async fn the_webhook_listener_accepts_the_go_port_form() {
        let dir = cert_dir();
        // `:PORT` (the flag's default form) binds every interface.
        let server = WebhookServer::bind(":0", &dir).await.unwrap();
        let addr = server.local_addr().unwrap();
        assert!(addr.ip().is_unspecified(), "{addr}");
        assert_ne!(addr.port(), 0);
        let lo = WebhookServer::bind("127.0.0.1:0", &dir).await.unwrap();
        assert!(lo.local_addr().unwrap().ip().is_loopback());
        let err = WebhookServer::bind("webhook:9443", &dir).await.unwrap_err();
        assert!(err.to_string().contains(":PORT"), "{err}");
        let _ = std::fs::remove_dir_all(dir);
    }
}

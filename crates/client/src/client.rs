//! The connection and the calls. One `Client` per process is enough: it
//! wraps a multiplexed HTTP/2 channel and clones share it.

use crate::config::{ClientConfig, TlsOptions};
use crate::error::{ClientError, chain};
use crate::hint::{Hint, NoHintReason, RouteHint};
use crate::query::RouteQuery;
use futures::{Stream, StreamExt};
use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::{
    Ack, CacheEvent, CacheStateUpdate, GetCacheStateRequest, GetCacheStateResponse,
    LookupRouteRequest, LookupRouteResponse, StreamEventsRequest,
};
use std::time::{Duration, Instant};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// A handle to one inference-cache server. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    inner: InferenceCacheClient<Channel>,
    lookup_deadline: Duration,
    request_timeout: Duration,
}

impl Client {
    /// Creates a client without dialling: the connection is made on first
    /// use and re-made after failures, so an unreachable server only turns
    /// lookups into `NoHint(Unavailable)`. Fails only on a malformed endpoint,
    /// unreadable TLS files, or when called outside a tokio runtime.
    pub fn connect_lazy(config: ClientConfig) -> Result<Client, ClientError> {
        // tonic spawns the channel's worker task here; without a runtime
        // that would panic, so say so instead.
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ClientError::NoRuntime);
        }
        let endpoint = endpoint(&config)?;
        Ok(Self::from_channel(endpoint.connect_lazy(), &config))
    }

    /// Creates a client and dials now, so a wrong address or a stopped server
    /// is reported here (for tools) rather than as a `NoHint` later.
    pub async fn connect(config: ClientConfig) -> Result<Client, ClientError> {
        let endpoint = endpoint(&config)?;
        let channel = endpoint.connect().await.map_err(|e| ClientError::Connect {
            endpoint: config.endpoint.clone(),
            cause: chain(&e),
        })?;
        Ok(Self::from_channel(channel, &config))
    }

    /// Wraps an existing channel (e.g. one shared with other services).
    pub fn from_channel(channel: Channel, config: &ClientConfig) -> Client {
        Self {
            // Token-id lookups of long prompts exceed gRPC's 4 MiB default;
            // the server accepts up to 1 Mi tokens.
            inner: InferenceCacheClient::new(channel)
                .max_encoding_message_size(16 << 20)
                .max_decoding_message_size(16 << 20),
            lookup_deadline: config.lookup_deadline,
            request_timeout: config.request_timeout,
        }
    }

    /// Asks where to route `query`. Never fails and never waits past the
    /// deadline (`query.deadline`, else the configured `lookup_deadline`):
    /// every error, timeout, empty answer or unknown reason code comes back
    /// as [`Hint::NoHint`], so the caller can always just route. With
    /// [`RouteQuery::shadow`] set it asks without delivering.
    pub async fn lookup_route(&self, query: &RouteQuery) -> RouteHint {
        let deadline = query.deadline.unwrap_or(self.lookup_deadline);
        let started = Instant::now();
        let request = query.to_request();
        // Building the request copies the prompt (milliseconds for a huge
        // token list): the RPC gets what is left of the deadline.
        let remaining = deadline.saturating_sub(started.elapsed());
        let result = self.lookup_raw(request, remaining, query.shadow).await;
        let latency = started.elapsed();
        match result {
            Ok(response) => RouteHint {
                hint: Hint::from_response(&response),
                latency,
                server_latency_us: response.lookup_latency_us,
                token_ids: response.token_ids,
            },
            Err(err) => RouteHint {
                hint: Hint::NoHint(no_hint_reason(&err, latency, deadline)),
                latency,
                server_latency_us: 0,
                token_ids: Vec::new(),
            },
        }
    }

    /// One LookupRoute with a hard `deadline`, returning the raw response or
    /// the failure (for tools and tests; gateways want `lookup_route`).
    pub async fn lookup_route_raw(
        &self,
        req: LookupRouteRequest,
        deadline: Duration,
    ) -> Result<LookupRouteResponse, ClientError> {
        self.lookup_raw(req, deadline, false).await
    }

    /// [`Self::lookup_route_raw`] as a shadow lookup (the
    /// `x-inferencecache-shadow: true` metadata): the same answer, but the
    /// server records no delivery, for a check that will not send the
    /// request (a probe, a dashboard). A server without shadow lookups
    /// answers it as a lookup.
    pub async fn shadow_lookup_raw(
        &self,
        req: LookupRouteRequest,
        deadline: Duration,
    ) -> Result<LookupRouteResponse, ClientError> {
        self.lookup_raw(req, deadline, true).await
    }

    async fn lookup_raw(
        &self,
        req: LookupRouteRequest,
        deadline: Duration,
        shadow: bool,
    ) -> Result<LookupRouteResponse, ClientError> {
        if deadline.is_zero() {
            return Err(ClientError::DeadlineExceeded(deadline));
        }
        let mut request = tonic::Request::new(req);
        if shadow {
            request.metadata_mut().insert(
                "x-inferencecache-shadow",
                tonic::metadata::MetadataValue::from_static("true"),
            );
        }
        // The header lets the server give up (and answer TIMEOUT) in time;
        // the local timeout is what bounds us if the peer never answers.
        request.set_timeout(deadline);
        let mut client = self.inner.clone();
        match tokio::time::timeout(deadline, client.lookup_route(request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(ClientError::Status(status)),
            Err(_) => Err(ClientError::DeadlineExceeded(deadline)),
        }
    }

    /// Aggregate cache state of `tenant`/`model` (GetCacheState).
    pub async fn get_cache_state(
        &self,
        tenant: &str,
        model: &str,
    ) -> Result<GetCacheStateResponse, ClientError> {
        let req = GetCacheStateRequest {
            model_id: model.to_owned(),
            tenant_id: tenant.to_owned(),
        };
        let mut client = self.inner.clone();
        let call = client.get_cache_state(self.timed(req));
        Ok(self.bounded(call).await?.into_inner())
    }

    /// Reports cache state as a producer: one ReportCacheState stream
    /// carrying `updates`, closed after the last one.
    pub async fn report_state(&self, updates: Vec<CacheStateUpdate>) -> Result<Ack, ClientError> {
        let mut client = self.inner.clone();
        let call = client.report_cache_state(self.timed(futures::stream::iter(updates)));
        Ok(self.bounded(call).await?.into_inner())
    }

    /// Publishes one cache event (e.g. an eviction) as a producer.
    pub async fn publish_event(&self, event: CacheEvent) -> Result<Ack, ClientError> {
        let mut client = self.inner.clone();
        let call = client.publish_event(self.timed(event));
        Ok(self.bounded(call).await?.into_inner())
    }

    /// Follows index changes (StreamCacheEvents) until the server closes the
    /// stream or the returned stream is dropped. No deadline: a watch lives
    /// as long as the caller wants.
    pub async fn watch(
        &self,
        req: StreamEventsRequest,
    ) -> Result<
        impl Stream<Item = Result<CacheEvent, ClientError>> + Send + Unpin + 'static,
        ClientError,
    > {
        let mut client = self.inner.clone();
        // Only opening the stream is bounded; the events themselves are not.
        let stream = self
            .bounded(client.stream_cache_events(req))
            .await?
            .into_inner();
        Ok(stream.map(|item| item.map_err(ClientError::Status)))
    }

    /// The generated tonic client on the same channel, for calls this SDK
    /// does not wrap (RenderTemplate, LookupPDRoute, StreamMetrics).
    pub fn raw(&self) -> InferenceCacheClient<Channel> {
        self.inner.clone()
    }

    /// Default lookup deadline of this client.
    pub fn lookup_deadline(&self) -> Duration {
        self.lookup_deadline
    }

    fn timed<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.request_timeout);
        request
    }

    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, ClientError> {
        match tokio::time::timeout(self.request_timeout, call).await {
            Ok(result) => result.map_err(ClientError::Status),
            Err(_) => Err(ClientError::DeadlineExceeded(self.request_timeout)),
        }
    }
}

/// Maps a failed lookup to its no-hint reason.
fn no_hint_reason(err: &ClientError, elapsed: Duration, deadline: Duration) -> NoHintReason {
    match err {
        ClientError::DeadlineExceeded(_) => NoHintReason::DeadlineExceeded,
        ClientError::Status(status) => match status.code() {
            tonic::Code::DeadlineExceeded => NoHintReason::DeadlineExceeded,
            // tonic reports its own grpc-timeout expiry as CANCELLED.
            tonic::Code::Cancelled if elapsed >= deadline => NoHintReason::DeadlineExceeded,
            tonic::Code::Unavailable => NoHintReason::Unavailable,
            // A connection that broke under the call (e.g. a TLS 1.3 server
            // rejecting the client certificate after the handshake) surfaces
            // as UNKNOWN with a transport error inside: still "unreachable".
            _ if is_transport_failure(status) => NoHintReason::Unavailable,
            _ => NoHintReason::Error(err.to_string()),
        },
        ClientError::Connect { .. } => NoHintReason::Unavailable,
        other => NoHintReason::Error(other.to_string()),
    }
}

/// True when the status wraps a transport (connection) error rather than
/// an answer from the server.
fn is_transport_failure(status: &tonic::Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(c) = cause {
        if c.is::<tonic::transport::Error>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// Normalizes the endpoint and applies timeouts and TLS.
fn endpoint(config: &ClientConfig) -> Result<Endpoint, ClientError> {
    let raw = config.endpoint.trim();
    let invalid = |reason: String| ClientError::InvalidEndpoint {
        endpoint: config.endpoint.clone(),
        reason,
    };
    if raw.is_empty() {
        return Err(invalid("it is empty".into()));
    }
    // Bare host:port is plaintext, the server's default listener.
    let uri = if raw.contains("://") {
        raw.to_owned()
    } else {
        format!("http://{raw}")
    };
    let https = uri.starts_with("https://");
    if !https && !uri.starts_with("http://") {
        return Err(invalid("the scheme must be http or https".into()));
    }
    let mut endpoint = Endpoint::from_shared(uri.clone()).map_err(|e| invalid(chain(&e)))?;
    match endpoint.uri().host() {
        Some(h) if !h.is_empty() => {}
        _ => return Err(invalid("it has no host".into())),
    }
    endpoint = endpoint
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        // Keep an idle gateway's connection warm so the first lookup after a
        // quiet spell does not pay a reconnect inside its deadline.
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    if https || config.tls.is_some() {
        if !https {
            return Err(invalid(
                "TLS options were given for an http:// endpoint; use https://".into(),
            ));
        }
        let tls = tls_config(config.tls.as_ref())?;
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| ClientError::Tls(chain(&e)))?;
    }
    Ok(endpoint)
}

fn tls_config(options: Option<&TlsOptions>) -> Result<ClientTlsConfig, ClientError> {
    let mut tls = ClientTlsConfig::new();
    let Some(options) = options else {
        return Ok(tls);
    };
    let read = |path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| ClientError::Tls(format!("cannot read {}: {e}", path.display())))
    };
    if let Some(ca) = &options.ca_cert {
        tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
    }
    match (&options.client_cert, &options.client_key) {
        (Some(cert), Some(key)) => {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        (None, None) => {}
        _ => {
            return Err(ClientError::Tls(
                "a client certificate needs both the cert and the key file".into(),
            ));
        }
    }
    if let Some(domain) = &options.domain {
        tls = tls.domain_name(domain.clone());
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_normalized_or_refused() {
        let ok = |s: &str| endpoint(&ClientConfig::new(s)).map(|e| e.uri().to_string());
        assert_eq!(
            ok("127.0.0.1:9090").ok().as_deref(),
            Some("http://127.0.0.1:9090/")
        );
        assert!(ok("http://h:1").is_ok());
        assert!(ok("https://h:1").is_ok());
        for bad in ["", "ftp://h:1", "http://", "not a uri"] {
            assert!(
                matches!(ok(bad), Err(ClientError::InvalidEndpoint { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn tls_needs_https_and_readable_files() {
        let c = ClientConfig::new("http://h:1").tls(TlsOptions::default());
        assert!(matches!(
            endpoint(&c),
            Err(ClientError::InvalidEndpoint { .. })
        ));
        let c = ClientConfig::new("https://h:1").tls(TlsOptions::with_ca("/no/such/ca.pem"));
        let err = endpoint(&c).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("/no/such/ca.pem"), "{err}");
    }

    #[test]
    fn connect_lazy_outside_a_runtime_is_an_error_not_a_panic() {
        assert!(matches!(
            Client::connect_lazy(ClientConfig::new("127.0.0.1:1")),
            Err(ClientError::NoRuntime)
        ));
    }
}

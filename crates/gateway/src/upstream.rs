//! The HTTP clients towards the engines, and which failures are a pooled
//! connection gone stale.
//!
//! Requests go out on kept-alive connections. An engine closes an idle one
//! on its own timer (vLLM's uvicorn after 5 s, `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`);
//! a request written to a connection as the engine closes it fails before
//! any response byte (hyper: "connection closed before message completed",
//! or a reset). hyper-util already resends a request it had not started
//! writing; one it had written surfaces as an error. The engine read none of
//! it (uvicorn closes only a connection with no request in progress), so
//! the proxy sends it once more on a connection opened for it
//! ([`Upstream::fresh`], no pool: not another stale one), and counts that.
//! Idle connections are also dropped before the engine's timeout
//! ([`Upstream::new`]'s idle timeout), which makes the race rare; the
//! retry makes it harmless.

use std::error::Error as StdError;
use std::time::Duration;

/// The clients requests are forwarded with.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Kept-alive connections (every first attempt).
    pub pooled: reqwest::Client,
    /// A new connection per request: the one resend after a stale pooled
    /// connection.
    pub fresh: reqwest::Client,
}

impl Upstream {
    /// Both clients; pooled connections idle out after `idle`.
    pub fn new(connect_timeout: Duration, idle: Duration) -> reqwest::Result<Self> {
        let base = || {
            reqwest::Client::builder()
                .connect_timeout(connect_timeout)
                .tcp_nodelay(true)
        };
        Ok(Self {
            pooled: base().pool_idle_timeout(idle).build()?,
            fresh: base().pool_max_idle_per_host(0).build()?,
        })
    }
}

/// Whether a request failed because its connection was closed under it
/// before any response byte: an incomplete or cancelled HTTP exchange, or
/// the socket reset / closed while writing or waiting for the head. A
/// refused connect or a timeout is not this (the engine is down or slow:
/// the next engine is tried instead).
pub fn closed_before_response(e: &reqwest::Error) -> bool {
    if e.is_connect() || e.is_timeout() || e.is_body() || e.is_decode() {
        return false;
    }
    let mut source: Option<&(dyn StdError + 'static)> = e.source();
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<hyper::Error>() {
            if h.is_incomplete_message() || h.is_canceled() {
                return true;
            }
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::{
                BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof,
            };
            if matches!(
                io.kind(),
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof
            ) {
                return true;
            }
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server that answers its first request on a connection and closes
    /// the connection when the next one arrives, without a byte: what an
    /// engine whose keep-alive timer fired as the request came does.
    async fn closes_second_request() -> String {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = 0;
                    loop {
                        let n = s.read(&mut buf).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        seen += 1;
                        if seen > 1 {
                            return; // drop: closed under the request
                        }
                        s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                            .await
                            .unwrap();
                    }
                });
            }
        });
        format!("http://{addr}/")
    }

    #[tokio::test]
    async fn a_connection_closed_under_a_written_request_is_told_apart() {
        let url = closes_second_request().await;
        let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(60)).unwrap();
        let first = up.pooled.post(&url).body("a").send().await.unwrap();
        assert_eq!(first.text().await.unwrap(), "ok");
        let e = up.pooled.post(&url).body("b").send().await.unwrap_err();
        assert!(closed_before_response(&e), "{e:?}");
        // The resend on a fresh connection is answered.
        let again = up.fresh.post(&url).body("b").send().await.unwrap();
        assert_eq!(again.text().await.unwrap(), "ok");
    }

    #[tokio::test]
    async fn a_refused_connection_is_not_stale() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let up = Upstream::new(Duration::from_secs(1), Duration::from_secs(60)).unwrap();
        let e = up
            .pooled
            .get(format!("http://{addr}/"))
            .send()
            .await
            .unwrap_err();
        assert!(e.is_connect());
        assert!(!closed_before_response(&e));
    }
}

//! Whether this replica can reach the server, for `/readyz`.
//!
//! Every replica (leader or standby) opens a TCP connection to the server's
//! control address (the host and port of `--server-policy-url`) every few
//! seconds: a replica that cannot resolve or connect to the server is not
//! ready, and `/readyz` says why. A TCP connect, not a push, so standbys are
//! judged too and an authorization error (the server answered) still counts
//! as reachable. This is what makes a cluster without DNS for Services, or a
//! NetworkPolicy that blocks the control port, visible as "0/1 ready"
//! instead of a quiet stream of failed pushes.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often reachability is re-checked.
pub const PERIOD: Duration = Duration::from_secs(5);
/// How long one connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The last check's outcome.
#[derive(Debug, Clone, Default)]
pub struct Reach {
    state: Arc<Mutex<Option<Result<(), String>>>>,
}

impl Reach {
    /// `Ok` when the last check connected; otherwise why not (also before
    /// the first check).
    pub fn status(&self) -> Result<(), String> {
        match self.state.lock().ok().and_then(|s| s.clone()) {
            Some(r) => r,
            None => Err("the server has not been checked yet".into()),
        }
    }

    fn set(&self, r: Result<(), String>) {
        if let Ok(mut s) = self.state.lock() {
            let was_ok = matches!(*s, Some(Ok(())));
            match (&r, was_ok) {
                (Ok(()), false) => tracing::info!("server reachable; ready"),
                (Err(e), true) => tracing::warn!(error = %e, "server unreachable; not ready"),
                _ => {}
            }
            *s = Some(r);
        }
    }
}

/// `host:port` of an http(s) URL (the port defaulted by scheme).
pub fn authority(url: &str) -> Result<String, String> {
    let u = reqwest::Url::parse(url).map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let host = u.host_str().ok_or_else(|| format!("{url:?} has no host"))?;
    let port = u
        .port_or_known_default()
        .ok_or_else(|| format!("{url:?} has no port"))?;
    Ok(if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// One check: resolve and connect.
pub async fn check(target: &str) -> Result<(), String> {
    match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(target)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("cannot connect to the server at {target}: {e}")),
        Err(_) => Err(format!(
            "connecting to the server at {target} timed out after {CONNECT_TIMEOUT:?}"
        )),
    }
}

/// Checks `url`'s server every `period` until `shutdown`.
pub async fn run(reach: Reach, url: String, period: Duration, shutdown: CancellationToken) {
    let target = match authority(&url) {
        Ok(t) => t,
        Err(e) => {
            reach.set(Err(format!("--server-policy-url: {e}")));
            return;
        }
    };
    loop {
        reach.set(check(&target).await);
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_default_their_port() {
        assert_eq!(
            authority("http://srv.ns.svc:8081/policy").unwrap(),
            "srv.ns.svc:8081"
        );
        assert_eq!(authority("https://srv/policy").unwrap(), "srv:443");
        assert_eq!(authority("http://[::1]:9/x").unwrap(), "[::1]:9");
        assert!(authority("not a url").is_err());
    }

    #[tokio::test]
    async fn ready_follows_whether_the_server_accepts_connections() {
        let reach = Reach::default();
        assert!(reach.status().is_err(), "not ready before the first check");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(
            reach.clone(),
            format!("http://{addr}/policy"),
            Duration::from_millis(20),
            stop.clone(),
        ));
        let until = |want_ok: bool| {
            let reach = reach.clone();
            async move {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
                while reach.status().is_ok() != want_ok {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "{:?}",
                        reach.status()
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        };
        until(true).await;
        drop(listener);
        until(false).await;
        let why = reach.status().unwrap_err();
        assert!(why.contains(&addr.to_string()), "{why}");
        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn an_unresolvable_server_is_not_ready_with_the_reason() {
        let why = check("inference-cache-server.nowhere.invalid:8081")
            .await
            .unwrap_err();
        assert!(why.contains("nowhere.invalid"), "{why}");
    }
}

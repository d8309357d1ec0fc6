//! One long-lived `ReportCacheState` client stream: a bounded channel feeding
//! the request body, and a task awaiting the server's `Ack`.

use std::time::Duration;

use inferencecache_proto::v1alpha1::{Ack, CacheStateUpdate};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::SendFailed;
use super::link::ServerLink;

fn failed_with(reason: String) -> SendFailed {
    SendFailed::new("ReportCacheState", reason)
}

pub(super) struct ReportStream {
    /// `None` once closed: dropping the sender ends the request stream.
    tx: Option<mpsc::Sender<CacheStateUpdate>>,
    ack: JoinHandle<Result<Ack, tonic::Status>>,
}

impl ReportStream {
    pub(super) fn open(link: &ServerLink, buffer: usize) -> Self {
        let (tx, rx) = mpsc::channel(buffer.max(1));
        let ack = tokio::spawn(link.report_cache_state(rx));
        Self { tx: Some(tx), ack }
    }

    /// Queues one message; waits at most `timeout` for buffer space (a
    /// server that stops reading must not stall the event path forever).
    pub(super) async fn send(
        &self,
        msg: CacheStateUpdate,
        timeout: Duration,
    ) -> Result<(), SendFailed> {
        let Some(tx) = &self.tx else {
            return Err(failed_with("stream closed".into()));
        };
        match tokio::time::timeout(timeout, tx.send(msg)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(failed_with("stream closed".into())),
            Err(_) => Err(failed_with("send buffer full (server not reading)".into())),
        }
    }

    /// Ends the request stream and waits for the `Ack`.
    pub(super) async fn close(mut self, timeout: Duration) -> Result<(), SendFailed> {
        self.tx = None;
        match tokio::time::timeout(timeout, &mut self.ack).await {
            Ok(Ok(Ok(a))) if a.accepted => Ok(()),
            Ok(Ok(Ok(a))) => Err(failed_with(format!("not accepted ({})", a.reason_code))),
            Ok(Ok(Err(s))) => Err(SendFailed::status("ReportCacheState", &s)),
            Ok(Err(e)) => Err(failed_with(format!("stream task: {e}"))),
            Err(_) => Err(failed_with("no Ack in time".into())),
        }
    }
}

impl Drop for ReportStream {
    fn drop(&mut self) {
        // A stream dropped without close (failure, shutdown) must not leave
        // its task running.
        self.ack.abort();
    }
}

/// Resolves when the open stream ended on its own (the server answered or
/// the connection broke while requests could still be sent); never resolves
/// without a stream.
pub(super) async fn failed(stream: &mut Option<ReportStream>) -> SendFailed {
    match stream {
        Some(s) => match (&mut s.ack).await {
            Ok(Ok(_)) => failed_with("server ended the stream".into()),
            Ok(Err(status)) => SendFailed::status("ReportCacheState", &status),
            Err(e) => failed_with(format!("stream task: {e}")),
        },
        None => std::future::pending().await,
    }
}

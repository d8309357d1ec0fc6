//! One long-lived `ReportCacheState` client stream: a bounded channel feeding
//! the request body, and a task awaiting the server's `Ack`.

use std::time::Duration;

use inferencecache_proto::v1alpha1::inference_cache_client::InferenceCacheClient;
use inferencecache_proto::v1alpha1::{Ack, CacheStateUpdate};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

pub(super) struct ReportStream {
    /// `None` once closed: dropping the sender ends the request stream.
    tx: Option<mpsc::Sender<CacheStateUpdate>>,
    ack: JoinHandle<Result<Ack, tonic::Status>>,
}

impl ReportStream {
    pub(super) fn open(client: &InferenceCacheClient<Channel>, buffer: usize) -> Self {
        let (tx, rx) = mpsc::channel(buffer.max(1));
        let mut client = client.clone();
        let ack = tokio::spawn(async move {
            client
                .report_cache_state(ReceiverStream::new(rx))
                .await
                .map(tonic::Response::into_inner)
        });
        Self { tx: Some(tx), ack }
    }

    /// Queues one message; waits at most `timeout` for buffer space (a
    /// server that stops reading must not stall the event path forever).
    pub(super) async fn send(
        &self,
        msg: CacheStateUpdate,
        timeout: Duration,
    ) -> Result<(), String> {
        let Some(tx) = &self.tx else {
            return Err("stream closed".into());
        };
        match tokio::time::timeout(timeout, tx.send(msg)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err("stream closed".into()),
            Err(_) => Err("send buffer full (server not reading)".into()),
        }
    }

    /// Ends the request stream and waits for the `Ack`.
    pub(super) async fn close(mut self, timeout: Duration) -> Result<(), String> {
        self.tx = None;
        match tokio::time::timeout(timeout, &mut self.ack).await {
            Ok(Ok(Ok(a))) if a.accepted => Ok(()),
            Ok(Ok(Ok(a))) => Err(format!("not accepted ({})", a.reason_code)),
            Ok(Ok(Err(s))) => Err(format!("{}: {}", s.code(), s.message())),
            Ok(Err(e)) => Err(format!("stream task: {e}")),
            Err(_) => Err("no Ack in time".into()),
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
pub(super) async fn failed(stream: &mut Option<ReportStream>) -> String {
    match stream {
        Some(s) => match (&mut s.ack).await {
            Ok(Ok(_)) => "server ended the stream".into(),
            Ok(Err(status)) => format!("{}: {}", status.code(), status.message()),
            Err(e) => format!("stream task: {e}"),
        },
        None => std::future::pending().await,
    }
}

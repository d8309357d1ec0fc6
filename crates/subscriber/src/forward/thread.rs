//! The event loop on a thread of its own, with a single-threaded runtime.
//!
//! Every `PublishEvent` passes through three tasks on the client side: the
//! event loop, tonic's channel buffer worker and the HTTP/2 connection. On
//! the process's multi-threaded runtime these hops land on different
//! workers, so each call costs futex wake-ups and its own small `writev`.
//! With the three on one thread the hops are plain queue pushes: on a
//! 2-vCPU VM the client CPU per unary call halves (~29 → ~14 µs, against a
//! server in another process), and a full cache's churn is one call per
//! evicted block (BENCHMARKS.md, "Churn"). The transports and the
//! HTTP endpoints stay on the caller's runtime; they talk to the loop over
//! channels that work across runtimes.

use std::sync::Arc;

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::{ForwardConfig, Inputs, run};
use crate::error::SidecarError;
use crate::metrics::SidecarMetrics;

/// Starts [`run`] on a new thread; the receiver gets its result (or is
/// dropped if the thread panicked).
pub fn spawn(
    config: ForwardConfig,
    inputs: Inputs,
    metrics: Arc<SidecarMetrics>,
    cancel: CancellationToken,
) -> Result<oneshot::Receiver<Result<(), SidecarError>>, SidecarError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SidecarError::Task(format!("forwarder runtime: {e}")))?;
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("ic-forward".into())
        .spawn(move || {
            let result = runtime.block_on(run(config, inputs, metrics, cancel));
            let _ = tx.send(result);
        })
        .map_err(|e| SidecarError::Task(format!("forwarder thread: {e}")))?;
    Ok(rx)
}

//! One socket write per scheduler round on a gRPC connection, not one per
//! response.
//!
//! Profiled under load (BENCHMARKS.md, "LookupRoute over the wire"), a third of
//! the server's CPU went to loopback `writev` calls carrying a single unary
//! response each. The cause is the runtime's scheduling, not h2: hyper runs
//! every HTTP/2 stream as its own task, a finished stream wakes the connection
//! task, and tokio runs a task woken by the running task next (its LIFO slot).
//! So the connection task writes and flushes each response as soon as it is
//! ready, while the other streams' responses are one task away.
//!
//! [`CoalescedWrites`] makes the connection task yield once before it writes:
//! the first write of a round wakes the task itself and returns `Pending`. A
//! task that wakes itself goes to the back of the run queue (tokio treats it as
//! a yield), so the stream tasks already queued run first, and the next poll
//! writes every response they produced in one `writev`. h2 keeps its frames in
//! its own buffer meanwhile, so no byte is copied here. The round ends at the
//! next successful flush. When nothing else is queued the task is polled again
//! at once, so an idle connection pays one extra poll, not a timer.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// An I/O stream whose writes wait for one yield per flush (module docs).
#[derive(Debug)]
pub(crate) struct CoalescedWrites<T> {
    inner: T,
    /// The current round has yielded; writes go through until the next flush.
    /// Starts (and stays) true when coalescing is off.
    yielded: bool,
    enabled: bool,
}

impl<T> CoalescedWrites<T> {
    /// Wraps `inner`; with `enabled` false every call goes straight through
    /// (`--grpc-write-coalescing false`).
    pub(crate) fn new(inner: T, enabled: bool) -> Self {
        Self {
            inner,
            yielded: !enabled,
            enabled,
        }
    }

    /// Yields once per round: `Ready` when the write may go through now.
    fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CoalescedWrites<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CoalescedWrites<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_turn(cx));
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_turn(cx));
        Pin::new(&mut this.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let flushed = ready!(Pin::new(&mut this.inner).poll_flush(cx));
        this.yielded = !this.enabled;
        Poll::Ready(flushed)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<T: Connected> Connected for CoalescedWrites<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_pass_through_in_order_with_one_yield_per_flush() {
        let (a, mut b) = tokio::io::duplex(1 << 16);
        let mut w = CoalescedWrites::new(a, true);
        // The first write of a round yields once (observed as a pending poll).
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut w).poll_write(&mut cx, b"ab").is_pending());
        w.write_all(b"abc").await.unwrap();
        w.write_all(b"def").await.unwrap();
        w.flush().await.unwrap();
        // A new round yields again.
        assert!(Pin::new(&mut w).poll_write(&mut cx, b"x").is_pending());
        w.write_all(b"gh").await.unwrap();
        w.shutdown().await.unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"abcdefgh");
    }
}

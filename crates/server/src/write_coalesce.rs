//! One socket write per scheduler round on a gRPC connection, not one per
//! response.
//!
//! Profiled under load (BENCHMARKS.md, "LookupRoute over the wire"), a third of
//! the server's CPU went to loopback `writev` calls carrying a single unary
//! response each. Two things cause it:
//!
//! - The runtime's scheduling: hyper runs every HTTP/2 stream as its own task,
//!   a finished stream wakes the connection task, and tokio runs a task woken
//!   by the running task next (its LIFO slot). So the connection task writes
//!   each response as soon as it is ready, while the other streams' responses
//!   are one task away.
//! - h2's frame buffer: a DATA frame of 256 bytes or more is not copied into
//!   h2's 16 KiB buffer but chained behind it, and h2 must write and flush the
//!   buffer and that frame before it takes the next frame. Every response over
//!   256 bytes (LookupRoute with more than a few replicas: ~30 bytes per
//!   score, 1.9 KB at 64) is one `writev` and one flush of its own, however
//!   many responses are ready (issue 36: 1.08 writes per LookupRoute at 64
//!   replicas, 0.06 per health Check).
//!
//! [`CoalescedWrites`] therefore keeps what is written in a buffer of its own
//! and defers the flush. A flush with bytes buffered wakes the task and
//! returns `Ready` without writing; h2 goes on taking frames (every response
//! ready in this round lands in the buffer), and the task, woken, goes to the
//! back of the run queue (tokio treats a self-wake as a yield), so the stream
//! tasks already queued run first. The buffer is written, in one `writev`, at
//! the first flush after a read found nothing: h2 reads until the socket has
//! nothing, then writes what its streams answered and flushes, on every poll
//! of its connection, so the bytes deferred in one poll leave at the end of
//! the next poll's reads together with that poll's first responses (two
//! polls' responses a write: 0.06 writes per health Check at 16 streams a
//! connection, where writing at the next read made it 0.16). A read that
//! finds nothing twice without a flush between writes there: a caller that
//! waits on its peer without flushing (a TLS handshake reads again after its
//! flush) cannot strand the bytes its peer waits for. A shutdown writes the
//! buffer first. Every deferral wakes the task again, and after
//! [`MAX_DEFERRALS`] of them without a write a flush writes for real, so a
//! caller that flushes without reading cannot strand bytes either. Past
//! [`MAX_BUFFERED`] bytes a write waits for the socket (back-pressure as
//! before). When nothing else is queued the task is polled again at once, so
//! an idle connection pays one extra poll, not a timer.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::Connected;

/// Bytes buffered before a write waits for the socket.
const MAX_BUFFERED: usize = 256 * 1024;
/// Buffer capacity kept across rounds; a larger one (a burst of large
/// responses) is released once written, so an idle connection holds little.
const KEEP_CAPACITY: usize = 64 * 1024;
/// Deferred flushes without a write before a flush writes anyway.
const MAX_DEFERRALS: u32 = 64;

/// An I/O stream whose writes leave once per round (module docs).
#[derive(Debug)]
pub(crate) struct CoalescedWrites<T> {
    inner: T,
    /// Bytes accepted and not yet written; `buf[written..]` is left.
    buf: Vec<u8>,
    written: usize,
    /// Flushes answered without writing since the buffer was last written.
    deferrals: u32,
    /// A read found nothing while bytes were buffered, and no flush has
    /// written them since: the next flush writes, and so does a second
    /// such read (module docs).
    read_idle: bool,
    enabled: bool,
}

impl<T> CoalescedWrites<T> {
    /// Wraps `inner`; with `enabled` false every call goes straight through
    /// (`--grpc-write-coalescing false`).
    pub(crate) fn new(inner: T, enabled: bool) -> Self {
        Self {
            inner,
            buf: Vec::new(),
            written: 0,
            deferrals: 0,
            read_idle: false,
            enabled,
        }
    }

    fn buffered(&self) -> usize {
        self.buf.len() - self.written
    }
}

impl<T: AsyncWrite + Unpin> CoalescedWrites<T> {
    /// Writes the whole buffer; `Pending` while the socket is full.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        while self.written < self.buf.len() {
            // One slice, written vectored: a `writev`, as h2's own writes
            // were (so `/proc/PID/io` counts it; tokio's plain write is a
            // `send`, which it does not).
            let left = [IoSlice::new(&self.buf[self.written..])];
            let n = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, &left))?;
            if n == 0 {
                return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf.clear();
        self.written = 0;
        self.deferrals = 0;
        self.read_idle = false;
        if self.buf.capacity() > KEEP_CAPACITY {
            self.buf = Vec::new();
        }
        Poll::Ready(Ok(()))
    }

    /// Room for more: `Pending` while past [`MAX_BUFFERED`] and the socket
    /// is full.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        if self.buffered() >= MAX_BUFFERED {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for CoalescedWrites<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let read = Pin::new(&mut this.inner).poll_read(cx, buf);
        if read.is_pending() && this.buffered() > 0 {
            if this.read_idle {
                // The second read to find nothing without a flush between:
                // the caller waits on its peer (module docs). A full socket
                // does not hold up the read: what is left goes at the next
                // flush, and the socket's write readiness wakes the task.
                if let Poll::Ready(Err(e)) = this.poll_drain(cx) {
                    return Poll::Ready(Err(e));
                }
            } else {
                this.read_idle = true;
            }
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CoalescedWrites<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if !this.enabled {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        ready!(this.poll_room(cx))?;
        this.buf.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if !this.enabled {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        ready!(this.poll_room(cx))?;
        let n: usize = bufs.iter().map(|b| b.len()).sum();
        this.buf.reserve(n);
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        // Vectored writes are copied into the buffer, so h2 may chain its
        // large frames rather than copy them itself.
        self.enabled || self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.enabled && this.buffered() > 0 {
            if !this.read_idle && this.deferrals < MAX_DEFERRALS {
                this.deferrals += 1;
                cx.waker().wake_by_ref();
                return Poll::Ready(Ok(()));
            }
            ready!(this.poll_drain(cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
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
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::{Wake, Waker};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Counts its wakes.
    #[derive(Default)]
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A sink that records each write call, accepting at most `limit`
    /// bytes in all (then `Pending`), and reads nothing.
    #[derive(Default)]
    struct Sink {
        writes: Vec<Vec<u8>>,
        limit: Option<usize>,
    }

    impl Sink {
        fn bytes(&self) -> Vec<u8> {
            self.writes.concat()
        }
    }

    impl AsyncWrite for Sink {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            let this = self.get_mut();
            let taken: usize = this.writes.iter().map(Vec::len).sum();
            let n = match this.limit {
                Some(l) if taken >= l => return Poll::Pending,
                Some(l) => buf.len().min(l - taken),
                None => buf.len(),
            };
            this.writes.push(buf[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncRead for Sink {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            Poll::Pending
        }
    }

    fn write(w: &mut CoalescedWrites<Sink>, cx: &mut Context<'_>, bytes: &[u8]) {
        let slices = [IoSlice::new(&bytes[..1]), IoSlice::new(&bytes[1..])];
        match Pin::new(&mut *w).poll_write_vectored(cx, &slices) {
            Poll::Ready(Ok(n)) => assert_eq!(n, bytes.len()),
            other => panic!("write: {other:?}"),
        }
    }

    fn flush(w: &mut CoalescedWrites<Sink>, cx: &mut Context<'_>) {
        assert!(matches!(
            Pin::new(&mut *w).poll_flush(cx),
            Poll::Ready(Ok(()))
        ));
    }

    fn read(w: &mut CoalescedWrites<Sink>, cx: &mut Context<'_>) {
        let mut space = [0u8; 8];
        let mut buf = ReadBuf::new(&mut space);
        assert!(Pin::new(&mut *w).poll_read(cx, &mut buf).is_pending());
    }

    /// What h2 does with responses over 256 bytes: write, flush, write,
    /// flush, ... in one poll. They leave at the first flush after the next
    /// poll's reads found nothing, with that poll's first response.
    #[test]
    fn a_rounds_responses_leave_at_the_first_flush_after_an_empty_read() {
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let mut w = CoalescedWrites::new(Sink::default(), true);
        let responses: Vec<Vec<u8>> = (0..16u8).map(|i| vec![i; 2000]).collect();
        for r in &responses {
            write(&mut w, &mut cx, r);
            flush(&mut w, &mut cx);
        }
        assert!(
            w.inner.writes.is_empty(),
            "nothing written within the round"
        );
        assert_eq!(wakes.0.load(Ordering::Relaxed), 16, "each deferral wakes");
        // The next poll: its reads find nothing, then it answers and flushes.
        read(&mut w, &mut cx);
        assert!(w.inner.writes.is_empty(), "an empty read does not write");
        write(&mut w, &mut cx, b"next");
        flush(&mut w, &mut cx);
        assert_eq!(w.inner.writes.len(), 1);
        let mut want = responses.concat();
        want.extend_from_slice(b"next");
        assert_eq!(w.inner.bytes(), want);
        // Nothing buffered: a flush goes straight through, without a wake.
        flush(&mut w, &mut cx);
        assert_eq!(wakes.0.load(Ordering::Relaxed), 16);
        assert_eq!(w.inner.writes.len(), 1);
        // The rest of that poll's responses wait for the poll after it.
        write(&mut w, &mut cx, b"later");
        flush(&mut w, &mut cx);
        assert_eq!(w.inner.writes.len(), 1);
        read(&mut w, &mut cx);
        flush(&mut w, &mut cx);
        assert_eq!(w.inner.writes.len(), 2);
        assert_eq!(w.inner.writes[1], b"later");
    }

    /// Small responses (h2 buffers them and flushes once a poll): one write
    /// carries two polls' responses.
    #[test]
    fn small_responses_leave_once_every_two_polls() {
        let waker = Waker::from(Arc::new(Wakes::default()));
        let mut cx = Context::from_waker(&waker);
        let mut w = CoalescedWrites::new(Sink::default(), true);
        for poll in 0..8u8 {
            read(&mut w, &mut cx);
            write(&mut w, &mut cx, &[poll; 120]);
            flush(&mut w, &mut cx);
        }
        assert_eq!(w.inner.writes.len(), 4);
        assert!(w.inner.writes.iter().all(|x| x.len() == 240));
    }

    /// A TLS handshake writes its flight, flushes and reads; its peer sends
    /// nothing until the flight arrives. The second empty read writes it.
    #[test]
    fn a_second_empty_read_without_a_flush_writes() {
        let waker = Waker::from(Arc::new(Wakes::default()));
        let mut cx = Context::from_waker(&waker);
        let mut w = CoalescedWrites::new(Sink::default(), true);
        write(&mut w, &mut cx, b"server hello");
        flush(&mut w, &mut cx);
        read(&mut w, &mut cx);
        assert!(w.inner.writes.is_empty());
        read(&mut w, &mut cx);
        assert_eq!(w.inner.bytes(), b"server hello");
    }

    /// A caller that flushes and never reads still gets its bytes out.
    #[test]
    fn flushes_without_a_read_write_after_a_bounded_number_of_deferrals() {
        let waker = Waker::from(Arc::new(Wakes::default()));
        let mut cx = Context::from_waker(&waker);
        let mut w = CoalescedWrites::new(Sink::default(), true);
        write(&mut w, &mut cx, b"hello");
        for _ in 0..MAX_DEFERRALS {
            flush(&mut w, &mut cx);
            assert!(w.inner.writes.is_empty());
        }
        flush(&mut w, &mut cx);
        assert_eq!(w.inner.bytes(), b"hello");
    }

    #[test]
    fn a_shutdown_writes_the_buffer_first() {
        let waker = Waker::from(Arc::new(Wakes::default()));
        let mut cx = Context::from_waker(&waker);
        let mut w = CoalescedWrites::new(Sink::default(), true);
        write(&mut w, &mut cx, b"goaway");
        flush(&mut w, &mut cx);
        assert!(Pin::new(&mut w).poll_shutdown(&mut cx).is_ready());
        assert_eq!(w.inner.bytes(), b"goaway");
    }

    /// Past the bound a write waits for the socket; a full socket does not
    /// hold up a read.
    #[test]
    fn a_full_socket_pushes_back_on_writes_past_the_bound() {
        let waker = Waker::from(Arc::new(Wakes::default()));
        let mut cx = Context::from_waker(&waker);
        let mut w = CoalescedWrites::new(
            Sink {
                limit: Some(1000),
                ..Sink::default()
            },
            true,
        );
        let big = vec![7u8; MAX_BUFFERED + 1000];
        write(&mut w, &mut cx, &big);
        read(&mut w, &mut cx);
        read(&mut w, &mut cx);
        assert_eq!(w.inner.bytes().len(), 1000);
        assert!(Pin::new(&mut w).poll_write(&mut cx, b"x").is_pending());
        w.inner.limit = None;
        assert!(Pin::new(&mut w).poll_write(&mut cx, b"x").is_ready());
        assert!(Pin::new(&mut w).poll_shutdown(&mut cx).is_ready());
        let mut want = big;
        want.push(b'x');
        assert_eq!(w.inner.bytes(), want);
    }

    #[test]
    fn disabled_writes_go_straight_through() {
        let waker = Waker::from(Arc::new(Wakes::default()));
        let mut cx = Context::from_waker(&waker);
        let mut w = CoalescedWrites::new(Sink::default(), false);
        assert!(matches!(
            Pin::new(&mut w).poll_write(&mut cx, b"ab"),
            Poll::Ready(Ok(2))
        ));
        assert_eq!(w.inner.bytes(), b"ab");
        flush(&mut w, &mut cx);
        assert_eq!(w.inner.writes.len(), 1);
    }

    #[tokio::test]
    async fn bytes_pass_through_in_order() {
        let (a, mut b) = tokio::io::duplex(1 << 16);
        let mut w = CoalescedWrites::new(a, true);
        w.write_all(b"abc").await.unwrap();
        w.flush().await.unwrap();
        w.write_all(b"def").await.unwrap();
        w.flush().await.unwrap();
        w.write_all(b"gh").await.unwrap();
        w.shutdown().await.unwrap();
        let mut got = Vec::new();
        b.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"abcdefgh");
    }
}

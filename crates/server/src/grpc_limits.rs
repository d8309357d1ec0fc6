//! Request-size limit for the gRPC listener, answered with gRPC's status for
//! it: `RESOURCE_EXHAUSTED` (tonic's own check says `OUT_OF_RANGE`).
//!
//! A tower layer wraps every request body and reads the 5-byte gRPC message
//! prefixes (compressed flag, big-endian length) as the bytes stream past.
//! A prefix declaring more than the limit fails the body with the status, so
//! the message is refused before it is buffered; tonic surfaces a body error
//! that is a `Status` unchanged.

use crate::grpc_error::GrpcError;
use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::Status;
use tower::{Layer, Service};

/// Default `--max-grpc-message-bytes`: a LookupRoute at the contract's limits
/// (1 Mi token ids at up to 5 varint bytes each, plus 1 MiB of prompt text)
/// must reach the handler and fail open there.
pub const DEFAULT_MAX_GRPC_MESSAGE_BYTES: usize = 8 << 20;

/// gRPC message prefix: compressed flag + u32 length.
const PREFIX: usize = 5;

/// Layer refusing request messages longer than `max` bytes.
#[derive(Debug, Clone)]
pub struct MessageLimitLayer {
    max: usize,
    refused: Counter,
}

impl MessageLimitLayer {
    /// `refused` counts the refused messages.
    pub fn new(max: usize, refused: Counter) -> Self {
        Self { max, refused }
    }
}

impl MessageLimitLayer {
    /// `body` checked as this layer checks every request body (for a
    /// route in front of the layer: `grpc_lookup`).
    pub(crate) fn limit(&self, body: tonic::body::Body) -> tonic::body::Body {
        tonic::body::Body::new(LimitedBody {
            inner: body,
            scan: PrefixScan::new(self.max),
            refused: self.refused.clone(),
        })
    }

    /// A new scan of one request's message prefixes against the limit.
    pub(crate) fn scan(&self) -> PrefixScan {
        PrefixScan::new(self.max)
    }

    /// The refusal of a message declaring `len` bytes, counted: what a
    /// limited body fails with.
    pub(crate) fn refuse(&self, len: usize) -> Status {
        self.refused.inc();
        GrpcError::MessageTooLarge { len, max: self.max }.into()
    }
}

impl<S> Layer<S> for MessageLimitLayer {
    type Service = MessageLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MessageLimit {
            inner,
            max: self.max,
            refused: self.refused.clone(),
        }
    }
}

/// The service of [`MessageLimitLayer`].
#[derive(Debug, Clone)]
pub struct MessageLimit<S> {
    inner: S,
    max: usize,
    refused: Counter,
}

impl<S> Service<http::Request<tonic::body::Body>> for MessageLimit<S>
where
    S: Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let (max, refused) = (self.max, self.refused.clone());
        self.inner.call(req.map(|body| {
            tonic::body::Body::new(LimitedBody {
                inner: body,
                scan: PrefixScan::new(max),
                refused,
            })
        }))
    }
}

/// Tracks where the message prefixes are in the byte stream.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrefixScan {
    max: usize,
    /// Bytes of the current message body still to pass.
    skip: usize,
    prefix: [u8; PREFIX],
    filled: usize,
}

impl PrefixScan {
    fn new(max: usize) -> Self {
        Self {
            max,
            skip: 0,
            prefix: [0; PREFIX],
            filled: 0,
        }
    }

    /// Feeds one chunk; `Err(len)` for the first message longer than `max`.
    pub(crate) fn feed(&mut self, mut chunk: &[u8]) -> Result<(), usize> {
        while !chunk.is_empty() {
            if self.skip > 0 {
                let n = self.skip.min(chunk.len());
                self.skip -= n;
                chunk = &chunk[n..];
                continue;
            }
            let n = (PREFIX - self.filled).min(chunk.len());
            self.prefix[self.filled..self.filled + n].copy_from_slice(&chunk[..n]);
            self.filled += n;
            chunk = &chunk[n..];
            if self.filled == PREFIX {
                self.filled = 0;
                let len = u32::from_be_bytes([
                    self.prefix[1],
                    self.prefix[2],
                    self.prefix[3],
                    self.prefix[4],
                ]) as usize;
                if len > self.max {
                    return Err(len);
                }
                self.skip = len;
            }
        }
        Ok(())
    }
}

struct LimitedBody {
    inner: tonic::body::Body,
    scan: PrefixScan,
    refused: Counter,
}

impl Body for LimitedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            other => return other,
        };
        if let Some(data) = frame.data_ref() {
            if let Err(len) = this.scan.feed(data.chunk()) {
                this.refused.inc();
                return Poll::Ready(Some(Err(GrpcError::MessageTooLarge {
                    len,
                    max: this.scan.max,
                }
                .into())));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(len: u32) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&len.to_be_bytes());
        m.extend(std::iter::repeat_n(7u8, len as usize));
        m
    }

    #[test]
    fn prefixes_are_found_across_any_chunking() {
        let mut stream = message(3);
        stream.extend(message(10));
        stream.extend(message(0));
        stream.extend(message(11));
        for chunk in 1..stream.len() {
            let mut scan = PrefixScan::new(10);
            let got = stream.chunks(chunk).try_for_each(|c| scan.feed(c));
            assert_eq!(got, Err(11), "chunk size {chunk}");
        }
        let mut scan = PrefixScan::new(11);
        assert_eq!(scan.feed(&stream), Ok(()));
    }

    #[test]
    fn body_bytes_never_look_like_prefixes() {
        // A message whose body is all 0xff must not be read as a huge prefix.
        let mut m = vec![0u8, 0, 0, 0, 8];
        m.extend([0xffu8; 8]);
        m.extend(message(1));
        let mut scan = PrefixScan::new(8);
        assert_eq!(scan.feed(&m), Ok(()));
    }
}

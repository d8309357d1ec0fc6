//! One body type serves LookupRoute's own route twice: the answer (one framed
//! message, then the `grpc-status: 0` trailers, as tonic's server encoder
//! sends them) and a request body replayed from what was already read, for
//! a request the lean path hands to tonic's general unary path.

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::Status;

/// One gRPC message (prefix included), then the OK trailers: a body with
/// nothing left to read but its end, so it is a [`Replay`] too.
pub(super) fn answer_body(framed: Bytes) -> Replay {
    // What `Status::ok("")` writes: the code alone.
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert(Status::GRPC_STATUS, http::HeaderValue::from_static("0"));
    Replay::new(framed, Some(Ok(Frame::trailers(trailers))))
}

/// A request body already read to its end: the bytes received, then the
/// frame that ended it (trailers or the body's error), if any.
#[derive(Debug)]
pub(super) struct Replay {
    head: Option<Bytes>,
    last: Option<Result<Frame<Bytes>, Status>>,
}

impl Replay {
    pub(super) fn new(head: Bytes, last: Option<Result<Frame<Bytes>, Status>>) -> Self {
        Self {
            head: Some(head).filter(|h| !h.is_empty()),
            last,
        }
    }
}

impl Body for Replay {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(head) = self.head.take() {
            return Poll::Ready(Some(Ok(Frame::data(head))));
        }
        Poll::Ready(self.last.take())
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_none() && self.last.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The body's next frame (no `http-body-util` here).
    async fn frame<B: Body + Unpin>(body: &mut B) -> Option<Result<Frame<B::Data>, B::Error>> {
        std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }

    /// The body's next frame, which must be data.
    async fn data(body: &mut Replay) -> Bytes {
        frame(body).await.unwrap().unwrap().into_data().unwrap()
    }

    #[tokio::test]
    async fn the_answer_is_its_message_then_the_ok_trailers() {
        let mut body = answer_body(Bytes::from_static(b"\0\0\0\0\x01x"));
        let data = data(&mut body).await;
        assert_eq!(&data[..], b"\0\0\0\0\x01x");
        assert!(!body.is_end_stream());
        let trailers = frame(&mut body)
            .await
            .unwrap()
            .unwrap()
            .into_trailers()
            .unwrap();
        assert_eq!(trailers.len(), 1);
        assert_eq!(trailers["grpc-status"], "0");
        assert!(body.is_end_stream());
        assert!(frame(&mut body).await.is_none());
    }

    #[tokio::test]
    async fn a_replay_gives_back_what_was_read_and_how_it_ended() {
        let err = Status::resource_exhausted("too big");
        let mut body = Replay::new(Bytes::from_static(b"abc"), Some(Err(err)));
        let data = data(&mut body).await;
        assert_eq!(&data[..], b"abc");
        let end = frame(&mut body).await.unwrap().unwrap_err();
        assert_eq!(end.code(), tonic::Code::ResourceExhausted);
        assert!(frame(&mut body).await.is_none());
        assert!(Replay::new(Bytes::new(), None).is_end_stream());
    }
}

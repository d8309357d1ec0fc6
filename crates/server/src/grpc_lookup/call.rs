//! One LookupRoute call served without tonic's `Grpc` state: the request
//! body read to its end, the one message decoded in place, the pipeline run
//! in the poll (or, when it waits for consumer auth or the tokenizer, in one
//! boxed future), the answer framed and sent with the OK trailers.
//!
//! Exactly one uncompressed message within the size limit, ending the body
//! without trailers, is what every unary client sends; anything else (no
//! message, two, a compressed flag, trailers, a body error, a length over
//! the limit) goes to tonic's general unary path with the bytes already
//! read replayed (and a length over `--max-grpc-message-bytes` as the
//! error the size limit's body fails with), so its status codes and
//! messages are tonic's by construction. Issue 36: tonic's unary future was 1,880 bytes, boxed per
//! call, and its decode and encode buffers two more allocations.

use super::body::{Replay, answer_body};
use super::{LookupRouteLayer, general};
use crate::grpc_limits::PrefixScan;
use crate::lookup_wire::{WireAnswer, WireLookup, decode_status};
use bytes::{Bytes, BytesMut};
use http_body::{Body as _, Frame};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::Status;
use tonic::body::Body;

/// gRPC's message prefix: compressed flag + big-endian u32 length.
const PREFIX: usize = 5;

/// A boxed response future (the calls that wait).
pub(super) type Waiting<T = http::Response<Body>> =
    Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The future of one LookupRoute call. `E` is the router's error type
/// (never produced: every outcome is a gRPC response).
pub(crate) struct LookupCall<E> {
    state: State,
    _error: PhantomData<fn() -> E>,
}

// Inline on purpose: the call lives in the one box tonic's transport makes
// per request (`BoxCloneService`); boxing the reading state would be a
// second allocation per call.
#[allow(clippy::large_enum_variant)]
enum State {
    Reading(Reading),
    Waiting(Waiting),
    Done,
}

/// The request while its body is read.
struct Reading {
    route: LookupRouteLayer,
    parts: http::request::Parts,
    body: Body,
    /// The size limit's view of the bytes so far.
    scan: PrefixScan,
    got: Received,
}

/// The body's bytes so far: one frame's without a copy, more concatenated.
#[derive(Default)]
enum Received {
    #[default]
    Nothing,
    One(Bytes),
    Many(BytesMut),
}

impl Received {
    fn push(&mut self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        *self = match std::mem::take(self) {
            Received::Nothing => Received::One(data),
            Received::One(first) => {
                let mut all = BytesMut::with_capacity(first.len() + data.len());
                all.extend_from_slice(&first);
                all.extend_from_slice(&data);
                Received::Many(all)
            }
            Received::Many(mut all) => {
                all.extend_from_slice(&data);
                Received::Many(all)
            }
        };
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Received::Nothing => Bytes::new(),
            Received::One(b) => b,
            Received::Many(b) => b.freeze(),
        }
    }
}

impl<E> LookupCall<E> {
    /// Reads `req`'s body, then answers it.
    pub(super) fn new(route: LookupRouteLayer, req: http::Request<Body>) -> Self {
        let (parts, body) = req.into_parts();
        Self::with(State::Reading(Reading {
            scan: route.limit.scan(),
            route,
            parts,
            body,
            got: Received::Nothing,
        }))
    }

    /// A call answered by `future` (tonic's general path).
    pub(super) fn waiting(future: Waiting) -> Self {
        Self::with(State::Waiting(future))
    }

    fn with(state: State) -> Self {
        Self {
            state,
            _error: PhantomData,
        }
    }
}

impl<E> Future for LookupCall<E> {
    type Output = Result<http::Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match std::mem::replace(&mut self.state, State::Done) {
                State::Reading(mut r) => {
                    let end = match Pin::new(&mut r.body).poll_frame(cx) {
                        Poll::Pending => {
                            self.state = State::Reading(r);
                            return Poll::Pending;
                        }
                        Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                            Ok(data) => match r.scan.feed(&data) {
                                Ok(()) => {
                                    r.got.push(data);
                                    self.state = State::Reading(r);
                                    continue;
                                }
                                // What the size limit's body fails with in
                                // place of this frame.
                                Err(len) => Some(Err(r.route.limit.refuse(len))),
                            },
                            Err(trailers) => Some(Ok(trailers)),
                        },
                        Poll::Ready(Some(Err(status))) => Some(Err(status)),
                        Poll::Ready(None) => None,
                    };
                    match r.answer(end) {
                        Answer::Now(res) => return Poll::Ready(Ok(res)),
                        Answer::Wait(future) => self.state = State::Waiting(future),
                    }
                }
                State::Waiting(mut future) => match future.as_mut().poll(cx) {
                    Poll::Ready(res) => return Poll::Ready(Ok(res)),
                    Poll::Pending => {
                        self.state = State::Waiting(future);
                        return Poll::Pending;
                    }
                },
                State::Done => return Poll::Pending,
            }
        }
    }
}

/// A response now, or the future that makes it.
enum Answer {
    Now(http::Response<Body>),
    Wait(Waiting),
}

impl Reading {
    /// The body has ended (`end`: `None` at its end, else the trailers or
    /// error that ended it).
    fn answer(self, end: Option<Result<Frame<Bytes>, Status>>) -> Answer {
        let Reading {
            route,
            parts,
            got,
            body: _,
            scan: _,
        } = self;
        let got = got.into_bytes();
        let Some(message) =
            one_message(&got, route.max_decoding_message_bytes).filter(|_| end.is_none())
        else {
            let req = http::Request::from_parts(parts, Body::new(Replay::new(got, end)));
            return Answer::Wait(general(&route, req));
        };
        let lookup = match WireLookup::decode(message) {
            Ok(l) => l,
            Err(e) => return Answer::Now(decode_status(e).into_http()),
        };
        let service = route.service;
        if let Some(answer) = service.lookup_now(&lookup, &parts.headers) {
            return Answer::Now(respond(Ok(answer)));
        }
        let request = tonic::Request::from_http(http::Request::from_parts(parts, lookup));
        Answer::Wait(Box::pin(async move {
            respond(service.lookup_wire(request).await)
        }))
    }
}

/// The one uncompressed message that is the whole of `got`, if it is one
/// and within `max` bytes.
fn one_message(got: &Bytes, max: usize) -> Option<Bytes> {
    let prefix: [u8; PREFIX] = got.get(..PREFIX)?.try_into().ok()?;
    let len = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    (prefix[0] == 0 && len <= max && got.len() - PREFIX == len).then(|| got.slice(PREFIX..))
}

/// The HTTP response of an answer or a refusal, as tonic's unary path
/// makes it: `content-type: application/grpc`, then the message and the OK
/// trailers, or the status alone in the headers.
fn respond(answer: Result<WireAnswer, Status>) -> http::Response<Body> {
    match answer {
        Ok(answer) => {
            let mut res = http::Response::new(Body::new(answer_body(answer.into_framed())));
            *res.version_mut() = http::Version::HTTP_2;
            res.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            res
        }
        Err(status) => status.into_http(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(flag: u8, message: &[u8]) -> Bytes {
        let mut b = vec![flag];
        b.extend_from_slice(&(message.len() as u32).to_be_bytes());
        b.extend_from_slice(message);
        Bytes::from(b)
    }

    #[test]
    fn only_one_whole_uncompressed_message_within_the_limit_is_taken() {
        let m = framed(0, b"abc");
        assert_eq!(one_message(&m, 3).as_deref(), Some(&b"abc"[..]));
        assert_eq!(one_message(&framed(0, b""), 3).as_deref(), Some(&b""[..]));
        assert!(one_message(&m, 2).is_none(), "over the limit");
        assert!(one_message(&framed(1, b"abc"), 3).is_none(), "compressed");
        assert!(one_message(&m.slice(..7), 3).is_none(), "cut short");
        let mut two = m.to_vec();
        two.extend_from_slice(&m);
        assert!(one_message(&Bytes::from(two), 3).is_none(), "two messages");
        assert!(one_message(&Bytes::new(), 3).is_none(), "none");
        assert!(one_message(&m.slice(..4), 3).is_none(), "a cut prefix");
    }

    #[test]
    fn received_frames_are_joined_in_order() {
        let mut got = Received::default();
        got.push(Bytes::from_static(b"ab"));
        got.push(Bytes::new());
        assert!(matches!(got, Received::One(_)), "one frame, no copy");
        got.push(Bytes::from_static(b"c"));
        got.push(Bytes::from_static(b"de"));
        assert_eq!(&got.into_bytes()[..], b"abcde");
    }
}

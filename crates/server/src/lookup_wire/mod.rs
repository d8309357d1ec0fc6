//! LookupRoute's wire format without the generated message types: the
//! request decoded in place ([`WireLookup`]), the response encoded from the
//! pipeline's outcome ([`WireAnswer`]), and the gRPC codec over both that
//! `grpc_lookup` serves the method with. Same bytes in, same bytes out as
//! the generated code (property tests in `tests.rs`); what goes is one
//! allocation per hash and per string on the way in and per replica id on
//! the way out (issue 36: the server's fixed cost per lookup).

mod decode;
mod encode;
#[cfg(test)]
mod tests;

pub use decode::{WireError, WireLookup};
pub use encode::WireAnswer;

use bytes::Buf;
use inferencecache_proto::codec::CALL_BUFFER_BYTES;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// An undecodable request: `INVALID_ARGUMENT`, with the contract codec's
/// message.
pub fn decode_status(e: WireError) -> Status {
    Status::invalid_argument(format!("request is not a valid protobuf message: {e}"))
}

/// The buffers of one call, as the contract codec's.
fn buffer_settings() -> BufferSettings {
    BufferSettings::new(CALL_BUFFER_BYTES, 32 * 1024)
}

/// The codec of LookupRoute's own route (`grpc_lookup`).
#[derive(Debug, Clone, Copy, Default)]
pub struct LookupCodec;

impl Codec for LookupCodec {
    type Encode = WireAnswer;
    type Decode = WireLookup;
    type Encoder = AnswerEncoder;
    type Decoder = LookupDecoder;

    fn encoder(&mut self) -> AnswerEncoder {
        AnswerEncoder
    }

    fn decoder(&mut self) -> LookupDecoder {
        LookupDecoder
    }
}

/// Encodes [`WireAnswer`]s.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnswerEncoder;

impl Encoder for AnswerEncoder {
    type Item = WireAnswer;
    type Error = Status;

    fn encode(&mut self, item: WireAnswer, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        // `encode` copies the assembled answer in once (its own reserve);
        // the scores' buffer goes back to the thread for the next answer
        // (64 scores are over glibc's thread cache: issue 36, session 45).
        item.encode(dst);
        inferencecache_index::recycle_scores(item.outcome.scores);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

/// Decodes [`WireLookup`]s; an undecodable request is `INVALID_ARGUMENT`
/// with the contract codec's message.
#[derive(Debug, Clone, Copy, Default)]
pub struct LookupDecoder;

impl Decoder for LookupDecoder {
    type Item = WireLookup;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<WireLookup>, Status> {
        let raw = src.copy_to_bytes(src.remaining());
        WireLookup::decode(raw).map(Some).map_err(decode_status)
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

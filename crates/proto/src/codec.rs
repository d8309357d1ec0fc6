//! The contract's gRPC codec: tonic-prost's encoding, with one change on the
//! decoding side. A message that is not valid protobuf is the caller's fault,
//! so it is `INVALID_ARGUMENT` (gRPC's convention) rather than tonic-prost's
//! `INTERNAL`, which clients read as a server bug and may retry.
//!
//! Both the generated server and client use it (tonic-build has one codec
//! path per service); a client that receives an undecodable response sees
//! `INVALID_ARGUMENT` too.

use prost::Message;
use std::marker::PhantomData;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::ProstEncoder;

/// The initial buffer of one call's encoder and decoder. tonic's default is
/// 8 KiB per call on each side; the contract's unary messages are a few
/// hundred bytes (a 32-block LookupRoute request is ~400 B, its answer
/// ~150 B), and an 8 KiB request is past glibc's per-thread cache, so every
/// call paid two slow-path allocations that also consolidate the allocator's
/// fast bins (issue 36's profile). 1 KiB stays in the cache; a larger
/// message grows the buffer once, and a stream reuses it.
pub const CALL_BUFFER_BYTES: usize = 1024;

/// [`CALL_BUFFER_BYTES`] with tonic's default yield threshold (32 KiB).
fn buffer_settings() -> BufferSettings {
    BufferSettings::new(CALL_BUFFER_BYTES, 32 * 1024)
}

/// Codec named by the generated service code (`codec_path` in `build.rs`).
#[derive(Debug, Clone)]
pub struct ContractCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for ContractCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for ContractCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = ContractDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(buffer_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        ContractDecoder { _pd: PhantomData }
    }
}

/// Decodes with prost; undecodable bytes are `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct ContractDecoder<U> {
    _pd: PhantomData<U>,
}

impl<U: Message + Default> Decoder for ContractDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| {
            Status::invalid_argument(format!("request is not a valid protobuf message: {e}"))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        buffer_settings()
    }
}

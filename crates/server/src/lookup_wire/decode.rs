//! `LookupRouteRequest` decoded in place: every string and hash is a span
//! of the request's one buffer, so a 32-block lookup costs one `Vec` of
//! spans instead of 32 reference-counted `Bytes` plus a `String` per id
//! (issue 36's profile: the generated decode was ~10 % of the server's CPU
//! per lookup). The wire semantics are prost's, field by field (last value
//! wins for singular fields, packed or unpacked repeated scalars, unknown
//! fields skipped, strings must be UTF-8); the property test in
//! `lookup_wire/tests.rs` holds the two decoders to the same answers.

use crate::route::RouteRequest;
use bytes::{Buf, Bytes};
use inferencecache_proto::v1alpha1 as pb;
use prost::Message;
use prost::encoding::{DecodeContext, WireType, check_wire_type, decode_key, decode_varint};

/// The most block hashes reserved at once (more grow the `Vec` as usual).
const MAX_RESERVED_HASHES: usize = 1024;

/// Why a request is not a valid `LookupRouteRequest`.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// A key, varint, wire type or skipped field prost refuses.
    #[error(transparent)]
    Prost(#[from] prost::DecodeError),
    /// A length-delimited field longer than what is left of the message.
    #[error("buffer underflow")]
    Underflow,
    /// A packed field whose last value runs past its length.
    #[error("delimited length exceeded")]
    Delimited,
    /// A string field that is not UTF-8.
    #[error("invalid string value: data is not UTF-8 encoded")]
    Utf8,
}

/// A byte range of the request buffer (gRPC messages are < 4 GiB).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Span {
    start: u32,
    end: u32,
}

/// A decoded `LookupRouteRequest` over its own buffer.
#[derive(Debug, Clone, Default)]
pub struct WireLookup {
    raw: Bytes,
    model_id: Span,
    tenant_id: Span,
    prefix_hash: Span,
    prefix_token_count: i32,
    hash_scheme: Span,
    slo: Option<pb::Slo>,
    block_hashes: Vec<Span>,
    block_token_counts: Vec<i32>,
    token_ids: Vec<u32>,
    prompt_text: Span,
    adapter_id: Span,
    cache_salt: Span,
}

impl WireLookup {
    /// Decodes one message (the whole of `raw`).
    pub fn decode(raw: Bytes) -> Result<Self, WireError> {
        let mut out = WireLookup {
            raw,
            ..Default::default()
        };
        let raw = out.raw.clone();
        let mut buf: &[u8] = &raw;
        let total = raw.len();
        while buf.has_remaining() {
            let (tag, wire_type) = decode_key(&mut buf)?;
            match tag {
                1 | 2 | 5 | 10 | 11 | 12 => {
                    check_wire_type(WireType::LengthDelimited, wire_type)?;
                    let span = len_span(&mut buf, total)?;
                    if std::str::from_utf8(out.bytes(span)).is_err() {
                        return Err(WireError::Utf8);
                    }
                    *match tag {
                        1 => &mut out.model_id,
                        2 => &mut out.tenant_id,
                        5 => &mut out.hash_scheme,
                        10 => &mut out.prompt_text,
                        11 => &mut out.adapter_id,
                        _ => &mut out.cache_salt,
                    } = span;
                }
                3 => {
                    check_wire_type(WireType::LengthDelimited, wire_type)?;
                    out.prefix_hash = len_span(&mut buf, total)?;
                }
                4 => {
                    check_wire_type(WireType::Varint, wire_type)?;
                    out.prefix_token_count = decode_varint(&mut buf)? as i32;
                }
                6 => {
                    check_wire_type(WireType::LengthDelimited, wire_type)?;
                    let span = len_span(&mut buf, total)?;
                    out.slo
                        .get_or_insert_default()
                        .merge(&raw[span.start as usize..span.end as usize])?;
                }
                7 => {
                    check_wire_type(WireType::LengthDelimited, wire_type)?;
                    let span = len_span(&mut buf, total)?;
                    if out.block_hashes.is_empty() {
                        // Sized once: the rest of the message holds at most
                        // this many more hashes of this length (key and a
                        // one-byte length each; capped, so a message of
                        // empty hashes does not reserve four times its
                        // size); the `Vec` grew 5 times for a 32-block chain.
                        let each = (span.end - span.start) as usize + 2;
                        out.block_hashes
                            .reserve((1 + buf.len() / each).min(MAX_RESERVED_HASHES));
                    }
                    out.block_hashes.push(span);
                }
                8 => repeated(&mut buf, wire_type, &mut out.block_token_counts, |v| {
                    v as i32
                })?,
                9 => repeated(&mut buf, wire_type, &mut out.token_ids, |v| v as u32)?,
                _ => {
                    prost::encoding::skip_field(wire_type, tag, &mut buf, DecodeContext::default())?
                }
            }
        }
        Ok(out)
    }

    fn bytes(&self, s: Span) -> &[u8] {
        self.raw
            .get(s.start as usize..s.end as usize)
            .unwrap_or_default()
    }

    /// A string field (UTF-8 checked when decoded; `""` cannot happen otherwise).
    fn str(&self, s: Span) -> &str {
        std::str::from_utf8(self.bytes(s)).unwrap_or_default()
    }

    /// The request's block hashes as slices of its buffer.
    pub fn hash_slices(&self) -> Vec<&[u8]> {
        self.block_hashes.iter().map(|&s| self.bytes(s)).collect()
    }

    /// The adapter the request names (`""` = none).
    pub fn adapter_id(&self) -> &str {
        self.str(self.adapter_id)
    }

    /// The pipeline's request, borrowing every field; `block_hashes` are
    /// [`Self::hash_slices`].
    pub fn route_request<'a>(&'a self, block_hashes: &'a [&'a [u8]]) -> RouteRequest<'a> {
        RouteRequest {
            tenant: self.str(self.tenant_id),
            model: self.str(self.model_id),
            hash_scheme: self.str(self.hash_scheme),
            adapter: self.str(self.adapter_id),
            prefix_hash: self.bytes(self.prefix_hash),
            prefix_token_count: self.prefix_token_count,
            block_hashes,
            block_token_counts: &self.block_token_counts,
            token_ids: &self.token_ids,
            prompt_text: self.str(self.prompt_text),
            slo_ttft_ms: self.slo.map_or(0, |s| s.ttft_ms),
            cache_salt: self.str(self.cache_salt),
            // A call's header, not a field: the handler sets it.
            shadow: false,
        }
    }

    /// The generated message with the same fields (tests and diagnostics).
    pub fn to_proto(&self) -> pb::LookupRouteRequest {
        pb::LookupRouteRequest {
            model_id: self.str(self.model_id).to_owned(),
            tenant_id: self.str(self.tenant_id).to_owned(),
            prefix_hash: self.bytes(self.prefix_hash).to_vec(),
            prefix_token_count: self.prefix_token_count,
            hash_scheme: self.str(self.hash_scheme).to_owned(),
            slo: self.slo,
            block_hashes: self
                .block_hashes
                .iter()
                .map(|&s| Bytes::copy_from_slice(self.bytes(s)))
                .collect(),
            block_token_counts: self.block_token_counts.clone(),
            token_ids: self.token_ids.clone(),
            prompt_text: self.str(self.prompt_text).to_owned(),
            adapter_id: self.str(self.adapter_id).to_owned(),
            cache_salt: self.str(self.cache_salt).to_owned(),
        }
    }
}

/// A length-delimited field's payload (`buf` is the rest of a message of
/// `total` bytes, at the length prefix): its span, and `buf` moved past it.
fn len_span(buf: &mut &[u8], total: usize) -> Result<Span, WireError> {
    let len = decode_varint(buf)?;
    if len > buf.len() as u64 {
        return Err(WireError::Underflow);
    }
    let start = total - buf.len();
    let end = start + len as usize;
    buf.advance(len as usize);
    let span = |v: usize| u32::try_from(v).map_err(|_| WireError::Underflow);
    Ok(Span {
        start: span(start)?,
        end: span(end)?,
    })
}

/// A repeated varint scalar, packed or one value at a time, as prost reads it.
fn repeated<T>(
    buf: &mut &[u8],
    wire_type: WireType,
    out: &mut Vec<T>,
    conv: impl Fn(u64) -> T,
) -> Result<(), WireError> {
    if wire_type == WireType::LengthDelimited {
        let len = decode_varint(buf)?;
        if len > buf.len() as u64 {
            return Err(WireError::Underflow);
        }
        let (mut packed, rest) = buf.split_at(len as usize);
        // At most one value per byte.
        out.reserve(packed.len());
        while !packed.is_empty() {
            // A value cut by the field's end: prost reads on past the end
            // and then refuses the field, so this is an error either way.
            let v = decode_varint(&mut packed).map_err(|_| WireError::Delimited)?;
            out.push(conv(v));
        }
        *buf = rest;
        return Ok(());
    }
    check_wire_type(WireType::Varint, wire_type)?;
    out.push(conv(decode_varint(buf)?));
    Ok(())
}

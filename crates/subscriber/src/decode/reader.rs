//! A forward-only msgpack cursor: one value header at a time, and whole
//! values skipped in place. Nothing is built for values the decoder ignores,
//! and nothing is allocated from a declared length.
//!
//! Limits match the `rmpv` tree reader the decoder replaced, so a payload is
//! refused by one exactly when it was refused by the other: nesting deeper
//! than [`MAX_LEVEL`] is an error (a string or ext at that level already is),
//! and the reserved marker `0xc1` reads as nil.

use rmp::Marker;

/// Deepest nesting level (root = 0) a value may sit at. Real payloads need
/// about 6 (batch → events → event → extra_keys → per-block tuple → item);
/// the cap bounds recursion on hostile input.
pub(super) const MAX_LEVEL: usize = 15;

/// One value header. Scalars are complete; for arrays and maps only the
/// length is read and the caller walks (or skips) the elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Head<'a> {
    Nil,
    Bool(bool),
    /// Any non-negative integer, whichever width carried it.
    Uint(u64),
    /// A negative integer.
    Int(i64),
    F32(f32),
    F64(f64),
    /// Raw bytes of a `str` (not necessarily valid UTF-8).
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Ext,
    Array(u32),
    Map(u32),
}

impl Head<'_> {
    /// The value's kind, for error messages.
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Head::Nil => "nil",
            Head::Bool(_) => "a bool",
            Head::Uint(_) | Head::Int(_) => "an integer",
            Head::F32(_) | Head::F64(_) => "a float",
            Head::Str(_) => "a string",
            Head::Bin(_) => "binary",
            Head::Array(_) => "an array",
            Head::Map(_) => "a map",
            Head::Ext => "an ext",
        }
    }

    /// A `str` that is valid UTF-8.
    pub(super) fn as_str(&self) -> Option<&str> {
        match self {
            Head::Str(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    pub(super) fn as_i64(&self) -> Option<i64> {
        match *self {
            Head::Uint(u) => i64::try_from(u).ok(),
            Head::Int(i) => Some(i),
            _ => None,
        }
    }

    pub(super) fn as_f64(&self) -> Option<f64> {
        match *self {
            Head::F64(f) => Some(f),
            Head::F32(f) => Some(f64::from(f)),
            Head::Uint(u) => Some(u as f64),
            Head::Int(i) => Some(i as f64),
            _ => None,
        }
    }

    /// Elements that follow this header (map pairs count twice).
    fn children(&self) -> u64 {
        match *self {
            Head::Array(n) => u64::from(n),
            Head::Map(n) => 2 * u64::from(n),
            _ => 0,
        }
    }
}

/// Why the payload is not one well-formed msgpack value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum Malformed {
    #[error("truncated at byte {0}")]
    Truncated(usize),
    #[error("nested deeper than {MAX_LEVEL} levels at byte {0}")]
    TooDeep(usize),
}

/// The cursor.
pub(super) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    /// Bytes not yet read: an upper bound on the elements still to come,
    /// since every value takes at least one byte.
    pub(super) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(super) fn position(&self) -> usize {
        self.pos
    }

    /// The bytes between two positions of this cursor.
    pub(super) fn span(&self, from: usize) -> &'a [u8] {
        self.buf.get(from..self.pos).unwrap_or_default()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.buf.len())
            .ok_or(Malformed::Truncated(self.buf.len()))?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Malformed> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn len8(&mut self) -> Result<usize, Malformed> {
        Ok(usize::from(self.array::<1>()?[0]))
    }

    fn len16(&mut self) -> Result<usize, Malformed> {
        Ok(usize::from(u16::from_be_bytes(self.array()?)))
    }

    fn len32(&mut self) -> Result<usize, Malformed> {
        Ok(u32::from_be_bytes(self.array()?) as usize)
    }

    fn count16(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from(u16::from_be_bytes(self.array()?)))
    }

    fn count32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn signed(v: i64) -> Head<'a> {
        match u64::try_from(v) {
            Ok(u) => Head::Uint(u),
            Err(_) => Head::Int(v),
        }
    }

    fn ext(&mut self, len: usize, level: usize) -> Result<Head<'a>, Malformed> {
        if level >= MAX_LEVEL {
            return Err(Malformed::TooDeep(self.pos));
        }
        self.take(1 + len)?;
        Ok(Head::Ext)
    }

    fn str(&mut self, len: usize, level: usize) -> Result<Head<'a>, Malformed> {
        if level >= MAX_LEVEL {
            return Err(Malformed::TooDeep(self.pos));
        }
        self.take(len).map(Head::Str)
    }

    /// The next value when it is an unsigned integer in one of the encodings
    /// token ids use (fixint, u8, u16, u32); otherwise `None` and nothing is
    /// consumed. The common case of [`Self::head`], without its dispatch.
    #[inline]
    pub(super) fn small_uint(&mut self) -> Option<u32> {
        let rest = self.buf.get(self.pos..)?;
        let (v, len) = match *rest {
            [b @ 0x00..=0x7f, ..] => (u32::from(b), 1),
            [0xcc, b, ..] => (u32::from(b), 2),
            [0xcd, a, b, ..] => (u32::from(u16::from_be_bytes([a, b])), 3),
            [0xce, a, b, c, d, ..] => (u32::from_be_bytes([a, b, c, d]), 5),
            _ => return None,
        };
        self.pos += len;
        Some(v)
    }

    /// Reads the header of the value at nesting `level`.
    pub(super) fn head(&mut self, level: usize) -> Result<Head<'a>, Malformed> {
        if level > MAX_LEVEL {
            return Err(Malformed::TooDeep(self.pos));
        }
        let byte = self.array::<1>()?[0];
        Ok(match Marker::from_u8(byte) {
            Marker::FixPos(v) => Head::Uint(u64::from(v)),
            Marker::FixNeg(v) => Head::Int(i64::from(v)),
            Marker::Null | Marker::Reserved => Head::Nil,
            Marker::False => Head::Bool(false),
            Marker::True => Head::Bool(true),
            Marker::U8 => Head::Uint(u64::from(self.array::<1>()?[0])),
            Marker::U16 => Head::Uint(u64::from(u16::from_be_bytes(self.array()?))),
            Marker::U32 => Head::Uint(u64::from(u32::from_be_bytes(self.array()?))),
            Marker::U64 => Head::Uint(u64::from_be_bytes(self.array()?)),
            Marker::I8 => Self::signed(i64::from(i8::from_be_bytes(self.array()?))),
            Marker::I16 => Self::signed(i64::from(i16::from_be_bytes(self.array()?))),
            Marker::I32 => Self::signed(i64::from(i32::from_be_bytes(self.array()?))),
            Marker::I64 => Self::signed(i64::from_be_bytes(self.array()?)),
            Marker::F32 => Head::F32(f32::from_be_bytes(self.array()?)),
            Marker::F64 => Head::F64(f64::from_be_bytes(self.array()?)),
            Marker::FixStr(n) => return self.str(usize::from(n), level),
            Marker::Str8 => {
                let n = self.len8()?;
                return self.str(n, level);
            }
            Marker::Str16 => {
                let n = self.len16()?;
                return self.str(n, level);
            }
            Marker::Str32 => {
                let n = self.len32()?;
                return self.str(n, level);
            }
            Marker::Bin8 => {
                let n = self.len8()?;
                Head::Bin(self.take(n)?)
            }
            Marker::Bin16 => {
                let n = self.len16()?;
                Head::Bin(self.take(n)?)
            }
            Marker::Bin32 => {
                let n = self.len32()?;
                Head::Bin(self.take(n)?)
            }
            Marker::FixArray(n) => Head::Array(u32::from(n)),
            Marker::Array16 => Head::Array(self.count16()?),
            Marker::Array32 => Head::Array(self.count32()?),
            Marker::FixMap(n) => Head::Map(u32::from(n)),
            Marker::Map16 => Head::Map(self.count16()?),
            Marker::Map32 => Head::Map(self.count32()?),
            Marker::FixExt1 => return self.ext(1, level),
            Marker::FixExt2 => return self.ext(2, level),
            Marker::FixExt4 => return self.ext(4, level),
            Marker::FixExt8 => return self.ext(8, level),
            Marker::FixExt16 => return self.ext(16, level),
            Marker::Ext8 => {
                let n = self.len8()?;
                return self.ext(n, level);
            }
            Marker::Ext16 => {
                let n = self.len16()?;
                return self.ext(n, level);
            }
            Marker::Ext32 => {
                let n = self.len32()?;
                return self.ext(n, level);
            }
        })
    }

    /// Skips the elements of a value whose header `head` (at `level`) was
    /// just read; a no-op for scalars.
    pub(super) fn skip_body(&mut self, head: Head<'a>, level: usize) -> Result<(), Malformed> {
        for _ in 0..head.children() {
            self.skip(level + 1)?;
        }
        Ok(())
    }

    /// Skips one whole value at `level`.
    pub(super) fn skip(&mut self, level: usize) -> Result<(), Malformed> {
        let head = self.head(level)?;
        self.skip_body(head, level)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn heads(bytes: &[u8]) -> Vec<Head<'_>> {
        let mut r = Reader::new(bytes);
        let mut out = Vec::new();
        while r.remaining() > 0 {
            out.push(r.head(0).unwrap());
        }
        out
    }

    #[test]
    fn integers_are_canonical_whatever_the_width() {
        let bytes = [
            0x05, // fixpos
            0xd0, 0x05, // i8 5
            0xd3, 0, 0, 0, 0, 0, 0, 0, 5, // i64 5
            0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // u64 max
            0xff, // fixneg -1
            0xd1, 0xff, 0x00, // i16 -256
        ];
        assert_eq!(
            heads(&bytes),
            vec![
                Head::Uint(5),
                Head::Uint(5),
                Head::Uint(5),
                Head::Uint(u64::MAX),
                Head::Int(-1),
                Head::Int(-256)
            ]
        );
    }

    #[test]
    fn strings_bins_and_containers() {
        let bytes = [0xa2, b'h', b'i', 0xc4, 1, 9, 0x92, 0x81, 0xc1];
        assert_eq!(
            heads(&bytes),
            vec![
                Head::Str(b"hi"),
                Head::Bin(&[9]),
                Head::Array(2),
                Head::Map(1),
                Head::Nil
            ]
        );
    }

    #[test]
    fn skip_walks_nested_values_and_reports_truncation() {
        // [ {"a": [1, 2]}, "x" ] then a trailing 7
        let bytes = [0x92, 0x81, 0xa1, b'a', 0x92, 1, 2, 0xa1, b'x', 7];
        let mut r = Reader::new(&bytes);
        r.skip(0).unwrap();
        assert_eq!(r.head(0).unwrap(), Head::Uint(7));
        let mut r = Reader::new(&bytes[..6]);
        assert_eq!(r.skip(0), Err(Malformed::Truncated(6)));
        // a declared length far beyond the data fails without allocating it
        let mut r = Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(r.skip(0), Err(Malformed::Truncated(5)));
    }

    #[test]
    fn depth_limit() {
        let mut ok = vec![0x91u8; MAX_LEVEL];
        ok.push(0xc0);
        assert!(Reader::new(&ok).skip(0).is_ok());
        let mut deep = vec![0x91u8; MAX_LEVEL + 1];
        deep.push(0xc0);
        assert!(matches!(
            Reader::new(&deep).skip(0),
            Err(Malformed::TooDeep(_))
        ));
        // a string is one level heavier than a scalar
        let mut s = vec![0x91u8; MAX_LEVEL];
        s.extend([0xa1, b'x']);
        assert!(matches!(
            Reader::new(&s).skip(0),
            Err(Malformed::TooDeep(_))
        ));
    }
}

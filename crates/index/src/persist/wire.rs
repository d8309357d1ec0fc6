//! Primitive encoding: LEB128 varints, zigzag, length-prefixed bytes, and a
//! bounds-checked reader that never panics and never allocates more than the
//! input can back.

use super::PersistError;

pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

pub(crate) fn put_ivarint(out: &mut Vec<u8>, v: i64) {
    put_varint(out, zigzag(v));
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A cursor over a byte slice.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], PersistError> {
        if n > self.remaining() {
            return Err(PersistError::Truncated(what));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub(crate) fn fixed<const N: usize>(
        &mut self,
        what: &'static str,
    ) -> Result<[u8; N], PersistError> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    pub(crate) fn u64_le(&mut self, what: &'static str) -> Result<u64, PersistError> {
        Ok(u64::from_le_bytes(self.fixed(what)?))
    }

    pub(crate) fn f32_le(&mut self, what: &'static str) -> Result<f32, PersistError> {
        Ok(f32::from_le_bytes(self.fixed(what)?))
    }

    #[inline]
    pub(crate) fn varint(&mut self, what: &'static str) -> Result<u64, PersistError> {
        let mut v: u64 = 0;
        for shift in (0..64).step_by(7) {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(PersistError::Truncated(what));
            };
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(PersistError::Malformed(what))
    }

    pub(crate) fn ivarint(&mut self, what: &'static str) -> Result<i64, PersistError> {
        Ok(unzigzag(self.varint(what)?))
    }

    /// A varint that must fit `u32`.
    pub(crate) fn u32v(&mut self, what: &'static str) -> Result<u32, PersistError> {
        u32::try_from(self.varint(what)?).map_err(|_| PersistError::Malformed(what))
    }

    /// A varint that must fit `i32` after zigzag.
    pub(crate) fn i32v(&mut self, what: &'static str) -> Result<i32, PersistError> {
        i32::try_from(self.ivarint(what)?).map_err(|_| PersistError::Malformed(what))
    }

    /// A count of items each at least `min_item` bytes long: refused when the
    /// rest of the input cannot hold that many (bounds allocation).
    pub(crate) fn count(
        &mut self,
        min_item: usize,
        what: &'static str,
    ) -> Result<usize, PersistError> {
        let n = self.varint(what)?;
        let n = usize::try_from(n).map_err(|_| PersistError::Malformed(what))?;
        if n.saturating_mul(min_item.max(1)) > self.remaining() {
            return Err(PersistError::Truncated(what));
        }
        Ok(n)
    }

    pub(crate) fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], PersistError> {
        let n = usize::try_from(self.varint(what)?).map_err(|_| PersistError::Malformed(what))?;
        self.take(n, what)
    }

    pub(crate) fn str(&mut self, what: &'static str) -> Result<&'a str, PersistError> {
        std::str::from_utf8(self.bytes(what)?).map_err(|_| PersistError::Malformed(what))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn varints_round_trip(v: u64, i: i64) {
            let mut b = Vec::new();
            put_varint(&mut b, v);
            put_ivarint(&mut b, i);
            let mut r = Reader::new(&b);
            prop_assert_eq!(r.varint("v").ok(), Some(v));
            prop_assert_eq!(r.ivarint("i").ok(), Some(i));
            prop_assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn overlong_varint_is_malformed() {
        let b = [0xffu8; 11];
        assert!(matches!(
            Reader::new(&b).varint("x"),
            Err(PersistError::Malformed("x"))
        ));
    }
}

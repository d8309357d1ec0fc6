//! The engine's own block hash, exactly as it came off the wire.

use std::fmt;

/// An engine-private block hash.
///
/// vLLM sends the low 64 bits of a SHA-256 as a msgpack uint (often above
/// `i64::MAX`) or, with `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`, the 32-byte
/// digest as `bin`; SGLang and older engines may send Python's signed `hash()`.
/// The variants stay distinct so no two different wire values can collide:
/// a non-negative integer is always [`EngineHash::Uint`] whichever msgpack
/// integer width carried it (encoders pick the smallest), a negative one is
/// always [`EngineHash::Int`], and byte strings (msgpack `bin`, or `str`
/// taken as its UTF-8 bytes) are [`EngineHash::Bytes`].
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EngineHash {
    /// A non-negative integer hash (the full `u64` range).
    Uint(u64),
    /// A negative integer hash.
    Int(i64),
    /// An opaque byte-string hash.
    Bytes(Box<[u8]>),
}

impl EngineHash {
    /// Builds the canonical form of an integer hash given as `i64`.
    pub fn from_i64(v: i64) -> Self {
        match u64::try_from(v) {
            Ok(u) => Self::Uint(u),
            Err(_) => Self::Int(v),
        }
    }

    /// Heap bytes held beyond the enum itself (for the memory bound).
    pub fn heap_bytes(&self) -> usize {
        match self {
            Self::Bytes(b) => b.len(),
            Self::Uint(_) | Self::Int(_) => 0,
        }
    }
}

impl From<u64> for EngineHash {
    fn from(v: u64) -> Self {
        Self::Uint(v)
    }
}

impl From<i64> for EngineHash {
    fn from(v: i64) -> Self {
        Self::from_i64(v)
    }
}

impl From<&[u8]> for EngineHash {
    fn from(v: &[u8]) -> Self {
        Self::Bytes(v.into())
    }
}

impl fmt::Debug for EngineHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for EngineHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uint(v) => write!(f, "{v}"),
            Self::Int(v) => write!(f, "{v}"),
            Self::Bytes(b) => {
                f.write_str("0x")?;
                for byte in b.iter() {
                    write!(f, "{byte:02x}")?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn integer_forms_are_canonical_and_distinct() {
        assert_eq!(EngineHash::from(5i64), EngineHash::from(5u64));
        assert_ne!(EngineHash::from(-1i64), EngineHash::from(u64::MAX));
        let bytes = EngineHash::from(&5u64.to_be_bytes()[..]);
        assert_ne!(bytes, EngineHash::from(5u64));
        let set: HashSet<_> = [
            EngineHash::from(u64::MAX),
            EngineHash::from(-1i64),
            EngineHash::from(&[0xffu8; 8][..]),
        ]
        .into_iter()
        .collect();
        assert_eq!(set.len(), 3);
    }

    #[test]
    fn display() {
        assert_eq!(
            EngineHash::from(u64::MAX).to_string(),
            "18446744073709551615"
        );
        assert_eq!(EngineHash::from(-7i64).to_string(), "-7");
        assert_eq!(EngineHash::from(&[0xab, 0x01][..]).to_string(), "0xab01");
    }
}

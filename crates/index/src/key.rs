//! Entry keys: `(partition id, prefix hash bytes)` and their 64-bit hash.
//!
//! The hash of a key is computed once per operation ([`KeyRef::new`]) and then
//! picks its shard and its place in the shard's table, so a key is never
//! hashed twice. Prefix hashes are already uniformly random (XXH3), so
//! one folded multiply per 8-byte word is enough mixing; it still spreads
//! low-entropy test keys over every bit.

use std::fmt;

const K1: u64 = 0x9E37_79B9_7F4A_7C15;
const K2: u64 = 0xD6E8_FEB8_6659_FD93;

/// 64×64→128 multiply folded back to 64 bits (the wyhash / foldhash mixer).
#[inline]
fn folded_mul(a: u64, b: u64) -> u64 {
    let m = u128::from(a) * u128::from(b);
    (m as u64) ^ ((m >> 64) as u64)
}

/// Hash of a key. The usual 8-byte prefix hash takes a single multiply.
#[inline]
pub(crate) fn key_hash(part: u32, bytes: &[u8]) -> u64 {
    let seed = u64::from(part).wrapping_mul(K1) ^ (bytes.len() as u64);
    if let Ok(w) = <[u8; 8]>::try_from(bytes) {
        return folded_mul(seed ^ u64::from_le_bytes(w), K2);
    }
    let mut h = seed;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = folded_mul(h ^ u64::from_le_bytes(w), K2);
    }
    let rest = chunks.remainder();
    let mut w = [0u8; 8];
    w[..rest.len()].copy_from_slice(rest);
    folded_mul(h ^ u64::from_le_bytes(w), K1 ^ K2)
}

/// Shard index of a key hash: bits 51..57, disjoint from the low bits a
/// table uses for the home bucket.
#[inline]
pub(crate) fn shard_of(hash: u64) -> usize {
    ((hash >> 51) & 63) as usize
}

/// Longest hash stored inline in a key.
const INLINE: usize = 8;

/// Hash bytes longer than [`INLINE`], behind one thin pointer.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct LongHash(Box<[u8]>);

/// A stored key: 16 bytes for hashes up to 8 bytes (the fingerprint's wire
/// form), a pointer to the bytes for longer ones.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum EntryKey {
    Inline {
        part: u32,
        len: u8,
        bytes: [u8; INLINE],
    },
    Heap {
        part: u32,
        bytes: Box<LongHash>,
    },
}

impl EntryKey {
    #[inline]
    pub(crate) fn new(part: u32, hash: &[u8]) -> Self {
        // The usual 8-byte hash: one word copy, no length-dependent memcpy
        // (a chain lookup builds one key per matched block for its LFU hits).
        if let Ok(bytes) = <[u8; INLINE]>::try_from(hash) {
            return EntryKey::Inline {
                part,
                len: INLINE as u8,
                bytes,
            };
        }
        if hash.len() <= INLINE {
            let mut bytes = [0u8; INLINE];
            bytes[..hash.len()].copy_from_slice(hash);
            EntryKey::Inline {
                part,
                len: hash.len() as u8,
                bytes,
            }
        } else {
            EntryKey::Heap {
                part,
                bytes: Box::new(LongHash(Box::from(hash))),
            }
        }
    }

    #[inline]
    pub(crate) fn part(&self) -> u32 {
        match self {
            EntryKey::Inline { part, .. } | EntryKey::Heap { part, .. } => *part,
        }
    }

    #[inline]
    pub(crate) fn hash_bytes(&self) -> &[u8] {
        match self {
            EntryKey::Inline { len, bytes, .. } => &bytes[..usize::from(*len)],
            EntryKey::Heap { bytes, .. } => &bytes.0,
        }
    }

    #[inline]
    pub(crate) fn matches(&self, part: u32, hash: &[u8]) -> bool {
        match self {
            EntryKey::Inline {
                part: p,
                len,
                bytes,
            } => {
                *p == part
                    && usize::from(*len) == hash.len()
                    && match <[u8; INLINE]>::try_from(hash) {
                        // One 8-byte compare instead of a memcmp call.
                        Ok(h) => u64::from_ne_bytes(*bytes) == u64::from_ne_bytes(h),
                        Err(_) => bytes.get(..hash.len()) == Some(hash),
                    }
            }
            EntryKey::Heap { part: p, bytes } => *p == part && *bytes.0 == *hash,
        }
    }

    /// The probe form of this key (recomputes the hash: table growth and LFU credit).
    #[inline]
    pub(crate) fn as_ref(&self) -> KeyRef<'_> {
        KeyRef::new(self.part(), self.hash_bytes())
    }
}

impl fmt::Debug for EntryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EntryKey({}, {:02x?})", self.part(), self.hash_bytes())
    }
}

/// A borrowed key with its hash, built on the stack for every probe.
#[derive(Clone, Copy)]
pub(crate) struct KeyRef<'a> {
    pub(crate) part: u32,
    pub(crate) bytes: &'a [u8],
    pub(crate) hash: u64,
}

impl<'a> KeyRef<'a> {
    #[inline]
    pub(crate) fn new(part: u32, bytes: &'a [u8]) -> Self {
        Self {
            part,
            bytes,
            hash: key_hash(part, bytes),
        }
    }

    pub(crate) fn to_key(self) -> EntryKey {
        EntryKey::new(self.part, self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_inline_and_heap() {
        for len in [0usize, 1, 7, 8, 9, 16, 33] {
            let bytes: Vec<u8> = (0..len as u8).collect();
            let k = EntryKey::new(7, &bytes);
            assert_eq!(k.part(), 7);
            assert_eq!(k.hash_bytes(), &bytes[..]);
            assert!(k.matches(7, &bytes));
            assert!(!k.matches(8, &bytes));
            assert_eq!(k.as_ref().hash, key_hash(7, &bytes));
        }
        assert_eq!(std::mem::size_of::<EntryKey>(), 16);
    }

    #[test]
    fn hash_separates_partitions_lengths_and_bytes() {
        let a = key_hash(1, &[0u8; 8]);
        assert_ne!(a, key_hash(2, &[0u8; 8]));
        assert_ne!(a, key_hash(1, &[0u8; 7]));
        assert_ne!(a, key_hash(1, &[0u8; 9]));
        assert_ne!(key_hash(1, &[1, 0, 0, 0, 0, 0, 0, 0]), a);
        // Low-entropy keys still reach every shard.
        let mut seen = [false; 64];
        for i in 0u64..4096 {
            seen[shard_of(KeyRef::new(0, &i.to_be_bytes()).hash)] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }
}

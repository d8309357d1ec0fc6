//! A small, fast, non-cryptographic hasher for the index's side maps (name
//! interning, stats). Entry keys have their own hash (`key.rs`).
//!
//! Folding 8-byte words with a multiply and finishing with the murmur3
//! `fmix64` avalanche spreads entropy to both the low bits (bucket index) and
//! the top bits (hashbrown's control byte).

use std::hash::{BuildHasher, Hasher};

const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// Murmur3 finalizer.
#[inline]
pub(crate) fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// Word-folding hasher.
#[derive(Default, Clone, Copy)]
pub(crate) struct FoldHasher {
    state: u64,
}

impl FoldHasher {
    #[inline]
    fn fold(&mut self, w: u64) {
        self.state = (self.state.rotate_left(23) ^ w).wrapping_mul(K);
    }
}

impl Hasher for FoldHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.fold(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.fold(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.fold(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.fold(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.fold(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.fold(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        fmix64(self.state)
    }
}

/// `BuildHasher` for [`FoldHasher`].
#[derive(Default, Clone, Copy)]
pub(crate) struct FoldBuild;

impl BuildHasher for FoldBuild {
    type Hasher = FoldHasher;
    #[inline]
    fn build_hasher(&self) -> FoldHasher {
        FoldHasher::default()
    }
}

/// Hash of a tuple of strings (length-prefixed so ("ab","c") ≠ ("a","bc")).
pub(crate) fn hash_strs(parts: &[&str]) -> u64 {
    let mut h = FoldHasher::default();
    for p in parts {
        h.write_usize(p.len());
        h.write(p.as_bytes());
    }
    h.finish()
}

//! Recycled buffers for LookupRoute answers on the wire. An answer ranking
//! 64 replicas is ~2.3 KB: past glibc's per-thread cache (1,032 bytes), so a
//! fresh buffer per call took the allocator's slow path, which also
//! consolidates its fast bins (issue 36). The answer is handed to hyper as
//! [`Bytes`] owning a [`Recycled`] buffer; when the connection has written
//! it and drops it, the buffer goes back to the dropping thread's pool for
//! the next answer encoded there.
//!
//! A pool holds at most [`KEEP`] buffers of at most [`KEEP_BYTES`] each, so
//! a burst of large answers does not pin memory on a thread.

use bytes::Bytes;
use std::cell::RefCell;

/// Buffers a thread keeps.
const KEEP: usize = 16;
/// The largest buffer kept.
const KEEP_BYTES: usize = 64 * 1024;

thread_local! {
    static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer: the thread's last recycled one, else a new one.
pub(crate) fn take() -> Vec<u8> {
    POOL.try_with(|p| p.try_borrow_mut().ok().and_then(|mut p| p.pop()))
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// `buf` as `Bytes` that give the buffer back to the pool when dropped.
pub(crate) fn freeze(buf: Vec<u8>) -> Bytes {
    Bytes::from_owner(Recycled(buf))
}

/// A buffer that goes back to the pool of the thread that drops it.
struct Recycled(Vec<u8>);

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        let mut buf = std::mem::take(&mut self.0);
        if buf.capacity() == 0 || buf.capacity() > KEEP_BYTES {
            return;
        }
        buf.clear();
        // During the thread's teardown the pool may be gone: the buffer is
        // then freed as usual.
        let _ = POOL.try_with(|p| {
            if let Ok(mut p) = p.try_borrow_mut() {
                if p.len() < KEEP {
                    p.push(buf);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_answer_gives_its_buffer_back() {
        let mut buf = take();
        buf.extend_from_slice(&[7; 3000]);
        let ptr = buf.as_ptr();
        let bytes = freeze(buf);
        assert_eq!(&bytes[..], &[7; 3000][..]);
        let clone = bytes.clone();
        drop(bytes);
        assert_eq!(clone.len(), 3000, "a clone keeps the buffer alive");
        drop(clone);
        let again = take();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), ptr, "the same buffer, recycled");
        assert!(again.capacity() >= 3000);
    }

    #[test]
    fn the_pool_is_bounded() {
        let answers: Vec<Bytes> = (0..KEEP + 4)
            .map(|_| {
                let mut b = take();
                b.push(1);
                freeze(b)
            })
            .collect();
        let mut huge = Vec::with_capacity(KEEP_BYTES + 1);
        huge.push(1);
        drop(freeze(huge));
        drop(answers);
        let kept = POOL.with(|p| p.borrow().len());
        assert_eq!(kept, KEEP);
        assert!(POOL.with(|p| p.borrow().iter().all(|b| b.capacity() <= KEEP_BYTES)));
    }
}

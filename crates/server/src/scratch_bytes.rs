//! A per-thread byte buffer for assembling a message before one copy into
//! its destination (the LookupRoute answer, `lookup_wire/encode.rs`).
//!
//! Taken and put back, so a re-entered use (none today) gets an empty one
//! of its own rather than a borrow error; one larger than
//! [`KEEP_BYTES`] is not kept, so a rare huge answer does not pin its
//! memory on the thread.

use std::cell::Cell;

/// The largest buffer a thread keeps between uses.
const KEEP_BYTES: usize = 64 * 1024;

thread_local! {
    static BUF: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Runs `f` on the thread's buffer, empty.
pub(crate) fn with<T>(f: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    let mut buf = BUF.with(Cell::take);
    buf.clear();
    let out = f(&mut buf);
    if buf.capacity() <= KEEP_BYTES {
        BUF.with(|c| c.set(buf));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_nested_use_gets_its_own_empty_buffer() {
        super::with(|outer| {
            outer.extend_from_slice(b"outer");
            super::with(|inner| {
                assert!(inner.is_empty());
                inner.push(1);
            });
            assert_eq!(outer.as_slice(), b"outer");
        });
    }
}

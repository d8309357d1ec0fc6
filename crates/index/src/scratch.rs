//! Per-thread scratch buffers for the lookup path: a lookup borrows its
//! thread's buffer instead of allocating one.

use std::cell::RefCell;
use std::thread::LocalKey;

/// Runs `f` on the thread's buffer `key`, or on a fresh one if the buffer
/// is already borrowed (only if a lookup re-entered itself on the thread).
#[inline]
pub(crate) fn with<S: Default + 'static, T>(
    key: &'static LocalKey<RefCell<S>>,
    f: impl FnOnce(&mut S) -> T,
) -> T {
    key.with(|s| match s.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut S::default()),
    })
}

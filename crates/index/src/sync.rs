//! Lock helpers shared by every store: poison-tolerant (a panic elsewhere
//! never wedges the index) and, for the entry stores' hot locks, spinning
//! a while before they block.
//!
//! This module imports nothing of the crate, so every store may use it
//! without forming an import circle.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

/// Lock attempts before a reader or writer blocks (about 10-30 us of spinning).
const LOCK_RETRIES: usize = 1_000;

/// A read lock tried [`LOCK_RETRIES`] times before the caller blocks: a
/// lock held for a few microseconds is cheaper to wait out spinning than
/// asleep (a sleeping waiter costs the holder a wake-up system call).
#[inline]
pub(crate) fn read_spinning<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    spin(|| l.try_read(), || read(l))
}

/// [`read_spinning`] for the write lock. A writer that finds the lock
/// read-locked retries for a while before it blocks: a chain lookup holds
/// a read lock for a microsecond or two, longer than the lock's own spin,
/// and a writer that went to sleep costs that reader a wake-up system call
/// on its unlock. After the retries it blocks, so a stream of readers
/// cannot starve it.
#[inline]
pub(crate) fn write_spinning<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    spin(|| l.try_write(), || write(l))
}

/// `try_lock` up to [`LOCK_RETRIES`] times (a poisoned lock is taken as
/// it is), then `lock`.
#[inline]
fn spin<G>(try_lock: impl Fn() -> Result<G, TryLockError<G>>, lock: impl FnOnce() -> G) -> G {
    for _ in 0..LOCK_RETRIES {
        match try_lock() {
            Ok(g) => return g,
            Err(TryLockError::Poisoned(e)) => return e.into_inner(),
            Err(TryLockError::WouldBlock) => std::hint::spin_loop(),
        }
    }
    lock()
}

/// A read lock if it is free now (poison-tolerant), `None` if a writer
/// holds it: for a check that must not wait.
#[inline]
pub(crate) fn try_read_now<T>(l: &RwLock<T>) -> Option<RwLockReadGuard<'_, T>> {
    match l.try_read() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// A read lock, poison-tolerant.
pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

/// See [`read`].
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

/// See [`read`].
pub(crate) fn lock<T>(l: &Mutex<T>) -> MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

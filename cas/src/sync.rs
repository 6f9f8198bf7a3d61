//! Locking as the whole crate does it.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, also when a thread panicked while holding it: every structure
/// behind a lock here stays consistent between statements that could
/// panic, and a poisoned lock must not take the rest of the store down.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

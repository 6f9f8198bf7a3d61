//! Compaction memory: one budget shared by every pass of a store, leases
//! taken from it as buffers grow, and the growable buffers themselves.
//!
//! ```text
//!  memory_budget_bytes  = chunk index budget + compaction_memory_bytes
//!                                              |
//!   Budget (compaction_memory_bytes) ----------+
//!     Lease (reader thread): batch buffers, batch map, extra blocks
//!     Lease (inserter thread): merge scratch
//! ```
//!
//! Nothing is allocated up front: a [`GrowBuf`] starts empty and grows to
//! what a batch needs (its new bytes zeroed once, counted as initialised),
//! then is reused for the next batch without being cleared again. Every
//! growth is charged to a [`Lease`] first; a refused growth either ends the
//! batch early (a smaller batch: back-pressure) or, when not even one
//! record fits, waits a bounded time for other passes to return memory and
//! then fails with `Error::MemoryBudget` (the service retries later).

use crate::error::{Error, Result};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Buffer growth granularity.
const GROW_STEP_BYTES: usize = 64 << 10;

/// The compaction memory budget of a store.
pub struct Budget {
    limit_bytes: u64,
    used: Mutex<u64>,
    freed: Condvar,
}

fn lock(m: &Mutex<u64>) -> MutexGuard<'_, u64> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Budget {
    pub fn new(limit_bytes: u64) -> Budget {
        Budget { limit_bytes, used: Mutex::new(0), freed: Condvar::new() }
    }

    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes
    }

    /// Bytes leased right now.
    pub fn used_bytes(&self) -> u64 {
        *lock(&self.used)
    }

    /// An empty lease; it grows with `Lease::grow`.
    pub fn lease(&self) -> Lease<'_> {
        Lease { budget: self, bytes: 0 }
    }
}

/// Bytes taken from a [`Budget`]; returned when dropped.
pub struct Lease<'a> {
    budget: &'a Budget,
    bytes: u64,
}

impl Lease<'_> {
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn refused(&self, more: u64, used: u64) -> Error {
        Error::MemoryBudget(format!(
            "compaction needs {more} more bytes; {used} of its {} are in use",
            self.budget.limit_bytes
        ))
    }

    /// Takes `more` bytes if they fit now; never waits.
    pub fn grow(&mut self, more: u64) -> Result<()> {
        let mut used = lock(&self.budget.used);
        if *used + more > self.budget.limit_bytes {
            return Err(self.refused(more, *used));
        }
        *used += more;
        self.bytes += more;
        Ok(())
    }

    /// Returns `less` bytes early (memory freed while the lease lives on).
    pub fn shrink(&mut self, less: u64) {
        assert!(less <= self.bytes, "returning more than the lease holds");
        if less > 0 {
            self.bytes -= less;
            *lock(&self.budget.used) -= less;
            self.budget.freed.notify_all();
        }
    }

    /// Takes `more` bytes, waiting up to `wait` for other leases to return
    /// memory.
    pub fn grow_waiting(&mut self, more: u64, wait: Duration) -> Result<()> {
        let deadline = Instant::now() + wait;
        let mut used = lock(&self.budget.used);
        loop {
            if *used + more <= self.budget.limit_bytes {
                *used += more;
                self.bytes += more;
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(self.refused(more, *used));
            }
            used = self.budget.freed.wait_timeout(used, deadline - now).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            *lock(&self.budget.used) -= self.bytes;
            self.budget.freed.notify_all();
        }
    }
}

/// A byte buffer that grows as needed and is reused without clearing:
/// `len` is the part in use, the bytes past it were initialised by an
/// earlier growth and are simply overwritten next time.
#[derive(Default)]
pub struct GrowBuf {
    data: Vec<u8>,
    len: usize,
}

impl GrowBuf {
    pub fn new() -> GrowBuf {
        GrowBuf::default()
    }

    /// Bytes in use.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Forgets the contents (keeps the memory for reuse).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The bytes in use.
    pub fn as_slice(&self) -> &[u8] {
        &self.data[..self.len]
    }

    /// Returns `n` writable bytes after the part in use, growing the buffer
    /// if needed: the growth is charged to `lease` first (refused growth is
    /// `Error::MemoryBudget`, nothing changed) and its new bytes are zeroed
    /// once and added to `initialized`. Call [`GrowBuf::advance`] with the
    /// bytes actually filled.
    pub fn spare(&mut self, n: usize, lease: &mut Lease<'_>, initialized: &mut u64) -> Result<&mut [u8]> {
        let need = self.len + n;
        if need > self.data.len() {
            if need > self.data.capacity() {
                // Grow by a quarter at least (amortised), in 64 KiB steps,
                // charged at the capacity actually taken: close to what the
                // batch needs, never a doubling past the budget.
                let cap = self.data.capacity();
                let target = need.max(cap + cap / 4).next_multiple_of(GROW_STEP_BYTES);
                lease.grow((target - self.data.capacity()) as u64)?;
                self.data.reserve_exact(target - self.data.len());
            }
            *initialized += (need - self.data.len()) as u64;
            self.data.resize(need, 0);
        }
        Ok(&mut self.data[self.len..need])
    }

    /// Marks `n` more bytes (filled through `spare`) as in use.
    pub fn advance(&mut self, n: usize) {
        assert!(self.len + n <= self.data.len(), "advanced past the spare bytes");
        self.len += n;
    }

    /// Appends `bytes` (see `spare`).
    pub fn extend(&mut self, bytes: &[u8], lease: &mut Lease<'_>, initialized: &mut u64) -> Result<()> {
        self.spare(bytes.len(), lease, initialized)?.copy_from_slice(bytes);
        self.advance(bytes.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_respect_the_limit_and_return_on_drop() {
        let b = Budget::new(1000);
        let mut l1 = b.lease();
        l1.grow(600).unwrap();
        let mut l2 = b.lease();
        assert!(matches!(l2.grow(500), Err(Error::MemoryBudget(_))));
        assert!(l2.grow_waiting(500, Duration::from_millis(10)).is_err());
        drop(l1);
        l2.grow(500).unwrap();
        assert_eq!(b.used_bytes(), 500);
    }

    #[test]
    fn growbuf_initialises_only_new_bytes_once() {
        let b = Budget::new(1 << 30);
        let mut lease = b.lease();
        let mut init = 0;
        let mut g = GrowBuf::new();
        g.extend(&[1; 100], &mut lease, &mut init).unwrap();
        assert_eq!(init, 100);
        g.clear();
        g.extend(&[2; 100], &mut lease, &mut init).unwrap();
        assert_eq!(init, 100, "reuse does not re-initialise");
        g.extend(&[3; 50], &mut lease, &mut init).unwrap();
        assert_eq!(init, 150);
        assert_eq!(g.as_slice().len(), 150);
        assert!(lease.bytes() >= 150);
        let small = Budget::new(10);
        let mut l = small.lease();
        assert!(GrowBuf::new().spare(100, &mut l, &mut init).is_err());
    }
}

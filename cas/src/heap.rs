//! Hands the allocator's free memory back to the kernel once the store's
//! large transient work is over.
//!
//! A compaction pass (batch buffers, a manifest edit's pages) and a GC pass
//! (its mark sets) allocate tens of MiB and free them when they end. glibc
//! keeps what they freed inside its arenas unless it lies at the top of the
//! heap, so a daemon's resident memory ratchets up to its highest transient
//! and stays there (natively, the device benchmark's phases: 80 MiB
//! resident at rest, 28 MiB of it free inside the arenas). `malloc_trim`
//! returns every free page of every arena.
//!
//! It runs when a pass ends, at most once per [`MIN_INTERVAL`] for the
//! whole process ([`PROCESS`]). It walks every arena under that arena's
//! lock, so it is kept off every request's path and out of tight loops.
//! Its cost is one `madvise` per free run: natively 5.5 ms for 56 MiB free
//! in 2,048 runs of 28 KiB, 0.3 ms when called again with nothing to
//! return; a thread allocating from an arena being walked waits at most
//! that long.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The shortest time between two trims the store asks for.
pub const MIN_INTERVAL: Duration = Duration::from_secs(1);

/// Trims at most once per interval, whoever asks.
pub struct Trimmer {
    interval: Duration,
    last: Mutex<Option<Instant>>,
}

/// The one every store in the process shares: the arenas are the process's.
pub static PROCESS: Trimmer = Trimmer::new(MIN_INTERVAL);

impl Trimmer {
    pub const fn new(interval: Duration) -> Trimmer {
        Trimmer { interval, last: Mutex::new(None) }
    }

    /// Returns the allocator's free pages to the kernel if the last trim
    /// was at least the interval before `now`; true if it trimmed. Never
    /// trims where the allocator is not glibc's.
    pub fn release_free(&self, now: Instant) -> bool {
        {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|t| now.saturating_duration_since(t) < self.interval) {
                return false;
            }
            *last = Some(now);
        }
        trim()
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // malloc_trim: see below
fn trim() -> bool {
    // SAFETY: malloc_trim takes an integer and only touches the
    // allocator's own state, under its own locks.
    unsafe { libc::malloc_trim(0) };
    true
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() -> bool {
    false
}

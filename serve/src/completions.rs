//! Results on their way back to their queue thread.
//!
//! On kernels before 6.16 only a queue's own thread may commit its tags,
//! so a worker that finished a request posts a [`Done`] to that queue's
//! [`Completions`] and writes the queue's eventfd; the queue thread drains
//! the posted results when the eventfd wakes it, and commits them.
//!
//! ```text
//!  worker thread                          queue thread (owns the ring)
//!  execute on cas                         waits on eventfd()
//!  Completions::post(Done) --eventfd-->   drain() -> commit each result
//! ```

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

/// A finished request on its way back to its queue thread.
pub struct Done {
    pub tag: u16,
    /// Bytes transferred, or a negative errno.
    pub result: i32,
    pub trace: trace::RequestTrace,
}

/// Results posted by workers for one queue, and the eventfd that wakes it.
pub struct Completions {
    done: Mutex<Vec<Done>>,
    efd: OwnedFd,
}

impl Completions {
    pub fn new() -> std::io::Result<Completions> {
        let efd = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)?;
        Ok(Completions { done: Mutex::new(Vec::new()), efd })
    }

    /// Posts a result and wakes the queue thread. The list holds at most
    /// one entry per tag, since a tag has one request in flight.
    pub fn post(&self, done: Done) {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).push(done);
        self.kick();
    }

    /// Wakes the queue thread without a result (used at shutdown).
    pub fn kick(&self) {
        // An eventfd write only fails if the counter would overflow, which
        // takes 2^64 - 1 unread kicks; the reader drains it on every wake.
        let _ = rustix::io::write(&self.efd, &1u64.to_ne_bytes());
    }

    pub fn drain(&self) -> Vec<Done> {
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub fn eventfd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.efd.as_fd()
    }
}

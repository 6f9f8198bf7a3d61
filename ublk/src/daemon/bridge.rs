//! Handing requests between a queue thread and the worker pool.
//!
//! On kernels before 6.16 only a queue's own thread may commit its tags,
//! so a worker that finished a request posts a [`Done`] to that queue's
//! [`Completions`] and writes the queue's eventfd. The queue thread keeps a
//! read of that eventfd in flight on its own io_uring; when it completes,
//! the thread drains the posted results and wakes the tag tasks waiting for
//! them ([`LocalSlots`]), which then commit to the kernel.
//!
//! ```text
//!  worker thread                          queue thread (owns the ring)
//!  execute on cas                         tag task: submit to sched, await slot
//!  Completions::post(Done) --eventfd-->   efd task: read completes, drain(),
//!                                         LocalSlots::fill(tag) -> wake tag task
//! ```
//!
//! Request payloads never move: the per-tag io buffers ([`TagBuffers`]) are
//! shared with the workers, who read a WRITE's data from, and write a READ's
//! data into, the buffer the kernel filled or will copy from.

use libublk::helpers::IoBuf;
use std::cell::RefCell;
use std::future::Future;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

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

/// The io buffers of one queue, one per tag, shared with the workers.
pub struct TagBuffers {
    bufs: Vec<IoBuf<u8>>,
}

impl TagBuffers {
    pub fn new(tags: usize, bytes: usize) -> TagBuffers {
        TagBuffers { bufs: (0..tags).map(|_| IoBuf::new(bytes)).collect() }
    }

    /// The buffer of `tag`, for registering with and committing to the kernel.
    pub fn buf(&self, tag: u16) -> &IoBuf<u8> {
        &self.bufs[usize::from(tag)]
    }

    /// The first `len` bytes of `tag`'s buffer, for the party serving it.
    ///
    /// # Safety
    /// The caller must be the one party serving `tag`'s current request:
    /// either the queue thread serving a read in place (it stops using the
    /// buffer before handing the read to a worker) or a write in place, or
    /// the one worker (or
    /// sync thread, for FLUSH and FUA) the request went to, until it posts
    /// the result (the queue thread does not touch the buffer meanwhile). The kernel reads or writes the buffer
    /// only before the request is delivered and after its result is
    /// committed.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn request_bytes(&self, tag: u16, len: usize) -> &mut [u8] {
        let buf = &self.bufs[usize::from(tag)];
        assert!(len <= buf.len(), "request of {len} bytes exceeds the {} byte io buffer", buf.len());
        // SAFETY: the buffer is a live allocation of at least `len` bytes
        // owned by `self`; exclusivity is the caller's contract above.
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr(), len) }
    }
}

/// Per-tag mailboxes on the queue thread: the efd task fills them, the tag
/// tasks wait on them. Single-threaded by construction (queue thread only).
pub struct LocalSlots {
    slots: Vec<RefCell<Slot>>,
}

#[derive(Default)]
struct Slot {
    done: Option<Done>,
    waker: Option<Waker>,
}

impl LocalSlots {
    pub fn new(tags: usize) -> LocalSlots {
        LocalSlots { slots: (0..tags).map(|_| RefCell::new(Slot::default())).collect() }
    }

    pub fn fill(&self, done: Done) {
        let mut slot = self.slots[usize::from(done.tag)].borrow_mut();
        assert!(slot.done.is_none(), "tag {} completed twice", done.tag);
        slot.done = Some(done);
        if let Some(w) = slot.waker.take() {
            w.wake();
        }
    }

    /// Waits for `tag`'s result.
    pub fn wait(&self, tag: u16) -> WaitDone<'_> {
        WaitDone { slot: &self.slots[usize::from(tag)] }
    }
}

pub struct WaitDone<'a> {
    slot: &'a RefCell<Slot>,
}

impl Future for WaitDone<'_> {
    type Output = Done;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Done> {
        let mut slot = self.slot.borrow_mut();
        match slot.done.take() {
            Some(done) => Poll::Ready(done),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

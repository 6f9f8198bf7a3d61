//! The queue thread's side of handing requests to the worker pool
//! (`serve`): the tag buffers it registers with the kernel, and the
//! per-tag mailboxes its tasks wait on for `serve::Done` results.
//!
//! On kernels before 6.16 only a queue's own thread may commit its tags,
//! so a worker that finished a request posts a [`Done`] to that queue's
//! [`serve::Completions`] and writes the queue's eventfd. The queue thread keeps a
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
//! Request data ([`TagBuffers`]): without user copy, the per-tag io buffers
//! registered with the kernel, shared with the workers, who read a WRITE's
//! data from, and write a READ's data into, the buffer of the request's tag;
//! the kernel fills a write's buffer before delivering it and copies a
//! read's out at the commit. Where the driver has user copy
//! (`UBLK_F_USER_COPY`, Linux 6.5+) the kernel is given no buffer: the
//! thread that executes a write reads its data from the char device into
//! its own staging buffer (`staging`), and the thread that serves a read
//! writes its data there from its staging buffer, so a write waiting for
//! log capacity holds none of its data in the daemon, and the resident
//! bytes follow the serving threads, not the tags.

use libublk::helpers::IoBuf;
use serve::Done;
use std::cell::RefCell;
use std::fs::File;
use std::future::Future;
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;
use std::task::{Context, Poll, Waker};

/// The io buffers of one queue, one per tag, shared with the workers
/// (`serve::TagBuffers`): registered with the kernel, or filled and
/// drained through the char device with user copy.
pub struct TagBuffers {
    qid: u16,
    bufs: Vec<IoBuf<u8>>,
    /// How request data meets the kernel. The queue thread of a device
    /// with user copy sets `User` before its first request and `Stopped`
    /// before it returns (the fd is libublk's and closes after that), so a
    /// worker still finishing a request of a stopped queue gets an error
    /// instead of a closed or reused fd.
    copy: RwLock<DataCopy>,
    /// Set with `DataCopy::User` (and kept when stopped): request data is
    /// staged in the serving thread's buffer, never in `bufs`. Not read
    /// from `copy`: `pass_data` holds that lock while it asks for the
    /// bytes, and a second read of it could wait behind a queued writer.
    staged: AtomicBool,
}

/// How a queue's request data passes between the kernel and its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataCopy {
    /// The kernel copies into and out of the registered buffers.
    Kernel,
    /// Through this char device (user copy), by whoever serves the request.
    User(RawFd),
    /// User copy, and the queue has stopped: nothing passes any more.
    Stopped,
}

impl TagBuffers {
    pub fn new(qid: u16, tags: usize, bytes: usize) -> TagBuffers {
        TagBuffers {
            qid,
            bufs: (0..tags).map(|_| IoBuf::new(bytes)).collect(),
            copy: RwLock::new(DataCopy::Kernel),
            staged: AtomicBool::new(false),
        }
    }

    /// The buffer of `tag`, for registering with and committing to the kernel.
    pub fn buf(&self, tag: u16) -> &IoBuf<u8> {
        &self.bufs[usize::from(tag)]
    }

    /// From now on request data passes as `copy` says (the queue thread
    /// sets it as it starts and ends).
    pub fn set_copy(&self, copy: DataCopy) {
        let mut mode = self.copy.write().unwrap_or_else(|p| p.into_inner());
        if copy != DataCopy::Kernel {
            self.staged.store(true, Ordering::Release);
        }
        *mode = copy;
    }

    /// Whether request data is staged per thread (user copy).
    fn staged(&self) -> bool {
        self.staged.load(Ordering::Acquire)
    }

    /// Moves `tag`'s first `len` bytes between its buffer and the request
    /// (`to_kernel`: a read's data; else a write's), through the char
    /// device; nothing without user copy.
    fn pass_data(&self, tag: u16, len: usize, to_kernel: bool) -> std::io::Result<()> {
        // Held across the copy: the fd stays open meanwhile (see the `copy` field).
        let guard = self.copy.read().unwrap_or_else(|p| p.into_inner());
        let fd = match *guard {
            DataCopy::Kernel => return Ok(()),
            DataCopy::Stopped => return Err(std::io::Error::other("the device's queue has stopped")),
            DataCopy::User(fd) => fd,
        };
        if len == 0 {
            return Ok(());
        }
        // The kernel's name for this request's data (ublk_cmd.h).
        let pos = libublk::io::UblkIOCtx::ublk_user_copy_pos(self.qid, tag, 0);
        // SAFETY: `fd` is open while the guard is held;
        // ManuallyDrop keeps this File from closing it.
        let cdev = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
        // SAFETY: the caller serves `tag` (serve::TagBuffers' contract).
        let bytes = unsafe { serve::TagBuffers::request_bytes(self, tag, len) };
        if to_kernel {
            cdev.write_all_at(bytes, pos)
        } else {
            cdev.read_exact_at(bytes, pos)
        }
    }

    /// Returns to the kernel the pages of `tag`'s buffer past its first
    /// [`super::staging::RESIDENT_BYTES`], after a write of `len_bytes`
    /// whose data has moved on into the engine, before the tag is committed
    /// (after the commit the kernel may already be filling the buffer with
    /// the next request). Without it every tag that ever took a large write keeps
    /// its whole buffer resident: 64 MiB per device at the defaults. Only
    /// without user copy (with it the tag buffers stay untouched) and after
    /// writes: a read's data is still to be copied out at the commit.
    pub fn release_after(&self, tag: u16, len_bytes: u64) {
        let len = usize::try_from(len_bytes).unwrap_or(usize::MAX);
        // SAFETY: nothing uses the tag's buffer now: the write's data has
        // moved on into the engine, and the buffer is filled again only
        // for the tag's next request, after the commit.
        unsafe { super::staging::release_tail(&self.bufs[usize::from(tag)], len) }
    }
}

impl serve::TagBuffers for TagBuffers {
    unsafe fn load_write(&self, tag: u16, len: usize) -> std::io::Result<()> {
        self.pass_data(tag, len, false)
    }

    unsafe fn store_read(&self, tag: u16, len: usize) -> std::io::Result<()> {
        self.pass_data(tag, len, true)
    }

    unsafe fn request_bytes(&self, tag: u16, len: usize) -> &mut [u8] {
        let buf = &self.bufs[usize::from(tag)];
        assert!(len <= buf.len(), "request of {len} bytes exceeds the {} byte io buffer", buf.len());
        if self.staged() {
            // SAFETY: the caller serves `tag` on this thread, and uses the
            // bytes only while it does (serve::TagBuffers::request_bytes),
            // which is `staging::bytes`' contract.
            return unsafe { super::staging::bytes(len, buf.len()) };
        }
        // SAFETY: the buffer is a live allocation of at least `len` bytes
        // owned by `self`; exclusivity is the caller's contract
        // (serve::TagBuffers::request_bytes).
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr(), len) }
    }

    unsafe fn finished(&self, _tag: u16, len: usize) {
        if self.staged() {
            // SAFETY: the caller is done with the request's bytes
            // (serve::TagBuffers::finished).
            unsafe { super::staging::finished(len) }
        }
    }

    fn tags(&self) -> usize {
        self.bufs.len()
    }

    fn min_bytes(&self) -> usize {
        self.bufs.iter().map(|b| b.len()).min().unwrap_or(0)
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

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
//! Request payloads never move: the per-tag io buffers ([`TagBuffers`]) are
//! shared with the workers, who read a WRITE's data from, and write a READ's
//! data into, the buffer the kernel filled or will copy from.

use libublk::helpers::IoBuf;
use serve::Done;
use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// The io buffers of one queue, one per tag, registered with the kernel
/// and shared with the workers (`serve::TagBuffers`).
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

    /// Returns to the kernel the pages of `tag`'s buffer past its first
    /// [`RESIDENT_BYTES_PER_TAG`], after a write of `len_bytes` whose data
    /// the engine has consumed, before the tag is committed (after the
    /// commit the kernel may already be filling the buffer with the next
    /// request). Without it every tag that ever took a large write keeps
    /// its whole buffer resident: 64 MiB per device at the defaults.
    /// Small writes, and reads (whose data the kernel copies out during
    /// the commit), keep their pages.
    pub fn release_after_write(&self, tag: u16, len_bytes: u64) {
        const PAGE_BYTES: usize = 4096;
        let buf = &self.bufs[usize::from(tag)];
        // Whole pages only, and none past the allocation's end.
        let whole_pages = buf.len() / PAGE_BYTES * PAGE_BYTES;
        let end = usize::try_from(len_bytes).unwrap_or(usize::MAX).saturating_add(PAGE_BYTES - 1)
            / PAGE_BYTES
            * PAGE_BYTES;
        let end = end.min(whole_pages);
        if end <= RESIDENT_BYTES_PER_TAG {
            return;
        }
        // SAFETY: [RESIDENT_BYTES_PER_TAG, end) is whole pages inside the
        // tag's live allocation (IoBuf aligns it to 4096; `end` is at most
        // its length rounded down to a page). Nothing reads the range now:
        // the worker is done with this write and the kernel fills the
        // buffer again only after the commit. MADV_DONTNEED leaves the
        // range mapped, reading as zeros until written.
        let rc = unsafe {
            libc::madvise(
                buf.as_mut_ptr().add(RESIDENT_BYTES_PER_TAG).cast(),
                end - RESIDENT_BYTES_PER_TAG,
                libc::MADV_DONTNEED,
            )
        };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), "madvise of a tag buffer failed");
        }
    }
}

/// Bytes of each tag buffer kept resident between requests: enough for
/// the small requests that dominate random IO, so those never fault.
pub const RESIDENT_BYTES_PER_TAG: usize = 64 << 10;

impl serve::TagBuffers for TagBuffers {
    unsafe fn request_bytes(&self, tag: u16, len: usize) -> &mut [u8] {
        let buf = &self.bufs[usize::from(tag)];
        assert!(len <= buf.len(), "request of {len} bytes exceeds the {} byte io buffer", buf.len());
        // SAFETY: the buffer is a live allocation of at least `len` bytes
        // owned by `self`; exclusivity is the caller's contract
        // (serve::TagBuffers::request_bytes).
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr(), len) }
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

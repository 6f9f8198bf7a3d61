//! Where a request's data waits, on the thread serving it, when the device
//! has user copy: one buffer per serving thread instead of one per tag.
//!
//! With user copy the kernel never touches the daemon's memory: the thread
//! that executes a write reads its data from the char device into a
//! buffer, hands it to the engine and is done with it; the thread that
//! serves a read fills a buffer and writes it to the char device. Both
//! happen on one thread, within one call of the request path, so the
//! buffer needs to live no longer than that. A per-tag buffer kept those
//! bytes for the tag's whole life: every tag that ever took a request
//! kept up to [`RESIDENT_BYTES`] resident (8 MiB per queue of 128 tags),
//! for a device served by a handful of threads (the queue thread, the
//! workers, the sync threads). Here the resident bytes are bounded by
//! the threads, not the tags, and shared by every device they serve.
//!
//! ```text
//!  thread serving (qid, tag)     request_bytes(len) -> this thread's buffer
//!                                load_write / store_read through the char device
//!                                finished(len) -> pages past RESIDENT_BYTES go back
//! ```

#![allow(unsafe_code)] // a thread-local buffer lent out as a slice

use libublk::helpers::IoBuf;
use std::cell::UnsafeCell;

/// Bytes of a thread's buffer kept resident between requests: enough for
/// the small requests that dominate random IO, so those never fault.
pub const RESIDENT_BYTES: usize = 64 << 10;

const PAGE_BYTES: usize = 4096;

thread_local! {
    /// The calling thread's staging buffer, allocated at its first use
    /// and replaced by a larger one when a longer request comes.
    static BUFFER: UnsafeCell<Option<IoBuf<u8>>> = const { UnsafeCell::new(None) };
}

/// The first `len` bytes of the calling thread's buffer, which holds at
/// least `capacity_bytes` (a device's largest request), so that requests
/// of one device never make it grow again.
///
/// # Safety
/// The slice is the calling thread's, for the one request it serves now:
/// the caller drops it before this thread serves another request or calls
/// [`finished`]. Two calls for the same request (the copy from the char
/// device, then the engine's write) see the same bytes; no other thread
/// ever sees them.
#[allow(clippy::mut_from_ref)]
pub unsafe fn bytes<'a>(len: usize, capacity_bytes: usize) -> &'a mut [u8] {
    BUFFER.with(|cell| {
        // SAFETY: the cell is this thread's, and no slice of it is alive
        // when it is replaced (this function's contract).
        let slot = unsafe { &mut *cell.get() };
        if slot.as_ref().is_none_or(|b| b.len() < len) {
            *slot = Some(IoBuf::new(len.max(capacity_bytes).max(PAGE_BYTES)));
        }
        let buf = slot.as_ref().expect("allocated above");
        // SAFETY: a live allocation of at least `len` bytes that this
        // thread alone uses (contract above).
        unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr(), len) }
    })
}

/// The calling thread is done with a request of `len_bytes`: the pages of
/// its buffer past [`RESIDENT_BYTES`] that the request may have touched go
/// back to the kernel (reading as zeros until written again).
///
/// # Safety
/// No slice from [`bytes`] is alive on this thread.
pub unsafe fn finished(len_bytes: usize) {
    BUFFER.with(|cell| {
        // SAFETY: no slice of the buffer is alive (contract above).
        if let Some(buf) = unsafe { &*cell.get() } {
            // SAFETY: as above: nothing uses the buffer now.
            unsafe { release_tail(buf, len_bytes) }
        }
    })
}

/// Returns to the kernel the pages of `buf` past [`RESIDENT_BYTES`] that a
/// request of `len_bytes` may have touched: whole pages only, none past the
/// allocation's end. They stay mapped and read as zeros until written.
///
/// # Safety
/// Nothing reads or writes that range of `buf` meanwhile.
pub(super) unsafe fn release_tail(buf: &IoBuf<u8>, len_bytes: usize) {
    let end = len_bytes.saturating_add(PAGE_BYTES - 1) / PAGE_BYTES * PAGE_BYTES;
    let end = end.min(buf.len() / PAGE_BYTES * PAGE_BYTES);
    if end <= RESIDENT_BYTES {
        return;
    }
    // SAFETY: [RESIDENT_BYTES, end) is whole pages inside the live
    // allocation (IoBuf aligns it to 4096), unused meanwhile (contract).
    let rc = unsafe {
        libc::madvise(buf.as_mut_ptr().add(RESIDENT_BYTES).cast(), end - RESIDENT_BYTES, libc::MADV_DONTNEED)
    };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "madvise of an io buffer failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`bytes`] for these tests, which drop each slice before their next
    /// call on the thread.
    fn lend(len: usize, capacity_bytes: usize) -> &'static mut [u8] {
        // SAFETY: as said above.
        unsafe { bytes(len, capacity_bytes) }
    }

    /// [`finished`] for these tests (no slice alive across it).
    fn done(len: usize) {
        // SAFETY: as said above.
        unsafe { finished(len) }
    }

    /// Pages of `[ptr, ptr + len)` resident, by mincore.
    fn resident_pages(ptr: *const u8, len: usize) -> usize {
        let mut vec = vec![0u8; len.div_ceil(PAGE_BYTES)];
        // SAFETY: the range is one live mapping (the test's buffer).
        let rc = unsafe { libc::mincore(ptr as *mut _, len, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn a_thread_keeps_its_bytes_between_calls_and_returns_the_tail() {
        std::thread::spawn(|| {
            let b = lend(512 << 10, 512 << 10);
            b.fill(7);
            let ptr = b.as_ptr();
            // The second call of one request sees the same bytes.
            let again = lend(512 << 10, 512 << 10);
            assert_eq!(again.as_ptr(), ptr);
            assert!(again.iter().all(|&x| x == 7));
            assert_eq!(resident_pages(ptr, 512 << 10), 128);
            done(512 << 10);
            assert_eq!(resident_pages(ptr, 512 << 10), RESIDENT_BYTES / PAGE_BYTES);
            // A request within the resident part keeps its bytes.
            let small = lend(4096, 512 << 10);
            assert_eq!(small.as_ptr(), ptr);
            assert_eq!(small[0], 7);
            done(4096);
            assert_eq!(resident_pages(ptr, 512 << 10), RESIDENT_BYTES / PAGE_BYTES);
            // Past the tail the bytes read as zeros.
            let whole = lend(512 << 10, 512 << 10);
            assert_eq!(whole[RESIDENT_BYTES], 0);
            assert_eq!(whole[RESIDENT_BYTES - 1], 7);
            // A longer request gets a larger buffer.
            let longer = lend(1 << 20, 512 << 10);
            assert_eq!(longer.len(), 1 << 20);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn threads_get_their_own_buffers() {
        // Two threads alive at once never share a buffer.
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let spawn = |barrier: std::sync::Arc<std::sync::Barrier>| {
            std::thread::spawn(move || {
                let p = lend(4096, 4096).as_ptr() as usize;
                barrier.wait();
                p
            })
        };
        let (x, y) = (spawn(barrier.clone()), spawn(barrier));
        assert_ne!(x.join().unwrap(), y.join().unwrap());
    }
}

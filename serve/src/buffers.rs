//! The per-tag payload buffers of one queue, as the request path sees
//! them. The frontend owns the memory (ublk: per-tag buffers the kernel
//! copies into and out of, or which the daemon fills itself with user
//! copy; a benchmark: plain vectors); workers read a WRITE's data from, and
//! write a READ's data into, the buffer of the request's tag.
//!
//! Where the data meets the kernel is the frontend's: a buffer the kernel
//! fills before delivery and drains at the commit needs nothing more; with
//! ublk user copy the request path calls [`TagBuffers::load_write`] just
//! before a write executes and [`TagBuffers::store_read`] just after a read
//! filled its buffer, so a request waiting for admission or log capacity
//! holds no payload in the daemon.

/// One queue's buffers, one per tag.
pub trait TagBuffers: Send + Sync + 'static {
    /// The first `len` bytes of `tag`'s buffer, for the party serving it.
    /// Panics if `len` exceeds the buffer.
    ///
    /// # Safety
    /// The caller must be the one party serving `tag`'s current request:
    /// either the queue thread serving a read or a write in place (it stops
    /// using the buffer before handing a read to a worker), or the one
    /// worker (or sync thread, for FLUSH and FUA) the request went to,
    /// until it posts the result (the queue thread does not touch the
    /// buffer meanwhile), or the frontend while the tag has no request in
    /// flight (before it submits one, after its result arrived). The kernel
    /// reads or writes the buffer only before the request is delivered and
    /// after its result is committed. Hand-offs between these parties go
    /// through the scheduler's and the completions' locks, which order
    /// their accesses.
    #[allow(clippy::mut_from_ref)]
    unsafe fn request_bytes(&self, tag: u16, len: usize) -> &mut [u8];

    /// Makes the data of `tag`'s WRITE of `len` bytes readable through
    /// [`TagBuffers::request_bytes`]; called once, as the write executes.
    /// A frontend whose kernel filled the buffer before delivery has
    /// nothing to do (the default).
    ///
    /// # Safety
    /// As [`TagBuffers::request_bytes`]: the caller serves `tag`.
    unsafe fn load_write(&self, tag: u16, len: usize) -> std::io::Result<()> {
        let _ = (tag, len);
        Ok(())
    }

    /// Hands the kernel the first `len` bytes of `tag`'s buffer, the data
    /// of a READ that filled it; called once, before its result is posted
    /// or committed. A frontend whose kernel copies the buffer out at the
    /// commit has nothing to do (the default).
    ///
    /// # Safety
    /// As [`TagBuffers::request_bytes`]: the caller serves `tag`.
    unsafe fn store_read(&self, tag: u16, len: usize) -> std::io::Result<()> {
        let _ = (tag, len);
        Ok(())
    }

    /// The serving party is done with the data of `tag`'s request of `len`
    /// bytes: a write's went into the engine, a read's to the kernel (or
    /// is left for the kernel to copy out at the commit). Called once per
    /// data request, on the thread that served it, before its result is
    /// posted or committed, so that a frontend can return the memory a
    /// long request used. Nothing by default.
    ///
    /// # Safety
    /// As [`TagBuffers::request_bytes`]: the caller serves `tag`; no slice
    /// it got from `request_bytes` is alive any more.
    unsafe fn finished(&self, tag: u16, len: usize) {
        let _ = (tag, len);
    }

    /// How many tags have a buffer.
    fn tags(&self) -> usize;

    /// Bytes of the smallest buffer.
    fn min_bytes(&self) -> usize;
}

/// Tag buffers on the heap, for frontends that share no memory with a
/// kernel (native tests, the benchmark's load generator).
pub struct HeapBuffers {
    bufs: Vec<std::cell::UnsafeCell<Box<[u8]>>>,
    /// Bytes of each buffer.
    bytes: usize,
}

// SAFETY: each buffer is accessed only by the one party serving its tag
// (the contract of `request_bytes`), so sharing the set between threads
// never lets two threads touch one buffer at once.
unsafe impl Sync for HeapBuffers {}

impl HeapBuffers {
    /// `tags` buffers of `bytes` each, zeroed.
    pub fn new(tags: usize, bytes: usize) -> HeapBuffers {
        HeapBuffers {
            bufs: (0..tags).map(|_| std::cell::UnsafeCell::new(vec![0; bytes].into())).collect(),
            bytes,
        }
    }
}

impl TagBuffers for HeapBuffers {
    unsafe fn request_bytes(&self, tag: u16, len: usize) -> &mut [u8] {
        // SAFETY: the caller is the one party serving `tag` (this method's
        // contract), so no other reference to this buffer is live.
        let buf = unsafe { &mut *self.bufs[usize::from(tag)].get() };
        assert!(len <= buf.len(), "request of {len} bytes exceeds the {} byte buffer", buf.len());
        &mut buf[..len]
    }

    fn tags(&self) -> usize {
        self.bufs.len()
    }

    fn min_bytes(&self) -> usize {
        self.bytes
    }
}

//! The per-tag payload buffers of one queue, as the request path sees
//! them. The frontend owns the memory (ublk: libublk's `IoBuf`s it
//! registers with the kernel; a benchmark: plain vectors); workers read a
//! WRITE's data from, and write a READ's data into, the buffer of the
//! request's tag, so payloads never move.

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
    /// buffer meanwhile). The kernel reads or writes the buffer only
    /// before the request is delivered and after its result is committed.
    #[allow(clippy::mut_from_ref)]
    unsafe fn request_bytes(&self, tag: u16, len: usize) -> &mut [u8];
}

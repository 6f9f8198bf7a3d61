//! A whole file's bytes for one scan: read into memory, or mapped.
//!
//! Log recovery reads every segment whole and checksums every byte of it
//! once. Read into a fresh buffer, each byte is copied by the kernel into
//! memory that first has to be faulted in and zeroed; mapped (with
//! `MAP_POPULATE`, so the page tables are filled in one call instead of
//! one fault per page), the checksum reads the page cache directly.
//! Measured natively on tmpfs, opening an image whose log holds 6,800
//! 4 KiB writes: 16 ms read, 8.5 ms mapped (what is left is the checksum
//! and the overlay's inserts).
//!
//! A mapping is read-only and private. Its file must not shrink while it
//! is mapped (a read past the new end raises SIGBUS): recovery maps a
//! segment before the image is open, with the store locked, and truncates
//! one only after its last read of the mapping.

use std::ops::Deref;
use std::ptr::NonNull;

/// The bytes of a whole file.
pub enum WholeFile {
    Read(Vec<u8>),
    Mapped(Mapping),
}

impl Deref for WholeFile {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            WholeFile::Read(v) => v,
            WholeFile::Mapped(m) => m.bytes(),
        }
    }
}

/// A read-only private mapping of `len` bytes, unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only and owned by this value alone; moving
// it to another thread moves only the right to read and to unmap it.
unsafe impl Send for Mapping {}
// SAFETY: shared access only reads bytes that nothing writes.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `file` (`len > 0`), pages populated.
    pub(super) fn of(file: &std::fs::File, len: usize) -> std::io::Result<Mapping> {
        use std::os::fd::AsRawFd;
        assert!(len > 0, "an empty mapping");
        // SAFETY: a fresh mapping at an address the kernel chooses; the
        // pointer is checked before use and unmapped once, in drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| std::io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` readable bytes stay mapped until drop (the file is
        // not shrunk meanwhile: see the module docs).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `of`, once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

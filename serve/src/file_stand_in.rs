//! A plain file standing in for the engine: each data request served with
//! one `pread` or `pwrite` at the request's offset, FLUSH with one
//! `fdatasync`. That is what raw mode does per request, here behind the
//! daemon's own scheduler, workers, reads in place and completions, so a
//! benchmark (`ci/bench path`) that serves the same load once through the
//! engine and once through this measures the engine's work alone. The
//! daemon has none.

use std::sync::Arc;

use cas::io::Wait;
use cas::storage::StorageFile;

/// The file a device's data requests go to instead of its image.
pub struct FileStandIn {
    file: Arc<dyn StorageFile>,
}

impl FileStandIn {
    /// Serves requests from `file` (its bytes are the device's bytes).
    pub fn new(file: Arc<dyn StorageFile>) -> FileStandIn {
        FileStandIn { file }
    }

    /// A read on a queue thread: `Ok(false)` when the data is not in
    /// memory (the read then goes to a worker), as `Image::read_nowait`.
    pub fn read_nowait(&self, offset_bytes: u64, buf: &mut [u8]) -> cas::Result<bool> {
        match self.file.read_exact_at_in(buf, offset_bytes, Wait::Never) {
            Ok(()) => Ok(true),
            Err(cas::Error::WouldBlock) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> cas::Result<()> {
        self.file.read_exact_at(buf, offset_bytes)
    }

    /// Writes `buf` at `offset_bytes`; with `fua`, durable before it
    /// returns.
    pub fn write(&self, offset_bytes: u64, buf: &[u8], fua: bool) -> cas::Result<()> {
        self.file.write_all_at(buf, offset_bytes)?;
        if fua {
            self.file.sync_data()?;
        }
        Ok(())
    }

    pub fn flush(&self) -> cas::Result<()> {
        self.file.sync_data()
    }
}

//! One outcome per file for every sync: the rule that keeps a reported
//! writeback error from turning into a later "success".
//!
//! Linux reports a writeback error once per open file: if two threads
//! fdatasync the same file and the first gets EIO, the second, running
//! just after, returns 0 although the dirty pages it relied on were dropped
//! (they were marked clean, not written). The WAL has two such threads on a
//! closed segment (early writeback and group commit), the chunk store and
//! the manifests may have more. [`SyncGuard`] wraps a backend's file so that
//! - syncs of one handle run one at a time, and
//! - once a sync failed, every later sync of the handle fails with the same
//!   cause: the data it should cover may be gone, whatever the kernel says
//!   next. Only a new handle, after recovery from what is on disk, starts
//!   clean.
//!
//! Both backends return guarded handles from `Storage::open`; reads and
//! writes pass straight through.

use super::StorageFile;
use crate::error::{Error, Result};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

/// A file whose syncs share one outcome. See the module docs.
pub struct SyncGuard<F> {
    inner: F,
    /// Held for the whole of a sync; `Some` after the first failure, with
    /// its message.
    failed: Mutex<Option<String>>,
}

impl<F: StorageFile> SyncGuard<F> {
    pub fn new(inner: F) -> SyncGuard<F> {
        SyncGuard { inner, failed: Mutex::new(None) }
    }

    fn lock(&self) -> MutexGuard<'_, Option<String>> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The error of every sync after the first failure: EIO (the data the
/// sync should cover may be gone), naming the failure.
fn earlier_failure(path: &Path, why: &str) -> Error {
    let detail = format!("an earlier sync of this file failed, so its unsynced writes may be lost: {why}");
    Error::io(path, std::io::Error::other(detail))
}

impl<F: StorageFile> StorageFile for SyncGuard<F> {
    fn path(&self) -> &Path {
        self.inner.path()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.inner.read_at(buf, offset)
    }

    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.inner.read_at_nowait(buf, offset)
    }

    fn read_whole(&self) -> Result<super::WholeFile> {
        self.inner.read_whole()
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.inner.write_all_at(buf, offset)
    }

    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        self.inner.write_all_vectored_at(bufs, offset)
    }

    fn sync_data(&self) -> Result<()> {
        let mut failed = self.lock();
        if let Some(why) = &*failed {
            return Err(earlier_failure(self.path(), why));
        }
        let result = self.inner.sync_data();
        if let Err(e) = &result {
            *failed = Some(e.to_string());
        }
        result
    }

    fn len(&self) -> Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.inner.set_len(len)
    }

    fn allocate(&self, offset: u64, len: u64) -> Result<()> {
        self.inner.allocate(offset, len)
    }
}

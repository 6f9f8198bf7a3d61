//! Writing manifest files: appending pages in large writes, and creating a
//! whole new file atomically (first commit, and compaction rewrites).
//!
//! A new file is built as `<name>.new` (root slots, tree pages, root
//! record), synced, renamed over `<name>`, and the directory synced. The
//! rename is atomic, so after a crash the manifest is the old file or the
//! complete new one; a leftover `<name>.new` is deleted on open.

use super::page::{self, Body, ChildRef, PAGE_BYTES};
use super::root::RootRecord;
use crate::error::{Error, Result};
use crate::storage::{OpenMode, Storage, StorageFile};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Pages buffered before a write (4 MiB): bounds the commit buffer.
const SINK_FLUSH_BYTES: usize = 4 << 20;

/// A failure while committing, and whether it leaves the manifest's state
/// on disk uncertain (then the manifest refuses commits until reopened).
#[derive(Debug)]
pub(crate) struct Failure {
    pub error: Error,
    pub uncertain: bool,
}

impl Failure {
    pub fn certain(error: Error) -> Failure {
        Failure { error, uncertain: false }
    }
    pub fn uncertain(error: Error) -> Failure {
        Failure { error, uncertain: true }
    }
}

/// `<name>.new` next to `path`.
pub(crate) fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".new");
    path.with_file_name(name)
}

/// Creates an empty `<name>.new`, replacing a stale one.
pub(crate) fn create_tmp(storage: &dyn Storage, path: &Path) -> Result<(Arc<dyn StorageFile>, PathBuf)> {
    let tmp = tmp_path(path);
    if storage.exists(&tmp) {
        storage.remove_file(&tmp)?;
    }
    Ok((storage.open(&tmp, OpenMode::CreateNew)?, tmp))
}

/// Appends encoded pages to a file, in writes of up to 4 MiB.
pub(crate) struct PageSink {
    file: Arc<dyn StorageFile>,
    /// Page number the next pushed page gets.
    pub next_page: u64,
    buf_first_page: u64,
    buf: Vec<u8>,
    /// Pages pushed.
    pub pages: u64,
}

impl PageSink {
    pub fn new(file: Arc<dyn StorageFile>, first_page: u64) -> PageSink {
        PageSink { file, next_page: first_page, buf_first_page: first_page, buf: Vec::new(), pages: 0 }
    }

    /// Encodes a page at the next page number; returns its pointer.
    pub fn push(&mut self, level: u8, first_block: u64, generation: u64, body: &Body) -> Result<ChildRef> {
        let crc = page::encode(level, first_block, generation, body, &mut self.buf);
        let at = self.next_page;
        self.next_page += 1;
        self.pages += 1;
        if self.buf.len() >= SINK_FLUSH_BYTES {
            self.flush()?;
        }
        Ok(ChildRef { page: at, crc })
    }

    /// Writes the buffered pages.
    pub fn flush(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            self.file.write_all_at(&self.buf, self.buf_first_page * PAGE_BYTES as u64)?;
            self.buf.clear();
            self.buf_first_page = self.next_page;
        }
        Ok(())
    }
}

/// Finishes a new manifest file built in `tmp`: root record, sync, rename
/// over `path`, directory sync. Returns a handle opened on `path` and the
/// number of syncs issued.
pub(crate) fn commit_new_file(
    storage: &dyn Storage,
    tmp_file: &dyn StorageFile,
    tmp: &Path,
    path: &Path,
    root: &RootRecord,
) -> std::result::Result<(Arc<dyn StorageFile>, u64), Failure> {
    let c = Failure::certain;
    tmp_file.write_all_at(&root.encode(), root.slot() * PAGE_BYTES as u64).map_err(c)?;
    // A tree without pages still spans both root slots (slot 1 may be unused).
    let spanned = root.file_pages * PAGE_BYTES as u64;
    if tmp_file.len().map_err(c)? < spanned {
        tmp_file.set_len(spanned).map_err(c)?;
    }
    tmp_file.sync_data().map_err(c)?;
    storage.rename(tmp, path).map_err(c)?;
    let u = Failure::uncertain;
    let file = storage.open(path, OpenMode::Existing).map_err(u)?;
    storage.sync_dir(path.parent().unwrap_or(Path::new("/"))).map_err(u)?;
    Ok((file, 2))
}

//! A [`Storage`](cas::storage::Storage) that counts the bytes written through it, by what the
//! store keeps in the file (the log, packs, the chunk index, manifests),
//! for the write amplification figures of `ci/bench compaction`.
//! Everything else is forwarded to the wrapped storage unchanged.

use cas::io::Wait;
use cas::storage::{FsSpace, OpenMode, Storage, StorageFile, StorageLock, WholeFile};
use cas::Result;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What a store file holds, by its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileClass {
    /// An image's write-ahead log (`images/NAME/wal/...`).
    Wal,
    /// Chunk packs (`chunks/pack-...`).
    Packs,
    /// The chunk index: its runs, journal and root (the rest of `chunks/`).
    Index,
    /// Manifests and the other per-image files (`images/...` outside `wal/`).
    Manifest,
    /// Anything else (the store's version and lock files).
    Other,
}

impl FileClass {
    pub const ALL: [FileClass; 5] =
        [FileClass::Wal, FileClass::Packs, FileClass::Index, FileClass::Manifest, FileClass::Other];

    pub fn name(self) -> &'static str {
        match self {
            FileClass::Wal => "wal",
            FileClass::Packs => "packs",
            FileClass::Index => "index",
            FileClass::Manifest => "manifest",
            FileClass::Other => "other",
        }
    }

    pub fn of(path: &Path) -> FileClass {
        let has = |name: &str| path.components().any(|c| c.as_os_str() == name);
        let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
        if has("wal") {
            FileClass::Wal
        } else if file.starts_with("pack-") {
            FileClass::Packs
        } else if has("chunks") {
            FileClass::Index
        } else if has("images") {
            FileClass::Manifest
        } else {
            FileClass::Other
        }
    }
}

/// Bytes written per [`FileClass`].
#[derive(Default)]
pub struct Written([AtomicU64; 5]);

impl Written {
    fn add(&self, class: FileClass, bytes: u64) {
        self.0[class as usize].fetch_add(bytes, Ordering::Relaxed);
    }

    /// Bytes written so far, in [`FileClass::ALL`] order.
    pub fn snapshot(&self) -> [u64; 5] {
        std::array::from_fn(|i| self.0[i].load(Ordering::Relaxed))
    }
}

/// See the module docs.
pub struct CountingStorage {
    inner: Arc<dyn Storage>,
    pub written: Arc<Written>,
}

impl CountingStorage {
    pub fn new(inner: Arc<dyn Storage>) -> CountingStorage {
        CountingStorage { inner, written: Arc::default() }
    }
}

struct CountingFile {
    inner: Arc<dyn StorageFile>,
    class: FileClass,
    written: Arc<Written>,
}

impl StorageFile for CountingFile {
    fn path(&self) -> &Path {
        self.inner.path()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.inner.read_at(buf, offset)
    }
    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.inner.read_at_nowait(buf, offset)
    }
    fn read_at_in(&self, buf: &mut [u8], offset: u64, wait: Wait) -> Result<usize> {
        self.inner.read_at_in(buf, offset, wait)
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.inner.write_all_at(buf, offset)?;
        self.written.add(self.class, buf.len() as u64);
        Ok(())
    }
    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        self.inner.write_all_vectored_at(bufs, offset)?;
        self.written.add(self.class, bufs.iter().map(|b| b.len() as u64).sum());
        Ok(())
    }
    fn sync_data(&self) -> Result<()> {
        self.inner.sync_data()
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
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_exact_at(buf, offset)
    }
    fn read_exact_at_in(&self, buf: &mut [u8], offset: u64, wait: Wait) -> Result<()> {
        self.inner.read_exact_at_in(buf, offset, wait)
    }
    fn is_empty(&self) -> Result<bool> {
        self.inner.is_empty()
    }
    fn read_whole(&self) -> Result<WholeFile> {
        self.inner.read_whole()
    }
}

impl Storage for CountingStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> Result<Arc<dyn StorageFile>> {
        let inner = self.inner.open(path, mode)?;
        Ok(Arc::new(CountingFile { inner, class: FileClass::of(path), written: self.written.clone() }))
    }
    fn remove_file(&self, path: &Path) -> Result<()> {
        self.inner.remove_file(path)
    }
    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.rename(from, to)
    }
    fn hard_link(&self, from: &Path, to: &Path) -> Result<()> {
        self.inner.hard_link(from, to)
    }
    fn list_dir(&self, dir: &Path) -> Result<Vec<String>> {
        self.inner.list_dir(dir)
    }
    fn create_dir_all(&self, dir: &Path) -> Result<()> {
        self.inner.create_dir_all(dir)
    }
    fn remove_dir_all(&self, dir: &Path) -> Result<()> {
        self.inner.remove_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> Result<()> {
        self.inner.sync_dir(dir)
    }
    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
    fn lock_exclusive(&self, path: &Path) -> Result<StorageLock> {
        self.inner.lock_exclusive(path)
    }
    fn space(&self, dir: &Path) -> Result<Option<FsSpace>> {
        self.inner.space(dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_classed_by_path() {
        let c = |p: &str| FileClass::of(Path::new(p));
        assert_eq!(c("/s/images/vm1/wal/00000001.log"), FileClass::Wal);
        assert_eq!(c("/s/chunks/pack-0000002a.pack"), FileClass::Packs);
        assert_eq!(c("/s/chunks/index"), FileClass::Index);
        assert_eq!(c("/s/images/vm1/manifest"), FileClass::Manifest);
        assert_eq!(c("/s/STORE"), FileClass::Other);
    }

    #[test]
    fn writes_are_counted_where_they_go() {
        let mem: Arc<dyn Storage> = Arc::new(cas::storage::MemStorage::new());
        let s = CountingStorage::new(mem);
        s.create_dir_all(Path::new("/s/chunks")).unwrap();
        let f = s.open(Path::new("/s/chunks/pack-1.pack"), OpenMode::Create).unwrap();
        f.write_all_at(&[1; 100], 0).unwrap();
        f.write_all_vectored_at(&[&[2; 10], &[3; 5]], 100).unwrap();
        assert_eq!(s.written.snapshot(), [0, 115, 0, 0, 0]);
    }
}

//! A storage that reads through to another and only records what it was
//! asked to change.
//!
//! `casblk fsck` opens each part of the store with the same code that
//! opens it for service (index journal replay, manifest open, WAL
//! recovery), so it judges the bytes exactly as an open would. Those paths
//! also clean up: they cut torn tails, delete leftovers of interrupted
//! checkpoints and covered segments. Behind a [`DryRun`] nothing changes
//! on disk; each change is kept as a [`Change`], which fsck reports and,
//! with `--repair`, applies for real ([`Change::apply`]). Syncs succeed
//! without effect; creating a file is refused (no open path fsck runs
//! creates one).

use super::{OpenMode, Storage, StorageFile, StorageLock};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One change a dry run did not make.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Cut the file to `len_bytes` (it was `was_bytes`).
    Truncate { path: PathBuf, len_bytes: u64, was_bytes: u64 },
    /// Delete the file.
    Remove { path: PathBuf },
    /// Delete the directory and everything below it.
    RemoveDir { path: PathBuf },
    /// Any other change (a write, a rename, a new directory): recorded so
    /// it is never silently lost, never applied by repair.
    Other { path: PathBuf, what: String },
}

impl Change {
    /// The path the change is about.
    pub fn path(&self) -> &Path {
        match self {
            Change::Truncate { path, .. }
            | Change::Remove { path }
            | Change::RemoveDir { path }
            | Change::Other { path, .. } => path,
        }
    }

    /// Makes the change on `storage`, durably (the file or its directory
    /// is synced). `Other` changes are refused.
    pub fn apply(&self, storage: &dyn Storage) -> Result<()> {
        let parent = |p: &Path| p.parent().unwrap_or(Path::new("/")).to_path_buf();
        match self {
            Change::Truncate { path, len_bytes, .. } => {
                let f = storage.open(path, OpenMode::Existing)?;
                f.set_len(*len_bytes)?;
                f.sync_data()
            }
            Change::Remove { path } => {
                storage.remove_file(path)?;
                storage.sync_dir(&parent(path))
            }
            Change::RemoveDir { path } => {
                storage.remove_dir_all(path)?;
                storage.sync_dir(&parent(path))
            }
            Change::Other { path, what } => Err(Error::InvalidArgument(format!(
                "{what} of {} is not a change repair makes",
                path.display()
            ))),
        }
    }
}

/// See the module docs.
pub struct DryRun {
    inner: Arc<dyn Storage>,
    changes: Arc<Mutex<Vec<Change>>>,
}

impl DryRun {
    pub fn new(inner: Arc<dyn Storage>) -> DryRun {
        DryRun { inner, changes: Arc::default() }
    }

    /// The changes recorded since the last call, in order.
    pub fn take_changes(&self) -> Vec<Change> {
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn record(changes: &Mutex<Vec<Change>>, c: Change) {
        changes.lock().unwrap_or_else(|p| p.into_inner()).push(c);
    }
}

impl Storage for DryRun {
    fn open(&self, path: &Path, mode: OpenMode) -> Result<Arc<dyn StorageFile>> {
        if mode != OpenMode::Existing && !self.inner.exists(path) {
            return Err(Error::Unavailable(
                format!("{}", path.display()),
                "a dry run does not create files".into(),
            ));
        }
        let inner = self.inner.open(path, OpenMode::Existing)?;
        Ok(Arc::new(DryRunFile { inner, changes: self.changes.clone() }))
    }

    fn remove_file(&self, path: &Path) -> Result<()> {
        DryRun::record(&self.changes, Change::Remove { path: path.to_path_buf() });
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        let what = format!("rename to {}", to.display());
        DryRun::record(&self.changes, Change::Other { path: from.to_path_buf(), what });
        Ok(())
    }

    fn hard_link(&self, from: &Path, to: &Path) -> Result<()> {
        let what = format!("link as {}", to.display());
        DryRun::record(&self.changes, Change::Other { path: from.to_path_buf(), what });
        Ok(())
    }

    fn list_dir(&self, dir: &Path) -> Result<Vec<String>> {
        self.inner.list_dir(dir)
    }

    fn create_dir_all(&self, dir: &Path) -> Result<()> {
        if !self.inner.exists(dir) {
            let what = "create directory".to_string();
            DryRun::record(&self.changes, Change::Other { path: dir.to_path_buf(), what });
        }
        Ok(())
    }

    fn remove_dir_all(&self, dir: &Path) -> Result<()> {
        DryRun::record(&self.changes, Change::RemoveDir { path: dir.to_path_buf() });
        Ok(())
    }

    fn sync_dir(&self, _dir: &Path) -> Result<()> {
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }

    fn lock_exclusive(&self, path: &Path) -> Result<StorageLock> {
        self.inner.lock_exclusive(path)
    }

    fn space(&self, dir: &Path) -> Result<Option<super::FsSpace>> {
        self.inner.space(dir)
    }
}

struct DryRunFile {
    inner: Arc<dyn StorageFile>,
    changes: Arc<Mutex<Vec<Change>>>,
}

impl StorageFile for DryRunFile {
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
        let what = format!("write of {} bytes at offset {offset}", buf.len());
        DryRun::record(&self.changes, Change::Other { path: self.path().to_path_buf(), what });
        Ok(())
    }

    fn sync_data(&self) -> Result<()> {
        Ok(())
    }

    fn len(&self) -> Result<u64> {
        self.inner.len()
    }

    fn set_len(&self, len: u64) -> Result<()> {
        let was_bytes = self.inner.len()?;
        let path = self.path().to_path_buf();
        DryRun::record(&self.changes, Change::Truncate { path, len_bytes: len, was_bytes });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemStorage;

    #[test]
    fn nothing_changes_and_every_change_is_recorded() {
        let mem = Arc::new(MemStorage::new());
        let dir = Path::new("/d");
        mem.create_dir_all(dir).unwrap();
        let f = mem.open(&dir.join("f"), OpenMode::CreateNew).unwrap();
        f.write_all_at(&[7u8; 100], 0).unwrap();
        let dry = DryRun::new(mem.clone());
        let g = dry.open(&dir.join("f"), OpenMode::Existing).unwrap();
        g.set_len(10).unwrap();
        g.sync_data().unwrap();
        g.write_all_at(b"x", 0).unwrap();
        dry.remove_file(&dir.join("f")).unwrap();
        assert!(dry.open(&dir.join("new"), OpenMode::Create).is_err());
        assert_eq!(f.len().unwrap(), 100, "the file is untouched");
        assert!(mem.exists(&dir.join("f")));
        let changes = dry.take_changes();
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert_eq!(changes[0], Change::Truncate { path: dir.join("f"), len_bytes: 10, was_bytes: 100 });
        assert!(matches!(&changes[1], Change::Other { .. }));
        assert!(changes[1].apply(&*mem).is_err(), "repair never replays a write");
        changes[0].apply(&*mem).unwrap();
        assert_eq!(f.len().unwrap(), 10);
        changes[2].apply(&*mem).unwrap();
        assert!(!mem.exists(&dir.join("f")));
        assert!(dry.take_changes().is_empty());
    }
}

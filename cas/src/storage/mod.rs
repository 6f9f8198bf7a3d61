//! The storage trait: every byte the store reads or writes goes through it.
//!
//! Two backends live here. [`FsStorage`] is the real one (positional reads
//! and writes on files, fdatasync, directory fsync). [`MemStorage`] keeps
//! each file's *live* bytes (what reads see) apart from its *durable* bytes
//! (what survives a crash), so tests can crash the store at any point, tear
//! the last write, and inject EIO or ENOSPC, then reopen and compare.
//! [`DryRun`] wraps either: reads pass through, changes are only recorded
//! (`casblk fsck` runs the open paths on it).
//!
//! Durability rules every backend follows, and the store relies on:
//! - `write_all_at` is visible to later reads at once, durable only after
//!   `sync_data` on that file returns.
//! - Creating, renaming and removing files is durable only after
//!   `sync_dir` on the parent directory returns.
//! - `rename` atomically replaces the target (POSIX rename).
//! - A file removed while a handle is open stays readable through that
//!   handle (POSIX unlink semantics); the WAL relies on this so that a
//!   read in flight keeps its segment alive (see `image`).
//! - `lock_exclusive` gives one holder at a time; the lock dies with the
//!   process (flock), or with a simulated crash in `MemStorage`.
//! - Syncs of one handle share one outcome ([`SyncGuard`]): they run one at
//!   a time, and after one fails every later one fails. The kernel reports
//!   a writeback error once per open file, so without this a second
//!   thread's sync could "succeed" over data the first one's error lost.
//!   `MemStorage` models that kernel behaviour underneath the guard.

mod atomic;
mod dry_run;
mod fs;
mod mem;
mod sync_guard;
#[allow(unsafe_code)] // mmap: see the module docs
mod whole_file;

pub use atomic::{read_small, tmp_path, write_atomic};
pub use dry_run::{Change, DryRun};
pub use fs::{is_memory_fs, FsStorage};
pub use mem::{CrashMode, Fault, FaultOp, MemStorage};
pub use sync_guard::SyncGuard;
pub use whole_file::{Mapping, WholeFile};

use crate::error::Result;
use crate::io::Wait;
use std::path::Path;
use std::sync::Arc;

/// How `Storage::open` treats a missing or existing file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// The file must exist.
    Existing,
    /// Create the file if it is missing.
    Create,
    /// The file must not exist yet.
    CreateNew,
}

/// The size of the filesystem holding a directory, and what is left of
/// it (`statvfs`: what a writer without the root reserve may still use).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsSpace {
    pub size_bytes: u64,
    pub avail_bytes: u64,
}

impl FsSpace {
    /// The used share of the filesystem, in percent (0 when its size is
    /// unknown).
    pub fn used_pct(&self) -> f64 {
        if self.size_bytes == 0 {
            return 0.0;
        }
        100.0 * self.size_bytes.saturating_sub(self.avail_bytes) as f64 / self.size_bytes as f64
    }
}

/// A namespace of files and directories.
pub trait Storage: Send + Sync + 'static {
    fn open(&self, path: &Path, mode: OpenMode) -> Result<Arc<dyn StorageFile>>;
    fn remove_file(&self, path: &Path) -> Result<()>;
    /// Atomically renames `from` to `to`, replacing `to` if it exists.
    fn rename(&self, from: &Path, to: &Path) -> Result<()>;
    /// Makes `to` (which must not exist) a second name of the file `from`:
    /// both share one content (snapshots share a frozen manifest file).
    /// Durable once `to`'s directory is synced.
    fn hard_link(&self, from: &Path, to: &Path) -> Result<()>;
    /// The names (not paths) of the entries in `dir`, sorted.
    fn list_dir(&self, dir: &Path) -> Result<Vec<String>>;
    fn create_dir_all(&self, dir: &Path) -> Result<()>;
    /// Removes `dir` and everything below it.
    fn remove_dir_all(&self, dir: &Path) -> Result<()>;
    /// Makes creations, renames and removals in `dir` durable.
    fn sync_dir(&self, dir: &Path) -> Result<()>;
    fn exists(&self, path: &Path) -> bool;
    /// Takes an exclusive lock on `path` (creating the file if missing),
    /// held until the returned guard drops. Never waits: if another holder
    /// has it, fails with [`Error::Unavailable`](crate::Error::Unavailable).
    fn lock_exclusive(&self, path: &Path) -> Result<StorageLock>;
    /// The space of the filesystem holding `dir`; `None` where this
    /// storage cannot tell (the default).
    fn space(&self, dir: &Path) -> Result<Option<FsSpace>> {
        let _ = dir;
        Ok(None)
    }
}

/// An exclusive lock from [`Storage::lock_exclusive`]; dropping it unlocks.
pub struct StorageLock {
    _held: Box<dyn Send + Sync>,
}

impl StorageLock {
    /// Wraps whatever keeps the lock held (an flock'ed file, a guard).
    pub fn new(held: Box<dyn Send + Sync>) -> StorageLock {
        StorageLock { _held: held }
    }
}

impl std::fmt::Debug for StorageLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StorageLock")
    }
}

/// One open file. Reads and writes are positional, so one handle can be
/// shared by threads without a seek position.
pub trait StorageFile: Send + Sync {
    fn path(&self) -> &Path;
    /// Reads up to `buf.len()` bytes at `offset`; fewer only at end of file.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize>;
    /// [`read_at`](Self::read_at) for a reader that must not wait
    /// ([`Wait::Never`]): a backend that would wait for a device fails with
    /// [`Error::WouldBlock`](crate::Error::WouldBlock) instead. This default
    /// always fails so: a wrapper that forgets to forward it hands its
    /// reads to a worker, and never blocks a queue thread.
    fn read_at_nowait(&self, _buf: &mut [u8], _offset: u64) -> Result<usize> {
        Err(crate::error::Error::WouldBlock)
    }
    /// [`read_at`](Self::read_at) or [`read_at_nowait`](Self::read_at_nowait),
    /// as `wait` says.
    fn read_at_in(&self, buf: &mut [u8], offset: u64, wait: Wait) -> Result<usize> {
        match wait {
            Wait::Block => self.read_at(buf, offset),
            Wait::Never => self.read_at_nowait(buf, offset),
        }
    }
    fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<()>;
    /// Writes `bufs` back to back from `offset`, as one write where the
    /// backend can (the local filesystem: `pwritev`, one system call for a
    /// log record's header and payload). Nothing is promised about the
    /// order in which the pieces reach the file or survive a crash; a
    /// caller that needs to detect a torn write checksums the whole. This
    /// default writes the pieces one at a time, the last first, and skips
    /// empty ones (the log wrote no empty payload before this existed).
    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        let mut end = offset + bufs.iter().map(|b| b.len() as u64).sum::<u64>();
        for buf in bufs.iter().rev().filter(|b| !b.is_empty()) {
            end -= buf.len() as u64;
            self.write_all_at(buf, end)?;
        }
        Ok(())
    }
    /// Makes every completed write to this file durable (fdatasync). Once
    /// it failed on a handle, it fails on that handle for good.
    fn sync_data(&self) -> Result<()>;
    fn len(&self) -> Result<u64>;
    fn set_len(&self, len: u64) -> Result<()>;
    /// Allocates `[offset, offset + len)` without changing the length
    /// (`fallocate(FALLOC_FL_KEEP_SIZE)`), so later writes there cannot
    /// fail for lack of space. Fails with ENOSPC when the filesystem is
    /// full; succeeds without allocating where the backend cannot (the
    /// default, and filesystems without fallocate).
    fn allocate(&self, offset: u64, len: u64) -> Result<()> {
        let _ = (offset, len);
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes at `offset`, or fails with a
    /// corruption error naming the short read.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.read_exact_at_in(buf, offset, Wait::Block)
    }

    /// [`read_exact_at`](Self::read_exact_at), waiting for the device as
    /// `wait` allows.
    fn read_exact_at_in(&self, buf: &mut [u8], offset: u64, wait: Wait) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            let n = self.read_at_in(&mut buf[done..], offset + done as u64, wait)?;
            if n == 0 {
                return Err(crate::error::Error::Corruption {
                    path: self.path().to_path_buf(),
                    offset: offset + done as u64,
                    detail: format!("unexpected end of file reading {} bytes", buf.len()),
                });
            }
            done += n;
        }
        Ok(())
    }

    fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// The whole file, for one scan (see [`WholeFile`]). The local
    /// filesystem maps it; other backends read it.
    fn read_whole(&self) -> Result<WholeFile> {
        let len = addressable_len(self)?;
        let mut buf = vec![0u8; len];
        self.read_exact_at(&mut buf, 0)?;
        Ok(WholeFile::Read(buf))
    }
}

/// `file`'s length as a buffer length, or a corruption error if this
/// machine cannot address it.
fn addressable_len(file: &(impl StorageFile + ?Sized)) -> Result<usize> {
    let len = file.len()?;
    usize::try_from(len).map_err(|_| crate::error::Error::Corruption {
        path: file.path().to_path_buf(),
        offset: 0,
        detail: format!("{len} bytes: larger than this machine can address"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The same contract checks run against both backends.
    fn exercise(s: &dyn Storage, root: &Path) {
        let dir = root.join("d");
        s.create_dir_all(&dir).unwrap();
        let p = dir.join("f");
        assert!(s.open(&p, OpenMode::Existing).is_err());
        let f = s.open(&p, OpenMode::CreateNew).unwrap();
        assert!(s.open(&p, OpenMode::CreateNew).is_err());
        f.write_all_at(b"hello", 3).unwrap();
        assert_eq!(f.len().unwrap(), 8);
        let mut buf = [0u8; 8];
        assert_eq!(f.read_at(&mut buf, 0).unwrap(), 8);
        assert_eq!(&buf, b"\0\0\0hello");
        assert_eq!(f.read_at(&mut buf, 6).unwrap(), 2);
        // A read that must not wait reads the same, or says it would wait
        // (a filesystem that cannot tell); memory always reads.
        match f.read_at_nowait(&mut buf, 6) {
            Ok(n) => assert_eq!((n, &buf[..2]), (2, &b"lo"[..])),
            Err(e) => assert!(matches!(e, crate::Error::WouldBlock), "{e}"),
        }
        assert!(f.read_exact_at(&mut buf, 6).is_err());
        assert_eq!(&*f.read_whole().unwrap(), b"\0\0\0hello", "the whole file, as read");
        let empty = s.open(&dir.join("empty"), OpenMode::CreateNew).unwrap();
        assert!(empty.read_whole().unwrap().is_empty());
        s.remove_file(&dir.join("empty")).unwrap();
        // Pieces land back to back from the offset; empty ones take no room.
        f.write_all_vectored_at(&[b"AB", b"", b"cde"], 6).unwrap();
        assert_eq!(&*f.read_whole().unwrap(), b"\0\0\0helABcde");
        f.write_all_vectored_at(&[], 2).unwrap();
        f.write_all_vectored_at(&[b"", b"e", b""], 10).unwrap();
        f.write_all_vectored_at(&[b""], 50).unwrap();
        assert_eq!(f.len().unwrap(), 11, "an empty piece writes nothing, past the end neither");
        // More pieces than one pwritev takes (1,024): the local backend
        // goes on after the short write.
        let many: Vec<[u8; 1]> = (0..2500u32).map(|i| [(i % 251) as u8]).collect();
        let refs: Vec<&[u8]> = many.iter().map(|b| &b[..]).collect();
        f.write_all_vectored_at(&refs, 11).unwrap();
        let mut back = vec![0u8; many.len()];
        f.read_exact_at(&mut back, 11).unwrap();
        assert_eq!(back, many.concat());
        f.sync_data().unwrap();
        f.set_len(4).unwrap();
        assert_eq!(f.len().unwrap(), 4);
        let q = dir.join("g");
        s.rename(&p, &q).unwrap();
        assert!(!s.exists(&p));
        assert!(s.exists(&q));
        assert_eq!(s.list_dir(&dir).unwrap(), vec!["g".to_string()]);
        // A second name shares the content, and outlives the first.
        let h = dir.join("h");
        s.hard_link(&q, &h).unwrap();
        assert!(s.hard_link(&q, &h).is_err(), "a link over an existing name");
        s.open(&q, OpenMode::Existing).unwrap().write_all_at(b"hi", 0).unwrap();
        let linked = s.open(&h, OpenMode::Existing).unwrap();
        let mut two = [0u8; 2];
        linked.read_exact_at(&mut two, 0).unwrap();
        assert_eq!(&two, b"hi");
        s.remove_file(&h).unwrap();
        s.sync_dir(&dir).unwrap();
        s.remove_file(&q).unwrap();
        assert!(s.list_dir(&dir).unwrap().is_empty());
        s.remove_dir_all(&dir).unwrap();
        assert!(!s.exists(&dir));
        let l = root.join("LOCK");
        let held = s.lock_exclusive(&l).unwrap();
        let again = s.lock_exclusive(&l).unwrap_err();
        assert!(matches!(again, crate::Error::Unavailable(..)), "{again}");
        drop(held);
        let _held = s.lock_exclusive(&l).unwrap();
    }

    #[test]
    fn fs_backend_contract() {
        let tmp = tempfile::tempdir().unwrap();
        exercise(&FsStorage::new(), tmp.path());
    }

    #[test]
    fn mem_backend_contract() {
        exercise(&MemStorage::new(), &PathBuf::from("/store"));
    }
}

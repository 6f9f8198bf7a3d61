//! The real backend: files on a local filesystem.

use super::{Mapping, OpenMode, Storage, StorageFile, StorageLock, SyncGuard, WholeFile};
use crate::error::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Files on the local filesystem, synced with fdatasync and directory fsync.
#[derive(Clone, Debug, Default)]
pub struct FsStorage;

impl FsStorage {
    pub fn new() -> FsStorage {
        FsStorage
    }
}

struct FsFile {
    path: PathBuf,
    file: File,
    /// tmpfs/ramfs: reads never wait for a device (and such filesystems
    /// refuse RWF_NOWAIT), so nowait reads are plain reads.
    in_memory: bool,
}

/// True for filesystems whose files live in RAM (tmpfs, ramfs).
pub fn is_memory_fs(file: &File) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    rustix::fs::fstatfs(file).is_ok_and(|st| {
        #[allow(clippy::unnecessary_cast)] // f_type is i64 on x86_64, narrower elsewhere
        let kind = st.f_type as i64;
        kind == TMPFS_MAGIC || kind == RAMFS_MAGIC
    })
}

impl FsFile {
    /// `pwritev` until every byte of `bufs` is written from `offset`
    /// (retrying on EINTR, going on after a short write).
    fn pwritev_all(&self, bufs: &[&[u8]], offset: u64) -> std::io::Result<()> {
        // A log record is two pieces: no allocation per write.
        let mut slices: smallvec::SmallVec<[std::io::IoSlice<'_>; 4]> =
            bufs.iter().map(|b| std::io::IoSlice::new(b)).collect();
        let mut rest = &mut slices[..];
        std::io::IoSlice::advance_slices(&mut rest, 0); // drops leading empty pieces
        let mut at = offset;
        while !rest.is_empty() {
            // rustix passes at most IOV_MAX pieces: the rest is a short write.
            match rustix::io::pwritev(&self.file, rest, at) {
                Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    at += n as u64;
                    std::io::IoSlice::advance_slices(&mut rest, n);
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// One positional read; with RWF_NOWAIT if `nowait` (on a memory
    /// filesystem reads never wait for a device, so plainly).
    fn read_once(&self, buf: &mut [u8], offset: u64, nowait: bool) -> std::io::Result<usize> {
        if self.in_memory || !nowait {
            return self.file.read_at(buf, offset);
        }
        let flags = rustix::io::ReadWriteFlags::NOWAIT;
        match rustix::io::preadv2(&self.file, &mut [std::io::IoSliceMut::new(buf)], offset, flags) {
            Ok(n) => Ok(n),
            // EAGAIN: not cached; EOPNOTSUPP: this filesystem cannot say.
            Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::OPNOTSUPP => {
                Err(std::io::ErrorKind::WouldBlock.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// `read_once` until `buf` is full or the file ends (retrying on
    /// EINTR, going on after a short read).
    fn read_loop(&self, buf: &mut [u8], offset: u64, nowait: bool) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.read_once(&mut buf[done..], offset + done as u64, nowait) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Err(Error::WouldBlock),
                Err(e) => return Err(Error::io(&self.path, e)),
            }
        }
        Ok(done)
    }
}

impl StorageFile for FsFile {
    fn path(&self) -> &Path {
        &self.path
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.read_loop(buf, offset, false)
    }

    fn read_at_nowait(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.read_loop(buf, offset, true)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.file.write_all_at(buf, offset).map_err(|e| Error::io(&self.path, e))
    }

    fn write_all_vectored_at(&self, bufs: &[&[u8]], offset: u64) -> Result<()> {
        self.pwritev_all(bufs, offset).map_err(|e| Error::io(&self.path, e))
    }

    fn sync_data(&self) -> Result<()> {
        self.file.sync_data().map_err(|e| Error::io(&self.path, e))
    }

    fn len(&self) -> Result<u64> {
        Ok(self.file.metadata().map_err(|e| Error::io(&self.path, e))?.len())
    }

    fn read_whole(&self) -> Result<WholeFile> {
        match super::addressable_len(self)? {
            0 => Ok(WholeFile::Read(Vec::new())),
            n => Ok(WholeFile::Mapped(Mapping::of(&self.file, n).map_err(|e| Error::io(&self.path, e))?)),
        }
    }

    fn set_len(&self, len: u64) -> Result<()> {
        self.file.set_len(len).map_err(|e| Error::io(&self.path, e))
    }

    fn allocate(&self, offset: u64, len: u64) -> Result<()> {
        match rustix::fs::fallocate(&self.file, rustix::fs::FallocateFlags::KEEP_SIZE, offset, len) {
            Ok(()) => Ok(()),
            // Some FUSE filesystems, seccomp or gVisor refusing the call:
            // writes allocate as they go (said once).
            Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::NOSYS => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::warn!(path = %self.path.display(), "fallocate is not supported here; log records may still meet ENOSPC on a full filesystem");
                });
                Ok(())
            }
            Err(e) => Err(Error::io(&self.path, std::io::Error::from_raw_os_error(e.raw_os_error()))),
        }
    }
}

impl Storage for FsStorage {
    fn open(&self, path: &Path, mode: OpenMode) -> Result<Arc<dyn StorageFile>> {
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        match mode {
            OpenMode::Existing => {}
            OpenMode::Create => {
                opts.create(true);
            }
            OpenMode::CreateNew => {
                opts.create_new(true);
            }
        }
        let file = opts.open(path).map_err(|e| Error::io(path, e))?;
        let in_memory = is_memory_fs(&file);
        Ok(Arc::new(SyncGuard::new(FsFile { path: path.to_path_buf(), file, in_memory })))
    }

    fn remove_file(&self, path: &Path) -> Result<()> {
        std::fs::remove_file(path).map_err(|e| Error::io(path, e))
    }

    fn rename(&self, from: &Path, to: &Path) -> Result<()> {
        std::fs::rename(from, to).map_err(|e| Error::io(from, e))
    }

    fn hard_link(&self, from: &Path, to: &Path) -> Result<()> {
        std::fs::hard_link(from, to).map_err(|e| Error::io(to, e))
    }

    fn list_dir(&self, dir: &Path) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
            let entry = entry.map_err(|e| Error::io(dir, e))?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    fn create_dir_all(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))
    }

    fn remove_dir_all(&self, dir: &Path) -> Result<()> {
        std::fs::remove_dir_all(dir).map_err(|e| Error::io(dir, e))
    }

    fn sync_dir(&self, dir: &Path) -> Result<()> {
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| Error::io(dir, e))
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn lock_exclusive(&self, path: &Path) -> Result<StorageLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io(path, e))?;
        // flock locks belong to the open file description, so a second
        // open of the same path in this process conflicts too; the kernel
        // drops the lock when the file closes or the process dies.
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(StorageLock::new(Box::new(file))),
            Err(e) if e == rustix::io::Errno::WOULDBLOCK => Err(Error::Unavailable(
                path.display().to_string(),
                "locked by another process (or another open in this one)".into(),
            )),
            Err(e) => Err(Error::io(path, std::io::Error::from_raw_os_error(e.raw_os_error()))),
        }
    }

    fn space(&self, dir: &Path) -> Result<Option<super::FsSpace>> {
        let st = rustix::fs::statvfs(dir).map_err(|e| Error::io(dir, e.into()))?;
        Ok(Some(super::FsSpace {
            size_bytes: st.f_blocks.saturating_mul(st.f_frsize),
            avail_bytes: st.f_bavail.saturating_mul(st.f_frsize),
        }))
    }
}

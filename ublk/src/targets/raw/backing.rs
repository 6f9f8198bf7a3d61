//! The backing file of raw mode: validation, capability probes, and the
//! ublk device parameters built from them. A device advertises only what
//! its backing honours: DISCARD only when hole punching works, and
//! WRITE_ZEROES always (with a fallback that writes zero buffers).

use crate::device::params::SECTOR_BYTES;
use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// How WRITE_ZEROES is carried out on the backing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZeroMethod {
    /// fallocate(FALLOC_FL_ZERO_RANGE): zeroes, keeps the allocation.
    ZeroRange,
    /// fallocate(FALLOC_FL_PUNCH_HOLE): zeroes by deallocating.
    PunchHole,
    /// Writes of a zero buffer.
    Write,
}

pub struct Backing {
    pub file: File,
    pub path: PathBuf,
    pub size: u64,
    /// Opened with O_DIRECT (false where the filesystem refuses it).
    pub direct: bool,
    /// DISCARD can be served by punching holes.
    pub punch: bool,
    /// The file lives in memory (tmpfs, ramfs): its reads and writes are
    /// memory copies that never wait for a device.
    pub in_memory: bool,
    pub zeroes: ZeroMethod,
}

fn open_rw(path: &Path, direct: bool) -> std::io::Result<File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true).write(true);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    opts.open(path)
}

/// fallocate(2) on `file`; Ok(false) when the filesystem does not support `mode`.
pub fn try_fallocate(file: &File, mode: i32, offset: u64, len: u64) -> std::io::Result<bool> {
    let (off, len) = (offset as libc::off_t, len as libc::off_t);
    // SAFETY: fallocate(2) reads only its integer arguments; the fd is open
    // for as long as `file` is borrowed.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, off, len) };
    if rc == 0 {
        return Ok(true);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Ok(false),
        _ => Err(err),
    }
}

impl Backing {
    pub fn open(path: &Path) -> Result<Backing> {
        let shown = path.display();
        let meta = std::fs::metadata(path).with_context(|| format!("backing file {shown}"))?;
        let ft = meta.file_type();
        if !ft.is_file() && !ft.is_block_device() {
            bail!("backing file {shown} is not a regular file or block device");
        }
        let (file, direct) = match open_rw(path, true) {
            Ok(f) => (f, true),
            // Filesystems without O_DIRECT (tmpfs before 6.6) refuse it with EINVAL.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                (open_rw(path, false).with_context(|| format!("backing file {shown}"))?, false)
            }
            Err(e) => {
                return Err(e).with_context(|| format!("backing file {shown} cannot be opened read-write"))
            }
        };
        let size = if ft.is_block_device() {
            (&file).seek(SeekFrom::End(0)).with_context(|| format!("sizing block device {shown}"))?
        } else {
            meta.len()
        };
        if size == 0 {
            bail!("backing file {shown} is empty: a device needs at least {SECTOR_BYTES} bytes");
        }
        if size % SECTOR_BYTES != 0 {
            bail!("backing file {shown} is {size} bytes, not a multiple of {SECTOR_BYTES}");
        }
        let (punch, zeroes) = if ft.is_block_device() {
            (block_discard_supported(meta.rdev()), ZeroMethod::ZeroRange)
        } else {
            probe_file_fallocate(&file, size).with_context(|| format!("probing {shown}"))?
        };
        let in_memory = ft.is_file() && cas::storage::is_memory_fs(&file);
        Ok(Backing { file, path: path.to_path_buf(), size, direct, punch, zeroes, in_memory })
    }
}

/// Probes hole punching and zero ranges just past the end of a regular
/// file (KEEP_SIZE), so no data is touched.
fn probe_file_fallocate(file: &File, size: u64) -> Result<(bool, ZeroMethod)> {
    const PROBE: u64 = 4096;
    let punch_mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    let punch = try_fallocate(file, punch_mode, size, PROBE)?;
    let zero_range =
        try_fallocate(file, libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE, size, PROBE)?;
    if zero_range && punch {
        // Release what the zero-range probe may have preallocated.
        try_fallocate(file, punch_mode, size, PROBE)?;
    }
    let zeroes = if zero_range {
        ZeroMethod::ZeroRange
    } else if punch {
        ZeroMethod::PunchHole
    } else {
        ZeroMethod::Write
    };
    Ok((punch, zeroes))
}

fn block_discard_supported(rdev: u64) -> bool {
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/queue/discard_max_bytes"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0)
}

//! The backing file of raw mode: validation, capability probes, and the
//! ublk device parameters built from them. A device advertises only what
//! its backing honours: DISCARD only when hole punching works, and
//! WRITE_ZEROES always (with a fallback that writes zero buffers).

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

pub const SECTOR_SHIFT: u32 = 9;
pub const SECTOR_SIZE: u64 = 1 << SECTOR_SHIFT;

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
            bail!("backing file {shown} is empty: a device needs at least {SECTOR_SIZE} bytes");
        }
        if size % SECTOR_SIZE != 0 {
            bail!("backing file {shown} is {size} bytes, not a multiple of {SECTOR_SIZE}");
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

/// Device parameters for a device of `size` bytes taking requests of at
/// most `io_buf_bytes` (`read_only`: the kernel refuses writes).
pub fn device_params(
    size: u64,
    io_buf_bytes: u32,
    discard: bool,
    read_only: bool,
) -> libublk::sys::ublk_params {
    let max_sectors = io_buf_bytes >> SECTOR_SHIFT;
    let read_only = if read_only { libublk::sys::UBLK_ATTR_READ_ONLY } else { 0 };
    libublk::sys::ublk_params {
        types: libublk::sys::UBLK_PARAM_TYPE_BASIC | libublk::sys::UBLK_PARAM_TYPE_DISCARD,
        basic: libublk::sys::ublk_param_basic {
            // A volatile cache makes the kernel send FLUSH; FUA is honoured per write.
            attrs: libublk::sys::UBLK_ATTR_VOLATILE_CACHE | libublk::sys::UBLK_ATTR_FUA | read_only,
            logical_bs_shift: 9,
            physical_bs_shift: 12,
            io_opt_shift: 12,
            io_min_shift: 9,
            max_sectors,
            dev_sectors: size >> SECTOR_SHIFT,
            ..Default::default()
        },
        discard: libublk::sys::ublk_param_discard {
            discard_alignment: 0,
            discard_granularity: 4096,
            max_discard_sectors: if discard { u32::MAX >> SECTOR_SHIFT } else { 0 },
            max_write_zeroes_sectors: max_sectors,
            max_discard_segments: 1,
            ..Default::default()
        },
        ..Default::default()
    }
}

//! The few system calls the agent needs beyond std: mounts, O_DIRECT
//! buffers, filesystem freeze and trim, and the final reboot.

use crate::console::say;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// `_IOWR('X', 119, int)`, `_IOWR('X', 120, int)`: freeze and thaw a
/// filesystem (linux/fs.h).
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;
/// `_IOWR('X', 121, struct fstrim_range)`.
const FITRIM: libc::c_ulong = 0xC018_5879;

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL in a path")
}

/// mount(2) with a message naming what failed.
pub fn mount(src: &str, target: &str, fstype: &str, flags: libc::c_ulong) -> Result<(), String> {
    let _ = std::fs::create_dir_all(target);
    let (s, t, f) = (cstr(src), cstr(target), cstr(fstype));
    // SAFETY: every pointer is a NUL-terminated string that outlives the
    // call; no data argument is passed.
    let rc = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), flags, std::ptr::null()) };
    if rc != 0 {
        return Err(format!("mount {src} on {target} ({fstype}): {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

pub fn umount(target: &str) -> Result<(), String> {
    let t = cstr(target);
    // SAFETY: a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(t.as_ptr(), 0) } != 0 {
        return Err(format!("umount {target}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// /proc, /sys and a /tmp; /dev came from the initramfs.
pub fn mount_basics() -> Result<(), String> {
    mount("proc", "/proc", "proc", 0)?;
    mount("sysfs", "/sys", "sysfs", 0)?;
    mount("tmpfs", "/tmp", "tmpfs", 0)
}

/// Seconds since the guest kernel started.
pub fn uptime_s() -> f64 {
    std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}

/// A page-aligned buffer for O_DIRECT reads and writes.
pub struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    pub fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("a valid layout");
        // SAFETY: the layout has a non-zero size (callers ask for whole blocks).
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory for an O_DIRECT buffer");
        Aligned { ptr, len }
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr is a live allocation of len bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, 4096).expect("a valid layout");
        // SAFETY: allocated in new() with this very layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

/// Opens `path` for O_DIRECT IO (created when `create`).
pub fn open_direct(path: &Path, write: bool, create: bool) -> Result<File, String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .create(create)
        .truncate(false)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| format!("opening {} with O_DIRECT: {e}", path.display()))
}

fn ioctl_on(path: &str, request: libc::c_ulong, arg: *mut libc::c_void, what: &str) -> Result<(), String> {
    let f = File::open(path).map_err(|e| format!("opening {path} for {what}: {e}"))?;
    // SAFETY: `arg` points to the structure `request` expects (or is
    // ignored by it), live for the call; the fd is open.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), request, arg) };
    if rc != 0 {
        return Err(format!("{what} of {path}: {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Freezes the filesystem mounted at `path` (what `fsfreeze -f` does):
/// dirty data is written and new writes wait until `thaw`.
pub fn freeze(path: &str) -> Result<(), String> {
    let mut zero: libc::c_int = 0;
    ioctl_on(path, FIFREEZE, (&mut zero as *mut libc::c_int).cast(), "FIFREEZE")
}

pub fn thaw(path: &str) -> Result<(), String> {
    let mut zero: libc::c_int = 0;
    ioctl_on(path, FITHAW, (&mut zero as *mut libc::c_int).cast(), "FITHAW")
}

/// `struct fstrim_range` (linux/fs.h).
#[repr(C)]
struct FstrimRange {
    start: u64,
    len: u64,
    minlen: u64,
}

/// Discards every free block of the filesystem at `path` (`fstrim`);
/// returns the bytes the filesystem says it trimmed.
pub fn fstrim(path: &str) -> Result<u64, String> {
    let mut range = FstrimRange { start: 0, len: u64::MAX, minlen: 0 };
    ioctl_on(path, FITRIM, (&mut range as *mut FstrimRange).cast(), "FITRIM")?;
    Ok(range.len)
}

/// True when the filesystem at `path` is mounted read-only (ext4 turns
/// itself read-only after an error it cannot survive).
pub fn read_only(path: &str) -> Result<bool, String> {
    let p = cstr(path);
    // SAFETY: statvfs is plain data; zeroed is a valid value for it.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out pointer.
    if unsafe { libc::statvfs(p.as_ptr(), &mut st) } != 0 {
        return Err(format!("statvfs {path}: {}", std::io::Error::last_os_error()));
    }
    Ok(st.f_flag & libc::ST_RDONLY != 0)
}

/// Runs a program to completion; an exit status other than 0 is an error.
pub fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("running {program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {} exited {}: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// The last step: write everything out, leave the root clean, say how it
/// ended, and reboot (QEMU runs with -no-reboot, so it exits).
pub fn shut_down(rc: i32) -> ! {
    // SAFETY: sync(2) takes no arguments.
    unsafe { libc::sync() };
    let root = cstr("/");
    let none = cstr("none");
    // SAFETY: NUL-terminated strings live for the call; no data argument.
    let remounted = unsafe {
        libc::mount(
            none.as_ptr(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_RDONLY,
            std::ptr::null(),
        )
    };
    if remounted != 0 {
        say(&format!("note: remounting / read-only: {}", std::io::Error::last_os_error()));
    }
    say(&format!("done rc={rc} uptime_s={:.1}", uptime_s()));
    // SAFETY: reboot(2) with a valid command; it does not return on success.
    unsafe { libc::reboot(libc::LINUX_REBOOT_CMD_RESTART) };
    say("reboot failed");
    std::process::exit(rc);
}

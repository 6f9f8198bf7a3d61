//! Who holds a block device open: the processes with a file descriptor on
//! it (QEMU with a guest's disk, fio, dd), found the way `fuser` finds
//! them, by the device number of every open file under /proc.
//!
//! Deleting a ublk device someone holds makes their IO fail; `del` asks
//! this first and names them. It is a snapshot: a process may open the
//! device just after (the driver's own safe stop, where it has one, closes
//! that window).

use std::os::unix::fs::{FileTypeExt, MetadataExt};

/// A process holding the device, e.g. `qemu-system-x86 (pid 1234)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opener {
    pub pid: i32,
    pub command: String,
}

impl std::fmt::Display for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (pid {})", self.command, self.pid)
    }
}

/// The device number of block device `ublkb{id}` ("MAJOR:MINOR" in sysfs).
fn devno(id: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/sys/class/block/ublkb{id}/dev")).ok()?;
    let (major, minor) = text.trim().split_once(':')?;
    Some(libc::makedev(major.parse().ok()?, minor.parse().ok()?))
}

/// Every other process with `/dev/ublkb{id}` open, by pid.
pub fn openers(id: u32) -> Vec<Opener> {
    let Some(dev) = devno(id) else { return Vec::new() };
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return found };
    for entry in procs.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        // A process may exit, or deny us its fds, while we look.
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        let holds = fds.flatten().any(|fd| {
            std::fs::metadata(fd.path()).is_ok_and(|m| m.file_type().is_block_device() && m.rdev() == dev)
        });
        if holds {
            let command = std::fs::read_to_string(entry.path().join("comm"))
                .map(|c| c.trim().to_string())
                .unwrap_or_else(|_| "?".to_string());
            found.push(Opener { pid, command });
        }
    }
    found.sort_by_key(|o| o.pid);
    found
}

/// The openers as one phrase for an error message.
pub fn describe(openers: &[Opener]) -> String {
    openers.iter().map(Opener::to_string).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_each_opener_with_its_pid() {
        let o =
            [Opener { pid: 7, command: "qemu-system-x86".into() }, Opener { pid: 9, command: "fio".into() }];
        assert_eq!(describe(&o), "qemu-system-x86 (pid 7), fio (pid 9)");
    }

    #[test]
    fn a_missing_device_has_no_openers() {
        assert!(openers(u32::MAX).is_empty());
    }
}

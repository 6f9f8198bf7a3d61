//! The guest kernel's own account: every message since boot that means an
//! IO error reached the guest, a filesystem gave up, or a task hung.

use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

/// Words in a kernel message that mean the disk failed the guest.
const TROUBLE: &[&str] = &[
    "I/O error",
    "EXT4-fs error",
    "Remounting filesystem read-only",
    "Aborting journal",
    "blocked for more than",
    "hung_task",
    "critical medium error",
];

/// Whether one kernel message is trouble.
pub fn is_trouble(message: &str) -> bool {
    TROUBLE.iter().any(|t| message.contains(t))
}

/// Every troubling message in the kernel's log (from /dev/kmsg, which
/// keeps the whole buffer since boot and never blocks with O_NONBLOCK).
pub fn trouble() -> Result<Vec<String>, String> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .map_err(|e| format!("opening /dev/kmsg: {e}"))?;
    let mut found = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                let record = String::from_utf8_lossy(&buf[..n]);
                // "PRI,SEQ,USECS,FLAGS;message\n" then continuation lines.
                let message = record.split_once(';').map(|(_, m)| m).unwrap_or(&record);
                let first = message.lines().next().unwrap_or("");
                if is_trouble(first) {
                    found.push(first.to_string());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // A record overwritten while we read: the next read goes on.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) => return Err(format!("reading /dev/kmsg: {e}")),
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    #[test]
    fn knows_trouble_when_it_sees_it() {
        assert!(super::is_trouble(
            "I/O error, dev vdb, sector 2048 op 0x1:(WRITE) flags 0x800 phys_seg 1 prio class 2"
        ));
        assert!(super::is_trouble("EXT4-fs (vdb): Remounting filesystem read-only"));
        assert!(super::is_trouble("INFO: task kworker/u2:1:45 blocked for more than 120 seconds."));
        assert!(!super::is_trouble("Write protecting the kernel read-only data: 28672k"));
        assert!(!super::is_trouble("EXT4-fs (vdb): mounted filesystem 1c8e r/w with ordered data mode."));
        assert!(!super::is_trouble(
            "virtio_blk virtio1: [vdb] 524288 512-byte logical blocks (268 MB/256 MiB)"
        ));
    }
}

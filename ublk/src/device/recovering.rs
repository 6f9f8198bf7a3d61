//! Which devices are being recovered now, for `casblk list`: while a
//! process drives a device's recovery (a `casblk recover` waiting for its
//! daemon, or a service daemon recovering what it found in /run), it holds
//! `/run/casblk/dev-<id>.recovering`, which names its pid. The kernel shows
//! such a device as QUIESCED until the new daemon's queues are up; a mark
//! whose process is gone (it died mid-recovery) counts for nothing.

use std::path::PathBuf;

fn path(id: u32) -> PathBuf {
    PathBuf::from(crate::device::state::STATE_DIR).join(format!("dev-{id}.recovering"))
}

/// Held while this process recovers device `id`; removed on drop.
pub struct RecoveringMark {
    id: u32,
}

impl RecoveringMark {
    /// Best effort: a mark that cannot be written only makes `list` say
    /// "quiesced" instead of "recovering".
    pub fn new(id: u32) -> RecoveringMark {
        let _ = std::fs::create_dir_all(crate::device::state::STATE_DIR);
        if let Err(e) = std::fs::write(path(id), format!("{}\n", std::process::id())) {
            tracing::debug!(dev = id, "cannot mark the device as recovering: {e}");
        }
        RecoveringMark { id }
    }
}

impl Drop for RecoveringMark {
    fn drop(&mut self) {
        // Only our own mark: a later recovery may have replaced it.
        if recovering_pid(self.id) == Some(std::process::id() as i32) {
            let _ = std::fs::remove_file(path(self.id));
        }
    }
}

/// The live process recovering device `id`, if any.
pub fn recovering_pid(id: u32) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(path(id)).ok()?.trim().parse().ok()?;
    crate::device::driver::process_exists(pid).then_some(pid)
}

/// Forgets device `id`'s mark (the device is deleted).
pub fn forget(id: u32) {
    let _ = std::fs::remove_file(path(id));
}

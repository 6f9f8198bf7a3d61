//! Discard from inside the guest: fill a filesystem with data no other
//! block shares, delete it and `fstrim`, so the harness can watch the
//! store give the space back.

use crate::files::Rng;
use std::io::Write;

const CHUNK_BYTES: usize = 1 << 20;

/// Writes `bytes` of unique data to `path` and fsyncs it.
pub fn fill(path: &str, bytes: u64, seed: u64) -> Result<(), String> {
    let mut f = std::fs::File::create(path).map_err(|e| format!("creating {path}: {e}"))?;
    let mut rng = Rng::new(seed);
    let mut chunk = vec![0u8; CHUNK_BYTES];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(CHUNK_BYTES as u64) as usize;
        rng.fill(&mut chunk[..n]);
        f.write_all(&chunk[..n]).map_err(|e| format!("writing {path}: {e}"))?;
        left -= n as u64;
    }
    f.sync_all().map_err(|e| format!("fsync of {path}: {e}"))
}

/// Deletes `path`, syncs its filesystem (so the freed blocks are free on
/// disk) and trims every free block of the filesystem at `mount`; returns
/// what the filesystem reports trimmed.
pub fn delete_and_trim(path: &str, mount: &str) -> Result<u64, String> {
    std::fs::remove_file(path).map_err(|e| format!("removing {path}: {e}"))?;
    // SAFETY: sync(2) takes no arguments.
    unsafe { libc::sync() };
    crate::sys::fstrim(mount)
}

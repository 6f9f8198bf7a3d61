//! Replacing a small file whole: written to `<name>.tmp`, synced, renamed
//! over `<name>` and the directory synced, so a crash leaves the old file
//! or the new one, never a mix (a `.tmp` may be left behind; its owner's
//! open or fsck removes it). And reading such a file back whole.

use super::{OpenMode, Storage};
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// Where `write_atomic` writes `dir/name` before its rename.
pub fn tmp_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.tmp"))
}

/// The whole of `path`, or None if it does not exist; a file longer than
/// `max_bytes` is refused as corruption (`what of N bytes`).
pub fn read_small(storage: &dyn Storage, path: &Path, max_bytes: u64, what: &str) -> Result<Option<Vec<u8>>> {
    if !storage.exists(path) {
        return Ok(None);
    }
    let f = storage.open(path, OpenMode::Existing)?;
    let len = f.len()?;
    if len > max_bytes {
        return Err(Error::Corruption {
            path: path.to_path_buf(),
            offset: 0,
            detail: format!("{what} of {len} bytes"),
        });
    }
    let mut buf = vec![0u8; len as usize];
    f.read_exact_at(&mut buf, 0)?;
    Ok(Some(buf))
}

/// Writes `bytes` as `dir/name` atomically and durably.
pub fn write_atomic(storage: &dyn Storage, dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    let tmp = tmp_path(dir, name);
    let f = storage.open(&tmp, OpenMode::Create)?;
    f.set_len(0)?;
    f.write_all_at(bytes, 0)?;
    f.sync_data()?;
    storage.rename(&tmp, &dir.join(name))?;
    storage.sync_dir(dir)
}

//! Replacing a small file whole: written to `<name>.tmp`, synced, renamed
//! over `<name>` and the directory synced, so a crash leaves the old file
//! or the new one, never a mix (a `.tmp` may be left behind; its owner's
//! open or fsck removes it).

use super::{OpenMode, Storage};
use crate::error::Result;
use std::path::{Path, PathBuf};

/// Where `write_atomic` writes `dir/name` before its rename.
pub fn tmp_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.tmp"))
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

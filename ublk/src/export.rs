//! `casblk image export NAME FILE`: an image's contents as a raw, sparse
//! file, read from a store nothing serves (a running daemon's images are
//! changing under it; stop their devices first).
//!
//! Blocks that read as zeros (holes, discarded or zeroed ranges, or data
//! that happens to be zero) are not written, so the file is sparse where
//! the filesystem allows; its length is the image's size. The file is
//! synced before the command returns.

use anyhow::{anyhow, bail, Context, Result};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// Bytes read from the image per step.
const STEP_BYTES: usize = 1 << 20;
const BLOCK_BYTES: usize = 4096;

pub fn export(store: &Path, name: &str, output: &Path, format: &str) -> Result<()> {
    if format != "raw" {
        bail!("export format {format:?} is not supported; use --format raw");
    }
    let dir = crate::client::store_dir(store, false)?;
    let storage: Arc<dyn cas::storage::Storage> = Arc::new(cas::storage::FsStorage::new());
    let opts = cas::StoreOptions { background_compaction: false, ..cas::StoreOptions::default() };
    let store = cas::Store::open(storage, &dir, opts).map_err(|e| match e {
        cas::Error::Unavailable(..) => anyhow!(
            "store {} is served by a running casblk daemon; export reads a store nothing serves \
             (stop its devices first)",
            dir.display()
        ),
        e => anyhow!("store {}: {e}", dir.display()),
    })?;
    let image = store.open_image(name).with_context(|| format!("image {name}"))?;
    let size = image.size_bytes();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(output)
        .with_context(|| format!("creating {}", output.display()))?;
    let mut buf = vec![0u8; STEP_BYTES];
    let mut at = 0u64;
    while at < size {
        let n = (size - at).min(STEP_BYTES as u64) as usize;
        image.read(at, &mut buf[..n]).with_context(|| format!("reading image {name} at byte {at}"))?;
        for (i, block) in buf[..n].chunks(BLOCK_BYTES).enumerate() {
            if !cas::chunk::is_zero_block(block) {
                let off = at + (i * BLOCK_BYTES) as u64;
                file.write_all_at(block, off).with_context(|| format!("writing {}", output.display()))?;
            }
        }
        at += n as u64;
    }
    file.set_len(size).with_context(|| format!("sizing {}", output.display()))?;
    file.sync_all().with_context(|| format!("syncing {}", output.display()))?;
    Ok(())
}

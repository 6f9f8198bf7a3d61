//! Importing a raw disk image as a new image, straight into chunks and the
//! manifest: no write-ahead log, no compaction pass.
//!
//! ```text
//!  source --8 MiB batches--> 4 KiB blocks: zero -> hole (skipped)
//!                                          else blake3 -> insert_located
//!  per 256 MiB of source (and at the end): chunks.sync(), then one
//!  manifest commit (covered 0) of the batches' edits
//!  at the end: IMAGE written atomically -> the image exists
//! ```
//!
//! The image exists only once its `IMAGE` file does, after every batch is
//! durable, so a crash or error mid-import leaves no image, only a
//! directory the next create of the name (or `casblk fsck --repair`)
//! clears. One chunk pin is held for the whole import: a GC pass meanwhile
//! cannot sweep the chunks of the manifest it does not see yet (it waits
//! for the pin, bounded, and gives up instead). Memory: one batch buffer.

use super::{lock, Store, MANIFEST_FILE};
use crate::chunk::{is_zero_block, ChunkHash};
use crate::error::{Error, Result};
use crate::manifest::Manifest;
use crate::units::BLOCK_BYTES;
use std::io::Read;

/// Bytes read, hashed and inserted per batch (the one buffer).
const BATCH_BYTES: usize = 8 << 20;
/// Source bytes per chunk sync and manifest commit: few syncs, and at most
/// 64 Ki block edits (about 2 MiB) held between commits.
const COMMIT_BYTES: u64 = 256 << 20;

/// What an import did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ImportReport {
    pub bytes_read: u64,
    /// Blocks that were all zeros: holes, nothing stored.
    pub zero_blocks: u64,
    /// Blocks stored as new chunks.
    pub new_chunks: u64,
    /// Blocks whose chunk was already stored (this image or another).
    pub dedup_blocks: u64,
    pub manifest_commits: u64,
}

impl Store {
    /// Creates image `name` of `size_bytes` (a multiple of 4096) holding
    /// the first `size_bytes` read from `src`; a source that ends early
    /// reads as zeros after its end. `progress` is called with the bytes
    /// read so far after every batch. The image must not exist.
    pub fn import_image(
        &self,
        name: &str,
        size_bytes: u64,
        src: &mut dyn Read,
        progress: &mut dyn FnMut(u64),
    ) -> Result<ImportReport> {
        let _maint = lock(&self.maint);
        let (dir, header) = self.prepare_image(name, size_bytes)?;
        let result = self.import_into(&dir, size_bytes, src, progress);
        match result {
            Ok(report) => {
                self.install_image(&dir, header)?;
                Ok(report)
            }
            Err(e) => {
                // Nothing references the directory; its chunks are garbage.
                if let Err(cleanup) = self.storage.remove_dir_all(&dir) {
                    tracing::warn!(dir = %dir.display(), "removing a failed import: {cleanup}");
                }
                Err(e)
            }
        }
    }

    fn import_into(
        &self,
        dir: &std::path::Path,
        size_bytes: u64,
        src: &mut dyn Read,
        progress: &mut dyn FnMut(u64),
    ) -> Result<ImportReport> {
        // Through the store's page cache: an import's pages count against
        // the one bound, however many imports run.
        let manifest =
            Manifest::open(self.storage.clone(), &dir.join(MANIFEST_FILE), self.manifest_options())?;
        let pin = self.chunks.pin();
        let mut report = ImportReport::default();
        let mut buf = vec![0u8; BATCH_BYTES];
        let mut at = 0u64;
        let mut ended = false;
        let mut edit = manifest.begin();
        let mut refs = Vec::new();
        let mut pending = 0u64;
        while at < size_bytes {
            let want = (size_bytes - at).min(BATCH_BYTES as u64) as usize;
            let mut got = 0;
            while got < want && !ended {
                match src.read(&mut buf[got..want]) {
                    Ok(0) => ended = true,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(Error::io(dir.join("<import source>"), e)),
                }
            }
            report.bytes_read += got as u64;
            buf[got..want].fill(0);
            let first_block = at / BLOCK_BYTES;
            let mut items: Vec<(ChunkHash, &[u8])> = Vec::new();
            let mut blocks: Vec<u64> = Vec::new();
            for (i, block) in buf[..want].chunks(BLOCK_BYTES as usize).enumerate() {
                if is_zero_block(block) {
                    report.zero_blocks += 1;
                    continue;
                }
                let hash = ChunkHash::of(block);
                items.push((hash, block));
                blocks.push(first_block + i as u64);
            }
            if !items.is_empty() {
                let stats = self.chunks.insert_located(&pin, &items, &mut refs)?;
                report.new_chunks += stats.new_chunks;
                report.dedup_blocks += items.len() as u64 - stats.new_chunks;
                for (&block, r) in blocks.iter().zip(&refs) {
                    edit.set(block, Some(*r));
                }
                pending += want as u64;
            }
            at += want as u64;
            if pending >= COMMIT_BYTES || (at >= size_bytes && pending > 0) {
                // The chunks are durable before the manifest names them.
                self.chunks.sync()?;
                std::mem::replace(&mut edit, manifest.begin()).commit(0)?;
                report.manifest_commits += 1;
                pending = 0;
            }
            progress(report.bytes_read);
        }
        drop(pin);
        Ok(report)
    }
}

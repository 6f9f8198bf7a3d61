//! Exporting an image as a raw, sparse file: every block is read through
//! the image (log overlay, then chunks, then holes); blocks that read as
//! zeros are not written, so the file's holes are the image's; its length
//! is the image's size; it is synced before this returns.

use super::Store;
use crate::chunk::is_zero_block;
use crate::error::{Error, Result};
use crate::units::BLOCK_BYTES;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes read from the image per step.
const STEP_BYTES: usize = 1 << 20;

/// What an export did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ExportReport {
    pub bytes: u64,
    /// Blocks written to the file (the rest are holes).
    pub data_blocks: u64,
}

impl Store {
    /// Writes image `name` into `file` (at `path`, for messages), raw and
    /// sparse; `progress` gets the bytes done after every step.
    pub fn export_image(
        &self,
        name: &str,
        file: &File,
        path: &Path,
        progress: &mut dyn FnMut(u64),
    ) -> Result<ExportReport> {
        let image = self.open_image(name)?;
        let size = image.size_bytes();
        let io = |e| Error::io(path, e);
        let mut report = ExportReport { bytes: size, data_blocks: 0 };
        let mut buf = vec![0u8; STEP_BYTES];
        let mut at = 0u64;
        while at < size {
            let n = (size - at).min(STEP_BYTES as u64) as usize;
            image.read(at, &mut buf[..n])?;
            for (i, block) in buf[..n].chunks(BLOCK_BYTES as usize).enumerate() {
                if !is_zero_block(block) {
                    file.write_all_at(block, at + i as u64 * BLOCK_BYTES).map_err(io)?;
                    report.data_blocks += 1;
                }
            }
            at += n as u64;
            progress(at);
        }
        file.set_len(size).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(report)
    }
}

//! The seam between an image's log overlay and its compacted data: what a
//! read asks for every sector the overlay does not hold.
//!
//! The cas-chunk side (`cas::manifest::Manifest` plus `cas::chunk::ChunkStore`)
//! implements [`ManifestView`]; until then, and for images never compacted,
//! [`EmptyManifest`] says every block is a hole.

use crate::error::Result;
use crate::io::{IoCx, Wait};

pub use crate::units::{ChunkHash, ChunkRef, BLOCK_BYTES};

/// Compacted data of one image: block -> chunk ref, and the chunk bytes.
pub trait ManifestView: Send + Sync {
    /// The chunk holding `block` (image offset / 4096), or None for a hole.
    /// Pages not in memory are read as `wait` allows.
    fn lookup(&self, block: u64, wait: Wait) -> Result<Option<ChunkRef>>;
    /// Looks up `out.len()` consecutive blocks from `first_block`, all from
    /// one view of the data. The default asks [`ManifestView::lookup`] per
    /// block; a tree overrides it with one walk per leaf.
    fn lookup_range(&self, first_block: u64, out: &mut [Option<ChunkRef>], wait: Wait) -> Result<()> {
        for (i, o) in out.iter_mut().enumerate() {
            *o = self.lookup(first_block + i as u64, wait)?;
        }
        Ok(())
    }
    /// Reads the 4096 bytes of chunk `r` into `out` (`out.len()` is 4096),
    /// in the context `cx` (its wait, and where its I/O time goes).
    fn read_chunk(&self, r: &ChunkRef, out: &mut [u8], cx: IoCx<'_>) -> Result<()>;
}

/// A manifest with no blocks: everything outside the overlay reads as zeros.
#[derive(Clone, Copy, Debug, Default)]
pub struct EmptyManifest;

impl ManifestView for EmptyManifest {
    fn lookup(&self, _block: u64, _wait: Wait) -> Result<Option<ChunkRef>> {
        Ok(None)
    }

    fn read_chunk(&self, r: &ChunkRef, _out: &mut [u8], _cx: IoCx<'_>) -> Result<()> {
        Err(crate::Error::NotFound(format!("chunk {} in an empty manifest", r.tag)))
    }
}

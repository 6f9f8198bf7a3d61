//! The read path of an image: the overlay's log pieces, then the
//! manifest's chunks per window of blocks, then zeros; in the request's
//! [`IoCx`] (whether it may wait, where its I/O time goes), counted by
//! source once the read is done.
//!
//! ```text
//!  read_in(cx, off, buf) --lookup--> Overlay pieces       short read lock
//!        +-- Log piece:  pread from the segment           cx.io(Log)
//!        +-- Zero piece: zeros
//!        +-- gap: read_compacted: ManifestView::lookup_range per window
//!                 (cx.io(Manifest)), read_block per mapped block
//! ```

use super::overlay::Source;
use super::stats::bump;
use super::{read_lock, sectors, ChunkRef, Image, ManifestView, BLOCK_BYTES};
use crate::error::{Error, Result};
use crate::io::IoCx;
use crate::units::SECTOR_BYTES;
use std::sync::Arc;
use trace::IoSource;

/// Blocks a read looks up per manifest walk (128 KiB of image; the hashes
/// sit on the stack).
const LOOKUP_WINDOW_BLOCKS: usize = 32;

/// Times a read looks a block up again after its chunk was swept between
/// the lookup and the read (see `Image::read_block`).
const REMAPPED_READ_TRIES: usize = 8;

impl Image {
    /// Reads `buf.len()` bytes at `offset`: newest log data, else the
    /// manifest's chunk, else zeros.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_in(IoCx::default(), offset, buf)
    }

    /// [`Image::read`] in the context `cx`. A read that fails with
    /// `Error::WouldBlock` (`cx` must not wait) is not counted.
    pub fn read_in(&self, cx: IoCx<'_>, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let mut tally = ReadTally::default();
        let result = self.read_sources(cx, offset, buf, &mut tally);
        if !matches!(result, Err(Error::WouldBlock)) {
            self.count_read(buf.len(), &tally);
        }
        result
    }

    /// [`Image::read`] that never waits for a device: `Ok(false)` when some
    /// source is not in memory (the page cache, the chunk cache), and then
    /// nothing is counted and `buf` holds no result. A ublk queue thread
    /// serves a read in place this way and hands it to a worker otherwise.
    pub fn read_nowait(&self, offset: u64, buf: &mut [u8]) -> Result<bool> {
        self.read_nowait_in(IoCx::default(), offset, buf)
    }

    /// [`Image::read_nowait`] in the context `cx` (whose `wait` it overrides).
    pub fn read_nowait_in(&self, cx: IoCx<'_>, offset: u64, buf: &mut [u8]) -> Result<bool> {
        match self.read_in(cx.nowait(), offset, buf) {
            Err(Error::WouldBlock) => Ok(false),
            result => result.map(|()| true),
        }
    }

    fn count_read(&self, len: usize, t: &ReadTally) {
        let c = &self.counters;
        bump(&c.reads, 1);
        bump(&c.read_bytes, len as u64);
        for (counter, bytes) in [
            (&c.read_zero_bytes, t.zero),
            (&c.read_log_bytes, t.log),
            (&c.read_hole_bytes, t.hole),
            (&c.read_chunk_bytes, t.chunk),
        ] {
            if bytes > 0 {
                bump(counter, bytes);
            }
        }
    }

    fn read_sources(
        &self,
        cx: IoCx<'_>,
        offset_bytes: u64,
        buf: &mut [u8],
        tally: &mut ReadTally,
    ) -> Result<()> {
        let first_sector = sectors(offset_bytes);
        let pieces = read_lock(&self.overlay).lookup(first_sector, sectors(buf.len() as u64));
        for p in pieces {
            let out = &mut buf[((p.start_sector - first_sector) * SECTOR_BYTES) as usize..]
                [..(p.sectors * SECTOR_BYTES) as usize];
            match p.src {
                Some(Source::Zero) => {
                    out.fill(0);
                    tally.zero += out.len() as u64;
                }
                Some(Source::Log { segment, position_bytes }) => {
                    cx.io(IoSource::Log, || segment.file.read_exact_at_in(out, position_bytes, cx.wait))?;
                    tally.log += out.len() as u64;
                }
                None => self.read_compacted(cx, p.start_sector * SECTOR_BYTES, out, tally)?,
            }
        }
        Ok(())
    }

    /// Reads bytes the overlay does not hold from the manifest, looking up
    /// a window of blocks per tree walk. Whole blocks are read in place;
    /// only partial ones go through a scratch block on the stack (no
    /// allocation per read: 4 KiB allocations went to the allocator's
    /// shared arenas, whose locks stalled reads).
    fn read_compacted(
        &self,
        cx: IoCx<'_>,
        offset_bytes: u64,
        out: &mut [u8],
        tally: &mut ReadTally,
    ) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        let manifest = read_lock(&self.manifest).clone();
        let last_block = (offset_bytes + out.len() as u64 - 1) / BLOCK_BYTES;
        let mut refs = [None; LOOKUP_WINDOW_BLOCKS];
        let mut done = 0usize;
        while done < out.len() {
            let first_block = (offset_bytes + done as u64) / BLOCK_BYTES;
            let window_blocks = ((last_block - first_block + 1) as usize).min(LOOKUP_WINDOW_BLOCKS);
            let window = &mut refs[..window_blocks];
            cx.io(IoSource::Manifest, || manifest.lookup_range(first_block, window, cx.wait))?;
            for (block, r) in (first_block..).zip(window.iter()) {
                let in_block = ((offset_bytes + done as u64) % BLOCK_BYTES) as usize;
                let n = (BLOCK_BYTES as usize - in_block).min(out.len() - done);
                let dst = &mut out[done..done + n];
                match r {
                    None => {
                        dst.fill(0);
                        tally.hole += n as u64;
                    }
                    Some(r) if n == BLOCK_BYTES as usize => {
                        // A whole block: straight into the caller's buffer.
                        tally.count(self.read_block(cx, &manifest, block, *r, dst)?, n);
                    }
                    Some(r) => {
                        let mut scratch = [0u8; BLOCK_BYTES as usize];
                        let found = self.read_block(cx, &manifest, block, *r, &mut scratch)?;
                        dst.copy_from_slice(&scratch[in_block..in_block + n]);
                        tally.count(found, n);
                    }
                }
                done += n;
            }
        }
        Ok(())
    }

    /// Reads block `block`'s 4096 bytes, which `view` maps to `r`, into
    /// `out`. The lookup and the read are not atomic: a compaction commit
    /// may remap the block in between (a partial write merged into a new
    /// chunk; the sectors this read wants are the same in both) and a GC
    /// pass may then sweep the old chunk. So a chunk that is gone is looked
    /// up again in the newest view, a bounded number of times; a block
    /// still mapped to a chunk that is missing twice is damage and fails
    /// the read.
    /// Returns what was read: a chunk, or zeros for a block that became a
    /// hole.
    fn read_block(
        &self,
        cx: IoCx<'_>,
        view: &Arc<dyn ManifestView>,
        block: u64,
        r: ChunkRef,
        out: &mut [u8],
    ) -> Result<Found> {
        // The caller's view until a chunk is missing, then the newest (a
        // clone only then: this is every read's path).
        let mut newer: Option<Arc<dyn ManifestView>> = None;
        let mut r = r;
        // Set once the newest view still maps the block to the missing
        // chunk: a chunk swept and inserted again (content-addressed, so a
        // block can go C1 -> C2 -> C1) is read once more, then it is damage.
        let mut still_mapped = false;
        for _ in 0..REMAPPED_READ_TRIES {
            match newer.as_ref().unwrap_or(view).read_chunk(&r, out, cx) {
                Err(Error::NotFound(what)) => {
                    let view = newer.insert(read_lock(&self.manifest).clone());
                    match cx.io(IoSource::Manifest, || view.lookup(block, cx.wait))? {
                        Some(now) if now.tag == r.tag && still_mapped => return Err(Error::NotFound(what)),
                        Some(now) if now.tag == r.tag => (r, still_mapped) = (now, true),
                        Some(now) => (r, still_mapped) = (now, false),
                        None => {
                            out.fill(0);
                            return Ok(Found::Hole);
                        }
                    }
                }
                result => return result.map(|()| Found::Chunk),
            }
        }
        Err(Error::Unavailable(
            format!("block {block} of image {}", self.name),
            format!("its chunk was swept {REMAPPED_READ_TRIES} times between lookup and read"),
        ))
    }
}

/// Bytes of one read by source, counted once the read is done.
#[derive(Default)]
struct ReadTally {
    zero: u64,
    log: u64,
    hole: u64,
    chunk: u64,
}

impl ReadTally {
    fn count(&mut self, found: Found, bytes: usize) {
        match found {
            Found::Chunk => self.chunk += bytes as u64,
            Found::Hole => self.hole += bytes as u64,
        }
    }
}

/// What a block the manifest mapped turned out to hold.
#[derive(Clone, Copy)]
enum Found {
    Chunk,
    Hole,
}

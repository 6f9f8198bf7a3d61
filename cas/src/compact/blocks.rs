//! Phase 2 of a batch, on the reading thread: walk the batch map in block
//! order, hash the blocks the batch rewrites whole (or leave them to the
//! inserting thread, below), and hand the results to the inserting thread
//! in sub-batches.
//!
//! ```text
//!  batch map extents (sectors, in order)
//!    |  whole 4 KiB block from one WRITE  -> hash it in place (no copy), or
//!    |                                       Whole { at }: the inserter hashes it
//!    |  whole block of zeros / DISCARD    -> Holes { first, count } (runs)
//!    |  block from several pieces         -> assembled, then hashed
//!    |  block only partly in the batch    -> Partial { mask } (the inserter
//!    v                                       merges it with the older content)
//!  SubBatch { items (<= SUB_BATCH_ITEMS), extra bytes, Arc<Batch> }
//! ```
//!
//! All-zero data blocks become holes, never chunks.
//!
//! Who hashes: the reading thread reads, checks and hashes, the inserting
//! thread merges partial blocks (hashing those), looks up and writes, so
//! with the reader busy the inserter waits for it. A queue-length
//! heuristic moves hashing to the side with time: when the channel to the
//! inserter holds nothing at the start of a batch, or at most the
//! sub-batch just sent at the start of the next one, that sub-batch's
//! whole blocks go unhashed (`Item::Whole`) and the inserter hashes them
//! (`ci/bench compaction`, 2 cores: see docs/design.md, "Compaction").

use super::budget::{GrowBuf, Lease};
use super::reader::{Batch, BatchSrc, Cursor};
use super::stats::CompactStats;
use crate::chunk::{is_zero_block, ChunkHash};
use crate::error::Result;
use crate::units::{BLOCK_BYTES, SECTORS_PER_BLOCK, SECTOR_BYTES};
use std::sync::Arc;
use std::time::Instant;

/// Items per sub-batch (1 MiB of blocks).
pub const SUB_BATCH_ITEMS: usize = 256;

const BLOCK: usize = BLOCK_BYTES as usize;

/// Where an item's 4096 bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// In the batch buffer (a WRITE payload, hashed in place).
    Batch(usize),
    /// In the sub-batch's extra buffer (assembled).
    Extra(usize),
}

/// What a batch does to one block (or a run of blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Item {
    /// Blocks `first .. first + count` become holes.
    Holes { first: u64, count: u64 },
    /// `block` is now chunk `hash`, whose bytes are at `at`.
    Chunk { block: u64, hash: ChunkHash, at: At },
    /// `block` is now the chunk of the bytes at `at`, not yet hashed (the
    /// inserter hashes it: see the module docs).
    Whole { block: u64, at: At },
    /// Only the sectors in `mask` (bit i = sector i) are new; their bytes
    /// are in the extra buffer at `at` (the other sectors zero there).
    Partial { block: u64, mask: u8, at: usize },
}

const _: () = assert!(SECTORS_PER_BLOCK == u8::BITS as u64, "a Partial mask has one bit per sector");

/// Items for the inserting thread.
pub struct SubBatch<'b> {
    pub batch: Arc<Batch<'b>>,
    pub items: Vec<Item>,
    pub extra: GrowBuf,
}

impl SubBatch<'_> {
    /// The 4096 bytes at `at`.
    pub fn bytes(&self, at: At) -> &[u8] {
        match at {
            At::Batch(o) => &self.batch.buf.as_slice()[o..o + BLOCK],
            At::Extra(o) => &self.extra.as_slice()[o..o + BLOCK],
        }
    }
}

/// What the reading thread sends.
pub enum Msg<'b> {
    Blocks(SubBatch<'b>),
    /// The batch is complete: commit it as covering `covered`.
    End {
        batch: Arc<Batch<'b>>,
        covered: u64,
        next: Cursor,
        work: Box<CompactStats>,
    },
}

/// Buffers coming back for reuse.
pub enum Back<'b> {
    Batch(Arc<Batch<'b>>),
    Extra(GrowBuf),
}

/// What the emitter returns after sending a sub-batch.
pub struct Sent {
    /// An empty extra buffer for the next sub-batch.
    pub extra: GrowBuf,
    /// The inserter has at most the sub-batch just sent queued: leave the
    /// next sub-batch's whole blocks for it to hash.
    pub inserter_idle: bool,
}

/// The emitter: sends a full sub-batch.
pub type Emit<'e, 'b> = dyn FnMut(SubBatch<'b>) -> Result<Sent> + 'e;

/// Walks one batch (see the module docs).
pub struct Walker<'w, 'b> {
    batch: Arc<Batch<'b>>,
    items: Vec<Item>,
    extra: GrowBuf,
    /// The block being assembled from several extents, and its sectors so far.
    pending: Option<(u64, u8)>,
    scratch: Box<[u8; BLOCK]>,
    lease: &'w mut Lease<'b>,
    /// The sub-batch being built leaves its whole blocks unhashed.
    defer_hash: bool,
    pub work: CompactStats,
}

impl<'w, 'b> Walker<'w, 'b> {
    /// `defer_hash`: the first sub-batch leaves its whole blocks unhashed.
    pub fn new(
        batch: Arc<Batch<'b>>,
        extra: GrowBuf,
        lease: &'w mut Lease<'b>,
        defer_hash: bool,
    ) -> Walker<'w, 'b> {
        Walker {
            batch,
            items: Vec::with_capacity(SUB_BATCH_ITEMS),
            extra,
            pending: None,
            scratch: Box::new([0u8; BLOCK]),
            lease,
            defer_hash,
            work: CompactStats { bytes_initialized: BLOCK as u64, ..CompactStats::default() },
        }
    }

    /// Walks the whole map. `emit` sends a sub-batch and returns a fresh
    /// extra buffer and whether to leave the next one's hashing (`Sent`).
    pub fn run(mut self, emit: &mut Emit<'_, 'b>) -> Result<CompactStats> {
        let batch = self.batch.clone();
        for (start, len, src) in batch.map.extents() {
            let end = start + len;
            let mut s = start;
            while s < end {
                let block = s / SECTORS_PER_BLOCK;
                let block_start = block * SECTORS_PER_BLOCK;
                if s > block_start || end < block_start + SECTORS_PER_BLOCK {
                    let piece_end = end.min(block_start + SECTORS_PER_BLOCK);
                    self.add_piece(block, s - block_start, piece_end - s, src_at(src, s - start), emit)?;
                    s = piece_end;
                    continue;
                }
                self.flush_pending(emit)?;
                let full_end = end / SECTORS_PER_BLOCK * SECTORS_PER_BLOCK;
                let count = (full_end - s) / SECTORS_PER_BLOCK;
                match src_at(src, s - start) {
                    BatchSrc::Zero => self.push_holes(block, count, emit)?,
                    BatchSrc::Mem(at) => {
                        for i in 0..count {
                            self.whole_block(block + i, at as usize + i as usize * BLOCK, emit)?;
                        }
                    }
                }
                s = full_end;
            }
        }
        self.flush_pending(emit)?;
        self.send(emit)?;
        Ok(self.work)
    }

    fn push(&mut self, item: Item, emit: &mut Emit<'_, 'b>) -> Result<()> {
        self.items.push(item);
        if self.items.len() >= SUB_BATCH_ITEMS {
            self.send(emit)?;
        }
        Ok(())
    }

    fn send(&mut self, emit: &mut Emit<'_, 'b>) -> Result<()> {
        if self.items.is_empty() {
            return Ok(());
        }
        let items = std::mem::replace(&mut self.items, Vec::with_capacity(SUB_BATCH_ITEMS));
        let extra = std::mem::take(&mut self.extra);
        let sent = emit(SubBatch { batch: self.batch.clone(), items, extra })?;
        self.extra = sent.extra;
        self.extra.clear();
        self.defer_hash = sent.inserter_idle;
        Ok(())
    }

    fn push_holes(&mut self, first: u64, count: u64, emit: &mut Emit<'_, 'b>) -> Result<()> {
        self.work.blocks_holes += count;
        if let Some(Item::Holes { first: f, count: c }) = self.items.last_mut() {
            if *f + *c == first {
                *c += count;
                return Ok(());
            }
        }
        self.push(Item::Holes { first, count }, emit)
    }

    /// A block the batch rewrites whole from one WRITE: hashed in place
    /// (here, or by the inserter).
    fn whole_block(&mut self, block: u64, at: usize, emit: &mut Emit<'_, 'b>) -> Result<()> {
        let data = &self.batch.buf.as_slice()[at..at + BLOCK];
        if is_zero_block(data) {
            return self.push_holes(block, 1, emit);
        }
        self.work.blocks_mapped += 1;
        if self.defer_hash {
            self.work.blocks_hashed_by_inserter += 1;
            return self.push(Item::Whole { block, at: At::Batch(at) }, emit);
        }
        let t = Instant::now();
        let hash = ChunkHash::of(data);
        self.work.hash_ns += t.elapsed().as_nanos() as u64;
        self.push(Item::Chunk { block, hash, at: At::Batch(at) }, emit)
    }

    /// Adds sectors `[first, first + n)` of `block` from `src`.
    fn add_piece(
        &mut self,
        block: u64,
        first: u64,
        n: u64,
        src: BatchSrc,
        emit: &mut Emit<'_, 'b>,
    ) -> Result<()> {
        if self.pending.is_some_and(|(b, _)| b != block) {
            self.flush_pending(emit)?;
        }
        if self.pending.is_none() {
            self.scratch.fill(0);
            self.work.bytes_initialized += BLOCK as u64;
            self.pending = Some((block, 0));
        }
        let (from, len) = ((first * SECTOR_BYTES) as usize, (n * SECTOR_BYTES) as usize);
        let dst = &mut self.scratch[from..from + len];
        match src {
            BatchSrc::Zero => dst.fill(0),
            BatchSrc::Mem(at) => {
                dst.copy_from_slice(&self.batch.buf.as_slice()[at as usize..at as usize + len])
            }
        }
        let bits = ((1u16 << (first + n)) - (1u16 << first)) as u8;
        if let Some((_, mask)) = &mut self.pending {
            *mask |= bits;
        }
        Ok(())
    }

    /// Emits the block being assembled: whole (hashed here) or partial.
    fn flush_pending(&mut self, emit: &mut Emit<'_, 'b>) -> Result<()> {
        let Some((block, mask)) = self.pending.take() else { return Ok(()) };
        if mask == u8::MAX && is_zero_block(&self.scratch[..]) {
            return self.push_holes(block, 1, emit);
        }
        let at = self.extra.len();
        self.extra.extend(&self.scratch[..], self.lease, &mut self.work.bytes_initialized)?;
        if mask == u8::MAX {
            let t = Instant::now();
            let hash = ChunkHash::of(&self.scratch[..]);
            self.work.hash_ns += t.elapsed().as_nanos() as u64;
            self.work.blocks_mapped += 1;
            self.push(Item::Chunk { block, hash, at: At::Extra(at) }, emit)
        } else {
            self.work.blocks_merged += 1;
            self.push(Item::Partial { block, mask, at }, emit)
        }
    }
}

fn src_at(src: &BatchSrc, sectors: u64) -> BatchSrc {
    use crate::image::overlay::Advance;
    src.advanced(sectors)
}

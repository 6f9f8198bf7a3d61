//! The inserting thread of a pass: stores chunks, builds each batch's
//! manifest edit, and at each batch end runs the commit protocol.
//!
//! ```text
//!  per sub-batch:  Partial -> base (manifest chunk or hole) + new sectors -> hash
//!                  Holes   -> set None where the manifest maps something
//!                  Chunk   -> set Some(hash)
//!                  insert_missing(pin, new chunks)          one writer lock hold
//!  per batch end:  1. chunks.sync()                         chunks durable
//!                  2. edit.commit(covered)                  pages, then root, synced
//!                  3. drop the chunk pin                    (GC may sweep again)
//!                  4. cursor := next                        the validated hint
//!                  5. image.reclaim_log(covered)            overlay, segments, quota
//! ```
//!
//! The pin is taken before the batch's first insert and held until its
//! commit returned, so a concurrent GC never sweeps a chunk the commit
//! references. Partial blocks are merged here, not on the reading thread,
//! because only this thread commits: the manifest it reads is exactly the
//! state before the batch.

use super::blocks::{At, Item, SubBatch};
use super::budget::{GrowBuf, Lease};
use super::reader::Cursor;
use super::stats::CompactStats;
use super::{ImageCompaction, StopAt};
use crate::chunk::{hash_block, is_zero_block, ChunkHash, ChunkPin, ChunkStore};
use crate::error::Result;
use crate::image::{Image, BLOCK_BYTES};
use crate::manifest::{ManifestEdit, LEAF_ENTRIES};
use crate::wal::SECTOR_BYTES;
use std::time::Instant;

const BLOCK: usize = BLOCK_BYTES as usize;

/// Whether the pass goes on after a batch end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// A test asked the pass to stop at a step (see [`StopAt`]).
    Stopped,
}

/// The inserting side of one pass.
pub struct Inserter<'s> {
    image: &'s Image,
    state: &'s ImageCompaction,
    chunks: &'s ChunkStore,
    pin: Option<ChunkPin<'s>>,
    edit: Option<ManifestEdit<'s>>,
    /// Merged blocks of the current sub-batch.
    merged: GrowBuf,
    lease: Lease<'s>,
    base: Box<[u8; BLOCK]>,
    lookups: Vec<Option<ChunkHash>>,
    stop_at: StopAt,
    pub work: CompactStats,
    pub covered: u64,
}

impl<'s> Inserter<'s> {
    pub fn new(
        image: &'s Image,
        state: &'s ImageCompaction,
        chunks: &'s ChunkStore,
        lease: Lease<'s>,
        stop_at: StopAt,
    ) -> Inserter<'s> {
        Inserter {
            image,
            state,
            chunks,
            pin: None,
            edit: None,
            merged: GrowBuf::new(),
            lease,
            base: Box::new([0u8; BLOCK]),
            lookups: Vec::new(),
            stop_at,
            work: CompactStats { bytes_initialized: BLOCK as u64, ..CompactStats::default() },
            covered: state.manifest.covered(),
        }
    }

    /// Applies one sub-batch: edits, merges and chunk inserts.
    pub fn blocks(&mut self, sb: &SubBatch<'_>) -> Result<()> {
        let t = Instant::now();
        let manifest = &*self.state.manifest;
        if self.pin.is_none() {
            self.pin = Some(self.chunks.pin());
        }
        let edit = self.edit.get_or_insert_with(|| manifest.begin());
        self.merged.clear();
        // (hash, where): Some(at) in the sub-batch, None: in `merged` (in order).
        let mut new: Vec<(ChunkHash, Option<At>)> = Vec::with_capacity(sb.items.len());
        for item in &sb.items {
            match *item {
                Item::Holes { first, count } => {
                    let mut done = 0;
                    while done < count {
                        let block = first + done;
                        let n = (count - done).min(LEAF_ENTRIES as u64 - block % LEAF_ENTRIES as u64);
                        self.lookups.resize(n as usize, None);
                        manifest.lookup_range(block, &mut self.lookups)?;
                        for (i, old) in self.lookups.iter().enumerate() {
                            if old.is_some() {
                                edit.set(block + i as u64, None);
                            }
                        }
                        done += n;
                    }
                }
                Item::Chunk { block, hash, at } => {
                    edit.set(block, Some(hash));
                    new.push((hash, Some(at)));
                }
                Item::Partial { block, mask, at } => {
                    let old = manifest.lookup(block)?;
                    match old {
                        Some(h) => {
                            self.chunks.read(&h, &mut self.base[..])?;
                            self.work.background_reads += 1;
                            self.work.background_read_bytes += BLOCK as u64;
                        }
                        None => self.base.fill(0),
                    }
                    self.work.bytes_initialized += BLOCK as u64;
                    let fresh = &sb.extra.as_slice()[at..at + BLOCK];
                    let sector = SECTOR_BYTES as usize;
                    for i in 0..8 {
                        if mask & (1 << i) != 0 {
                            self.base[i * sector..(i + 1) * sector]
                                .copy_from_slice(&fresh[i * sector..(i + 1) * sector]);
                        }
                    }
                    if is_zero_block(&self.base[..]) {
                        if old.is_some() {
                            edit.set(block, None);
                        }
                        self.work.blocks_holes += 1;
                        continue;
                    }
                    let th = Instant::now();
                    let hash = hash_block(&self.base[..]);
                    self.work.hash_ns += th.elapsed().as_nanos() as u64;
                    self.merged.extend(&self.base[..], &mut self.lease, &mut self.work.bytes_initialized)?;
                    edit.set(block, Some(hash));
                    new.push((hash, None));
                    self.work.blocks_mapped += 1;
                }
            }
        }
        if !new.is_empty() {
            let mut merged_at = 0;
            let list: Vec<(ChunkHash, &[u8])> = new
                .iter()
                .map(|&(hash, at)| match at {
                    Some(at) => (hash, sb.bytes(at)),
                    None => {
                        merged_at += BLOCK;
                        (hash, &self.merged.as_slice()[merged_at - BLOCK..merged_at])
                    }
                })
                .collect();
            let pin = self.pin.as_ref().expect("pinned above");
            let st = self.chunks.insert_missing(pin, &list)?;
            self.work.chunks_new += st.new_chunks;
            self.work.chunks_dup += st.dup_chunks;
            self.work.chunk_bytes_written += st.bytes_written;
        }
        self.work.insert_ns += t.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// Ends a batch: sync chunks, commit the edit covering `covered`,
    /// release the pin, move the cursor, reclaim the covered log.
    pub fn end(&mut self, covered: u64, next: Cursor, batch_work: &CompactStats) -> Result<Flow> {
        let t = Instant::now();
        self.work.add(batch_work);
        let covered = covered.max(self.covered);
        if self.stop_at == StopAt::AfterInsert {
            return Ok(Flow::Stopped);
        }
        let before = self.chunks.stats().syncs;
        self.chunks.sync()?;
        self.work.syncs += self.chunks.stats().syncs.saturating_sub(before);
        if self.stop_at == StopAt::AfterChunkSync {
            return Ok(Flow::Stopped);
        }
        let edit = self.edit.take().unwrap_or_else(|| self.state.manifest.begin());
        if !edit.is_empty() || covered > self.state.manifest.covered() {
            let cs = edit.commit(covered)?;
            self.work.manifest_pages_written += cs.pages_written;
            self.work.manifest_leaf_pages_touched += cs.leaf_pages_touched;
            self.work.bytes_initialized += cs.bytes_initialized;
            self.work.syncs += cs.syncs;
        }
        drop(self.pin.take());
        self.covered = covered;
        *super::lock(&self.state.cursor) = Some(next);
        self.work.batches += 1;
        if self.stop_at == StopAt::AfterCommit {
            return Ok(Flow::Stopped);
        }
        let (freed, deleted) = self.image.reclaim_counted(covered)?;
        self.work.log_bytes_reclaimed += freed;
        self.work.segments_reclaimed += deleted;
        self.work.syncs += u64::from(deleted > 0);
        self.work.commit_ns += t.elapsed().as_nanos() as u64;
        Ok(Flow::Continue)
    }
}

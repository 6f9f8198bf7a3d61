//! The inserting side of a pass: stores chunks and builds each batch's
//! manifest edit; at each batch end it hands the edit (with its chunk pin)
//! to the commit stage (commit.rs).
//!
//! ```text
//!  per sub-batch:  Partial -> base (manifest chunk or hole) + new sectors -> hash
//!                  Holes   -> set None where the manifest maps something
//!                  Chunk   -> set the chunk's ref, once inserted
//!                  Whole   -> hash, then as Chunk (blocks.rs: who hashes)
//!                  insert_located(pin, new chunks)          one writer lock hold
//!                  -> the edits, in item order, with each chunk's location
//!  per batch end:  CommitJob { edit, pins, covered, next } -> commit stage
//!                  (with `PerCommit::reads` 2: every second batch end,
//!                  the two batches' jobs as one)
//! ```
//!
//! The pipeline reads in batches of half the commit size, so the two
//! batch buffers it circulates hold half as much, and the inserter holds
//! the first batch's job until the second ends: one chunk sync and one
//! manifest commit per `compaction_batch_bytes`, as before. A held job is
//! handed on alone as soon as a sub-batch must look at the manifest (the
//! lookups see the held blocks only once they are committed), and when
//! the pass ends.
//!
//! The pin is taken before the batch's first insert and travels with the
//! edit until its commit returned, so a concurrent GC never sweeps a chunk
//! the commit references. Partial blocks and holes depend on the manifest
//! as it is before their batch, so before it looks at the manifest for one,
//! the inserter waits for the commits still in flight (with a separate
//! commit thread the inserter may otherwise run one batch ahead).

use super::blocks::{At, Item, SubBatch};
use super::budget::{GrowBuf, Lease};
use super::commit::{CommitJob, CommitStage, Flow};
use super::reader::Cursor;
use super::stats::CompactStats;
use super::ImageCompaction;
use crate::chunk::{is_zero_block, ChunkHash, ChunkPin, ChunkRef, ChunkStore};
use crate::error::Result;
use crate::manifest::{ManifestEdit, LEAF_ENTRIES};
use crate::units::{BLOCK_BYTES, SECTORS_PER_BLOCK, SECTOR_BYTES};
use std::time::Instant;

const BLOCK: usize = BLOCK_BYTES as usize;

/// How many read batches, and log record bytes, one commit job takes at
/// most (`reads` 1: a job per batch).
#[derive(Clone, Copy, Debug)]
pub struct PerCommit {
    pub reads: u64,
    pub bytes: u64,
}

/// The inserting side of one pass.
pub struct Inserter<'s> {
    state: &'s ImageCompaction,
    chunks: &'s ChunkStore,
    upload_room: Option<&'s (dyn Fn() -> Result<()> + Send + Sync)>,
    pin: Option<ChunkPin<'s>>,
    edit: Option<ManifestEdit<'s>>,
    /// Merged blocks of the current sub-batch.
    merged: GrowBuf,
    lease: Lease<'s>,
    base: Box<[u8; BLOCK]>,
    lookups: Vec<Option<ChunkRef>>,
    /// The sub-batch's edits in item order: a hole, or the n-th new chunk.
    sets: Vec<(u64, Option<usize>)>,
    refs: Vec<ChunkRef>,
    stage: CommitStage<'s>,
    pub work: CompactStats,
    /// The covered seq of the last batch ended.
    covered: u64,
    per_commit: PerCommit,
    /// Batches ended but not yet handed on, as one job (its `batches`
    /// says how many), and the log record bytes they read.
    held: Option<CommitJob<'s>>,
    held_bytes: u64,
}

impl<'s> Inserter<'s> {
    pub fn new(
        state: &'s ImageCompaction,
        chunks: &'s ChunkStore,
        upload_room: Option<&'s (dyn Fn() -> Result<()> + Send + Sync)>,
        lease: Lease<'s>,
        stage: CommitStage<'s>,
        per_commit: PerCommit,
    ) -> Inserter<'s> {
        Inserter {
            state,
            chunks,
            upload_room,
            pin: None,
            edit: None,
            merged: GrowBuf::new(),
            lease,
            base: Box::new([0u8; BLOCK]),
            lookups: Vec::new(),
            sets: Vec::new(),
            refs: Vec::new(),
            stage,
            work: CompactStats { bytes_initialized: BLOCK as u64, ..CompactStats::default() },
            covered: state.manifest.covered(),
            per_commit,
            held: None,
            held_bytes: 0,
        }
    }

    /// Applies one sub-batch: edits, merges and chunk inserts.
    pub fn blocks(&mut self, sb: &SubBatch<'_>) -> Result<Flow> {
        let needs_manifest = sb.items.iter().any(|i| !matches!(i, Item::Chunk { .. } | Item::Whole { .. }));
        if needs_manifest && (self.hand_on_held()? == Flow::Stopped || self.stage.settle()? == Flow::Stopped)
        {
            return Ok(Flow::Stopped);
        }
        let t = Instant::now();
        let hash_before = self.work.hash_ns;
        let state: &'s ImageCompaction = self.state;
        let manifest = &*state.manifest;
        if self.pin.is_none() {
            // With a remote, bytes not yet uploaded are bounded: wait here,
            // before the pin (a pin held while waiting would stall GC).
            if let Some(wait) = self.upload_room {
                wait()?;
            }
            self.pin = Some(self.chunks.pin());
        }
        self.merged.clear();
        self.sets.clear();
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
                                self.sets.push((block + i as u64, None));
                            }
                        }
                        done += n;
                    }
                }
                Item::Chunk { block, hash, at } => {
                    self.sets.push((block, Some(new.len())));
                    new.push((hash, Some(at)));
                }
                Item::Whole { block, at } => {
                    let th = Instant::now();
                    let hash = ChunkHash::of(sb.bytes(at));
                    self.work.hash_ns += th.elapsed().as_nanos() as u64;
                    self.sets.push((block, Some(new.len())));
                    new.push((hash, Some(at)));
                }
                Item::Partial { block, mask, at } => {
                    let old = manifest.lookup(block)?;
                    match old {
                        Some(r) => {
                            self.chunks.read_ref(&r, &mut self.base[..])?;
                            self.work.background_reads += 1;
                            self.work.background_read_bytes += BLOCK as u64;
                        }
                        None => self.base.fill(0),
                    }
                    self.work.bytes_initialized += BLOCK as u64;
                    let fresh = &sb.extra.as_slice()[at..at + BLOCK];
                    let sector = SECTOR_BYTES as usize;
                    for i in 0..SECTORS_PER_BLOCK as usize {
                        if mask & (1 << i) != 0 {
                            self.base[i * sector..(i + 1) * sector]
                                .copy_from_slice(&fresh[i * sector..(i + 1) * sector]);
                        }
                    }
                    if is_zero_block(&self.base[..]) {
                        if old.is_some() {
                            self.sets.push((block, None));
                        }
                        self.work.blocks_holes += 1;
                        continue;
                    }
                    let th = Instant::now();
                    let hash = ChunkHash::of(&self.base[..]);
                    self.work.hash_ns += th.elapsed().as_nanos() as u64;
                    self.merged.extend(&self.base[..], &mut self.lease, &mut self.work.bytes_initialized)?;
                    self.sets.push((block, Some(new.len())));
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
            let st = self.chunks.insert_located(pin, &list, &mut self.refs)?;
            self.work.chunks_new += st.new_chunks;
            self.work.chunks_dup += st.dup_chunks;
            self.work.chunk_bytes_written += st.bytes_written;
        }
        let edit = self.edit.get_or_insert_with(|| manifest.begin());
        for &(block, new) in &self.sets {
            edit.set(block, new.map(|n| self.refs[n]));
        }
        // Hashing here counts in hash_ns only.
        let hashed = self.work.hash_ns - hash_before;
        self.work.insert_ns += (t.elapsed().as_nanos() as u64).saturating_sub(hashed);
        Ok(Flow::Continue)
    }

    /// Ends a batch of `record_bytes` log bytes: hands its edit and pins
    /// to the commit stage, with those of a batch held before it, or holds
    /// them for the next batch to join (see the module docs).
    pub fn end(
        &mut self,
        covered: u64,
        next: Cursor,
        record_bytes: u64,
        batch_work: &CompactStats,
    ) -> Result<Flow> {
        self.work.add(batch_work);
        let covered = covered.max(self.covered);
        self.covered = covered;
        let edit = self.edit.take().unwrap_or_else(|| self.state.manifest.begin());
        let mut job =
            CommitJob { edit, pins: self.pin.take().into_iter().collect(), covered, next, batches: 1 };
        if let Some(mut held) = self.held.take() {
            held.absorb(job);
            job = held;
        }
        self.held_bytes += record_bytes;
        let room = job.batches < self.per_commit.reads && self.held_bytes < self.per_commit.bytes;
        self.held = Some(job);
        if room {
            return Ok(Flow::Continue);
        }
        self.hand_on_held()
    }

    /// Hands the held job on to the commit stage.
    fn hand_on_held(&mut self) -> Result<Flow> {
        let Some(job) = self.held.take() else { return Ok(Flow::Continue) };
        self.held_bytes = 0;
        self.stage.submit(job)
    }

    /// Hands on what is held, then waits for every commit handed on.
    pub fn finish(&mut self) -> Result<Flow> {
        if self.hand_on_held()? == Flow::Stopped {
            return Ok(Flow::Stopped);
        }
        self.stage.settle()
    }

    /// Ends the commit stage and adds its counters (after `finish`); with
    /// how its last step went (an inline stage's due log reclamation).
    pub fn into_work(mut self) -> (CompactStats, Result<()>) {
        let mut work = self.work;
        let (stage, closed) = self.stage.close();
        work.add(&stage);
        (work, closed)
    }
}

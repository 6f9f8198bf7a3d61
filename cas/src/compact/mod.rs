//! Compaction: moves the durable prefix of an image's log into shared
//! chunks and the image's manifest, then reclaims the covered log.
//!
//! ```text
//!                 durable_seq                     next_seq
//!  log:  [covered | durable, not yet compacted | visible, not durable]
//!        ^ manifest.covered                     never read by compaction
//!
//!  pass = batches, each:
//!   reader thread   read records from the cursor (checksummed), index them
//!                   per sector (reader.rs), walk blocks, hash (blocks.rs)
//!   pass thread     merge partial blocks, insert_missing under a chunk pin,
//!                   hand the edit and the pin on, every second batch with
//!                   a reader thread (inserter.rs)
//!   commit thread   chunks.sync -> manifest commit(covered) -> unpin
//!                   -> cursor := next -> reclaim_log(covered) (commit.rs)
//!  threads and channels: pipeline.rs; memory: budget.rs; when: service.rs
//! ```
//!
//! Rules (docs/design.md, "Compaction and reclamation"):
//! - Only durable records are compacted: a batch never reads past the
//!   image's durable seq, so the manifest never covers a write a crash can
//!   still lose. Under log pressure with no FLUSH coming, the service makes
//!   the completed log durable itself first (service.rs).
//! - `covered` is the seq of the last record a committed batch applied
//!   whole; recovery replays only records above it.
//! - Log is reclaimed only after the manifest commit covering it returned,
//!   and a segment file is deleted only when no read or scan pins it.
//! - The cursor (segment, offset, seq) is a hint: it is used only if the
//!   record found there carries the expected seq, else the pass falls back
//!   to a scan from the segment holding `covered + 1`.
//!
//! `Store::compact_once` runs one pass on the caller's thread (plus the
//! reader and commit threads); the service runs passes in the background.

mod blocks;
mod budget;
mod commit;
mod inserter;
mod pipeline;
mod reader;
pub(crate) mod service;
mod stats;

pub use budget::Budget;
pub use reader::Cursor;
pub use stats::{CompactReport, CompactStats};

use crate::chunk::ChunkStore;
use crate::error::{Error, Result};
use crate::image::Image;
use crate::manifest::Manifest;
use crate::units::SECTOR_BYTES;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) use crate::sync::lock;

/// Read batches per commit when a reader thread runs ahead (inserter.rs).
const READS_PER_COMMIT: u64 = 2;

/// Tunables of compaction (from `StoreOptions`).
#[derive(Clone, Debug)]
pub struct CompactConfig {
    /// Threads one pass uses: 1 (read, hash, insert, commit in turn), 2
    /// (the reader/hasher and the inserter/committer in a pipeline), 3 (and
    /// the commit protocol's I/O on a thread of its own).
    pub threads: usize,
    /// Log record bytes per manifest commit: one batch, or two of half
    /// the size read by a reader thread (inserter.rs).
    pub batch_bytes: u64,
    /// Blocks a batch may touch (bounds its manifest edit).
    pub batch_blocks: u64,
    /// The service compacts at once when the log uses this percentage of
    /// its quota (making the log durable itself if needed) ...
    pub trigger_percent: u64,
    /// ... and otherwise this long after the last pass when durable data
    /// waits and the image has not been written for as long (or the data
    /// has waited [`QUIET_WAIT_MAX_INTERVALS`] intervals).
    pub interval: Duration,
    /// Batches one background pass runs before the service moves on to
    /// another image.
    pub service_batches: u64,
}

/// Below the trigger, a pass waits for a pause in the image's writes at
/// most this many intervals: a write burst that fits the log is not slowed
/// by compaction competing for the CPU (hashing is most of a pass), and
/// a stream of writes that never pauses is still compacted.
pub const QUIET_WAIT_MAX_INTERVALS: u32 = 10;

/// Where a pass stops early, for crash tests: after the first batch's
/// chunk inserts, its chunk sync, or its manifest commit (before the log
/// is reclaimed). The pass then returns as if done; the test crashes the
/// storage.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StopAt {
    #[default]
    Never,
    AfterInsert,
    AfterChunkSync,
    AfterCommit,
}

/// How one pass runs.
#[derive(Clone, Copy, Debug)]
pub struct PassControl {
    /// Make every completed record durable first (the service under log
    /// pressure; a test of the non-FLUSHing path).
    pub force_durable: bool,
    pub max_batches: u64,
    pub stop_at: StopAt,
}

impl Default for PassControl {
    fn default() -> Self {
        PassControl { force_durable: false, max_batches: u64::MAX, stop_at: StopAt::Never }
    }
}

/// The compactor's state for one open image; the store keeps it beside
/// the image (`Store::compaction`) and hands it to every pass.
pub struct ImageCompaction {
    pub(crate) manifest: Arc<Manifest>,
    /// Held for a whole pass: one pass per image at a time.
    running: Mutex<()>,
    /// Where the next pass resumes (a hint, validated before use).
    pub(crate) cursor: Mutex<Option<Cursor>>,
    stats: Mutex<CompactStats>,
    pub(crate) last_pass: Mutex<Option<Instant>>,
    /// The image's newest completed seq when the service last saw it
    /// change, and when: the image is quiet once it has not changed for an
    /// interval.
    pub(crate) last_write: Mutex<Option<(u64, Instant)>>,
    /// Since when durable data has waited for a pass (None: nothing waits).
    pub(crate) waiting_since: Mutex<Option<Instant>>,
    /// After an error, the service leaves the image alone until then.
    pub(crate) retry_after: Mutex<Option<Instant>>,
    /// Passes that failed in a row (memory-budget refusals aside).
    pub(crate) failures_in_a_row: Mutex<u32>,
}

impl ImageCompaction {
    /// State for an image whose first record above the manifest's covered
    /// seq is at `start` (from recovery).
    pub fn new(manifest: Arc<Manifest>, start: (u64, u64, u64)) -> ImageCompaction {
        let (segment, position, seq) = start;
        ImageCompaction {
            manifest,
            running: Mutex::new(()),
            cursor: Mutex::new(Some(Cursor { segment, position, seq, skip_sectors: 0 })),
            stats: Mutex::new(CompactStats::default()),
            last_pass: Mutex::new(None),
            last_write: Mutex::new(None),
            waiting_since: Mutex::new(None),
            retry_after: Mutex::new(None),
            failures_in_a_row: Mutex::new(0),
        }
    }

    pub fn manifest(&self) -> &Arc<Manifest> {
        &self.manifest
    }

    /// Cumulative work counters.
    pub fn stats(&self) -> CompactStats {
        lock(&self.stats).clone()
    }

    pub(crate) fn add_stats(&self, work: &CompactStats) {
        lock(&self.stats).add(work);
    }

    /// Forgets the cursor (tests of the scan fallback).
    pub fn forget_cursor(&self) {
        *lock(&self.cursor) = None;
    }
}

/// The store-wide side of compaction: the shared chunk store, the memory
/// budget and the configuration.
/// Waits until the chunk store's tier has room for more chunks not yet
/// uploaded (the store hands it down: `bucket`'s pack tier).
pub type UploadRoom = Arc<dyn Fn() -> Result<()> + Send + Sync>;

pub struct Compactor {
    pub chunks: Arc<ChunkStore>,
    /// With a tier: called before each batch stores chunks, outside its
    /// pin (bytes not yet uploaded are bounded).
    pub upload_room: Option<UploadRoom>,
    pub budget: Budget,
    pub cfg: CompactConfig,
    /// The clock a pass's time is taken from (the store's task runner's).
    pub tasks: crate::tasks::Tasks,
    /// Every commit's `refs_dropped`, summed over the store's life as the
    /// commits land (shared with automatic GC, cas::gc::auto).
    pub refs_dropped: Arc<AtomicU64>,
}

impl Compactor {
    /// Runs one pass over `image`, whose compaction state is `state`:
    /// drains its durable log (up to the durable seq at the start, in
    /// batches) into the manifest.
    pub fn run_pass(
        &self,
        image: &Image,
        state: &ImageCompaction,
        ctl: &PassControl,
    ) -> Result<CompactReport> {
        let _one = lock(&state.running);
        let covered = state.manifest.covered();
        let mut report =
            CompactReport { covered_before: covered, covered_after: covered, ..Default::default() };
        report.work.passes = 1;
        let result = self.pass(image, state, ctl, &mut report);
        report.covered_after = state.manifest.covered();
        *lock(&state.last_pass) = Some(self.tasks.now());
        if let Err(e) = &result {
            report.work.errors += 1;
            report.work.budget_waits += u64::from(matches!(e, Error::MemoryBudget(_)));
        }
        state.add_stats(&report.work);
        result.map(|()| report)
    }

    fn pass(
        &self,
        image: &Image,
        state: &ImageCompaction,
        ctl: &PassControl,
        report: &mut CompactReport,
    ) -> Result<()> {
        image.check_usable()?;
        let covered = report.covered_before;
        // Finish what an earlier pass left: a stop after its commit, or
        // segments whose pins outlived its reclamation.
        let (freed, deleted) = image.reclaim_counted(covered)?;
        report.work.log_bytes_reclaimed += freed;
        report.work.segments_reclaimed += deleted;
        report.work.syncs += u64::from(deleted > 0);
        if ctl.force_durable && image.has_undurable_records() {
            let before = image.stats().syncs;
            image.make_completed_durable()?;
            report.work.forced_log_syncs += 1;
            report.work.syncs += image.stats().syncs.saturating_sub(before);
        }
        let durable = image.durable_seq();
        report.durable_seq = durable;
        if durable <= covered {
            return Ok(());
        }
        let hint = lock(&state.cursor).filter(|c| c.seq == covered + 1);
        let (start, hinted) = match hint {
            Some(c) => (c, true),
            None => {
                report.work.cursor_fallbacks += 1;
                (reader::fallback_cursor(image.log(), covered)?, false)
            }
        };
        // With a reader thread, the two batch buffers it circulates are
        // read half as large and two batches make one commit (inserter.rs),
        // except where a test stops at a step of one batch, or where the
        // wait for upload room would come with a pin held.
        let reads = if self.cfg.threads >= 2 && ctl.stop_at == StopAt::Never && self.upload_room.is_none() {
            READS_PER_COMMIT
        } else {
            1
        };
        let plan = pipeline::Plan {
            start,
            apply_from: covered + 1,
            hinted,
            covered,
            limits: reader::Limits {
                durable_seq: durable,
                batch_bytes: (self.cfg.batch_bytes / reads).max(1),
                batch_blocks: self.cfg.batch_blocks,
                // Read after `durable`: a record past an older end is
                // accepted only once the image grew, so every record up
                // to `durable` lies inside this size.
                image_sectors: image.size_bytes() / SECTOR_BYTES,
            },
            per_commit: inserter::PerCommit { reads, bytes: self.cfg.batch_bytes },
            max_batches: ctl.max_batches.saturating_mul(reads),
        };
        let ctx = pipeline::Ctx {
            image,
            state,
            chunks: &self.chunks,
            upload_room: self.upload_room.as_deref(),
            budget: &self.budget,
            stop_at: ctl.stop_at,
            threads: self.cfg.threads,
            refs_dropped: &self.refs_dropped,
        };
        let (work, result) = pipeline::run(&ctx, &plan);
        report.work.add(&work);
        result?;
        Ok(())
    }
}

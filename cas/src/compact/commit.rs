//! The commit stage of a pass: the protocol that makes a batch count.
//!
//! ```text
//!  CommitJob { edit, pins, covered, next }
//!   1. chunks.sync()                 every chunk the edit names is durable
//!   2. edit.commit(covered)          manifest pages, then root, synced
//!   3. drop the pins                 GC may sweep again
//!   4. cursor := next                the validated hint for the next batch
//!   5. image.reclaim_log(covered)    overlay extents, segment files, quota
//!                                    (no further than the image's reclaim
//!                                    gate: what its bucket holds, cas::bucket::manifests)
//! ```
//!
//! Jobs are committed strictly in order. The stage runs inline on the
//! inserting thread, or on a thread of its own (`compaction_threads` 3):
//! then the inserter goes on with the next batch while this one's syncs
//! and commit run; at most `JOBS_QUEUED_MAX` jobs wait. The thread takes
//! every job waiting when it starts a commit as one group: their edits
//! appended in order (`ManifestEdit::append`), one chunk sync, one
//! manifest commit covering the last; so a device slower than the
//! inserter costs fewer syncs instead of a longer queue.
//!
//! Step 5 of one commit runs beside step 1 of the next, on a second
//! thread (or when the pass ends): the unlinks cost CPU, the chunk sync
//! waits for the device.
//!
//! A crash between any two steps is safe: before 2 the manifest is the old
//! one and the log holds everything; between 2 and 5 the manifest covers
//! records the log still holds (recovery skips them and deletes wholly
//! covered segments); a reclaim cut short or not yet run leaves covered
//! segments that the next reclaim or recovery deletes. A group is one
//! commit: a crash leaves all of its jobs or none.

use super::reader::Cursor;
use super::stats::CompactStats;
use super::{ImageCompaction, StopAt};
use crate::chunk::{ChunkPin, ChunkStore};
use crate::error::{Error, Result};
use crate::image::Image;
use crate::manifest::ManifestEdit;
use crossbeam::channel::{Receiver, Sender};
use smallvec::SmallVec;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Whether the pass goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// A test asked the pass to stop at a step (see [`StopAt`]).
    Stopped,
}

/// One batch, ready to commit.
pub struct CommitJob<'s> {
    pub edit: ManifestEdit<'s>,
    /// The pins its chunks were inserted under (none: it inserted
    /// nothing; more than one: batches joined into one job).
    pub pins: SmallVec<[ChunkPin<'s>; 2]>,
    pub covered: u64,
    pub next: Cursor,
    /// Batches it holds (more than 1: joined, see `absorb`); counted
    /// only once their commit returned.
    pub batches: u64,
}

/// Jobs one commit of the commit thread takes at most: the one it waited
/// for and those queued behind it (`JOBS_QUEUED_MAX`).
pub const GROUP_JOBS_MAX: usize = 1 + JOBS_QUEUED_MAX;

/// Jobs that wait for the commit thread, at most.
pub const JOBS_QUEUED_MAX: usize = 2;

impl<'s> CommitJob<'s> {
    /// Takes `later`'s edits, pins and position into this job (see
    /// `ManifestEdit::append`).
    pub fn absorb(&mut self, later: CommitJob<'s>) {
        self.edit.append(later.edit);
        self.pins.extend(later.pins);
        self.covered = self.covered.max(later.covered);
        self.next = later.next;
        self.batches += later.batches;
    }
}

/// Runs the commit protocol (see the module docs).
pub struct Committer<'s> {
    image: &'s Image,
    state: &'s ImageCompaction,
    chunks: &'s ChunkStore,
    stop_at: StopAt,
    /// The store's dropped-mapping count (cas::gc::auto), added to as
    /// each commit lands: a GC pass that begins after it sees it.
    refs_dropped: &'s AtomicU64,
    /// The covered seq of the last commit, whose log reclamation (step 5)
    /// has not run yet: it runs beside the next job's chunk sync, or in
    /// [`Committer::finish`].
    reclaim_due: Option<u64>,
    pub work: CompactStats,
}

impl<'s> Committer<'s> {
    pub fn new(
        image: &'s Image,
        state: &'s ImageCompaction,
        chunks: &'s ChunkStore,
        stop_at: StopAt,
        refs_dropped: &'s AtomicU64,
    ) -> Committer<'s> {
        Committer {
            image,
            state,
            chunks,
            stop_at,
            refs_dropped,
            reclaim_due: None,
            work: CompactStats::default(),
        }
    }

    pub fn commit(&mut self, job: CommitJob<'s>) -> Result<Flow> {
        let t = Instant::now();
        let CommitJob { edit, pins, covered, next, batches } = job;
        if self.stop_at == StopAt::AfterInsert {
            return Ok(Flow::Stopped);
        }
        let result = self.sync_chunks();
        self.work.commit_ns += t.elapsed().as_nanos() as u64;
        result?;
        if self.stop_at == StopAt::AfterChunkSync {
            return Ok(Flow::Stopped);
        }
        let t = Instant::now();
        if !edit.is_empty() || covered > self.state.manifest.covered() {
            let cs = edit.commit(covered)?;
            self.work.manifest_pages_written += cs.pages_written;
            self.work.manifest_leaf_pages_touched += cs.leaf_pages_touched;
            self.work.refs_dropped += cs.refs_dropped;
            self.refs_dropped.fetch_add(cs.refs_dropped, Ordering::Relaxed);
            self.work.bytes_initialized += cs.bytes_initialized;
            self.work.syncs += cs.syncs;
        }
        drop(pins);
        *super::lock(&self.state.cursor) = Some(next);
        self.work.batches += batches;
        self.work.grouped_batches += batches - 1;
        self.work.commit_ns += t.elapsed().as_nanos() as u64;
        if self.stop_at == StopAt::AfterCommit {
            return Ok(Flow::Stopped);
        }
        self.reclaim_due = Some(covered);
        Ok(Flow::Continue)
    }

    /// Step 1, with the previous job's step 5 beside it on a second
    /// thread: unlinking covered segments costs CPU (the kernel drops
    /// their cached pages, about 2 ms per 8 MiB segment), the chunk sync
    /// mostly waits for the device.
    fn sync_chunks(&mut self) -> Result<()> {
        let before = self.chunks.stats().syncs;
        let synced = match self.reclaim_due.take() {
            None => self.chunks.sync(),
            Some(covered) => {
                let chunks = self.chunks;
                std::thread::scope(|s| {
                    let sync = std::thread::Builder::new()
                        .name("cas-compact-sync".into())
                        .spawn_scoped(s, move || chunks.sync())
                        .map_err(|e| Error::Unavailable("compaction chunk sync".into(), e.to_string()))?;
                    let reclaimed = self.reclaim(covered);
                    // A panic in the chunk store is not a failed sync: its
                    // pending journal ops may be gone, so it must not be retried.
                    let synced = sync.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                    synced.and(reclaimed)
                })
            }
        };
        self.work.syncs += self.chunks.stats().syncs.saturating_sub(before);
        synced
    }

    /// Step 5 for `covered`.
    fn reclaim(&mut self, covered: u64) -> Result<()> {
        let (freed, deleted) = self.image.reclaim_counted(covered)?;
        self.work.log_bytes_reclaimed += freed;
        self.work.segments_reclaimed += deleted;
        self.work.syncs += u64::from(deleted > 0);
        Ok(())
    }

    /// Runs the reclamation still due (the end of a pass, whichever way
    /// it ended: what was committed may always be reclaimed).
    pub fn finish(&mut self) -> Result<()> {
        let t = Instant::now();
        let result = self.reclaim_due.take().map_or(Ok(()), |covered| self.reclaim(covered));
        self.work.commit_ns += t.elapsed().as_nanos() as u64;
        result
    }
}

/// Where the inserter hands its jobs.
pub enum CommitStage<'s> {
    Inline {
        committer: Box<Committer<'s>>,
        stopped: bool,
    },
    /// A commit thread fed through `tx`, answering each job on `done`.
    Thread {
        tx: Option<Sender<CommitJob<'s>>>,
        done: Receiver<Result<Flow>>,
        in_flight: usize,
        stopped: bool,
    },
}

fn gone() -> Error {
    Error::Unavailable("compaction commit stage".into(), "its thread stopped".into())
}

impl<'s> CommitStage<'s> {
    /// Commits `job` (inline) or queues it (thread; waits while two are
    /// queued). Reports a failure or stop of an earlier job first.
    pub fn submit(&mut self, job: CommitJob<'s>) -> Result<Flow> {
        match self {
            CommitStage::Inline { committer, stopped } => {
                if *stopped {
                    return Ok(Flow::Stopped);
                }
                let flow = committer.commit(job)?;
                *stopped = flow == Flow::Stopped;
                return Ok(flow);
            }
            CommitStage::Thread { tx, done, in_flight, stopped } => {
                while let Ok(r) = done.try_recv() {
                    *in_flight -= 1;
                    if r? == Flow::Stopped {
                        *stopped = true;
                    }
                }
                if *stopped {
                    return Ok(Flow::Stopped);
                }
                if tx.as_ref().ok_or_else(gone)?.send(job).is_ok() {
                    *in_flight += 1;
                    return Ok(Flow::Continue);
                }
            }
        }
        // The thread ended after an error or a stop it reported on `done`.
        match self.settle()? {
            Flow::Stopped => Ok(Flow::Stopped),
            Flow::Continue => Err(gone()),
        }
    }

    /// Waits until every job handed on is committed.
    pub fn settle(&mut self) -> Result<Flow> {
        match self {
            CommitStage::Inline { stopped, .. } => Ok(if *stopped { Flow::Stopped } else { Flow::Continue }),
            CommitStage::Thread { done, in_flight, stopped, .. } => {
                while *in_flight > 0 {
                    let Ok(r) = done.recv() else {
                        // The thread ended after the error or stop it reported;
                        // the jobs queued behind it were dropped uncommitted.
                        *in_flight = 0;
                        return if *stopped { Ok(Flow::Stopped) } else { Err(gone()) };
                    };
                    *in_flight -= 1;
                    if r? == Flow::Stopped {
                        *stopped = true;
                    }
                }
                Ok(if *stopped { Flow::Stopped } else { Flow::Continue })
            }
        }
    }

    /// Ends the stage: the inline committer runs its due reclamation and
    /// returns its counters (a commit thread does both when its channel
    /// closes, and returns them when joined).
    pub fn close(&mut self) -> (CompactStats, Result<()>) {
        match self {
            CommitStage::Inline { committer, .. } => {
                let finished = committer.finish();
                (std::mem::take(&mut committer.work), finished)
            }
            CommitStage::Thread { tx, .. } => {
                tx.take();
                (CompactStats::default(), Ok(()))
            }
        }
    }
}

/// The body of a commit thread: commits jobs in order until the channel
/// closes, an error, or a stop; the due reclamation runs whenever no job
/// is queued (else beside the next job's chunk sync) and at the end.
/// Returns its counters and how the reclamation went.
pub fn run_thread<'s>(
    mut committer: Committer<'s>,
    jobs: &Receiver<CommitJob<'s>>,
    done: &Sender<Result<Flow>>,
) -> (CompactStats, Result<()>) {
    loop {
        if jobs.is_empty() {
            // Nothing queued: reclaim now, not beside the next chunk sync,
            // so writers held for log capacity get it back while the next
            // batch is still read and hashed.
            if let Err(e) = committer.finish() {
                return (committer.work, Err(e));
            }
        }
        let Ok(mut job) = jobs.recv() else { break };
        // Jobs that queued while the last group committed join this one:
        // one chunk sync and one manifest commit for all of them.
        let mut grouped = 1;
        // A test's stop point names one batch: no grouping then.
        let group_max = if committer.stop_at == StopAt::Never { GROUP_JOBS_MAX } else { 1 };
        while grouped < group_max {
            let Ok(later) = jobs.try_recv() else { break };
            job.absorb(later);
            grouped += 1;
        }
        let r = committer.commit(job);
        match r {
            Ok(Flow::Continue) => {
                for _ in 0..grouped {
                    let _ = done.send(Ok(Flow::Continue));
                }
            }
            other => {
                // The jobs grouped behind a failed or stopped commit were not
                // committed: the stage sees the thread end with them in flight.
                let _ = done.send(other);
                break;
            }
        }
    }
    let finished = committer.finish();
    (committer.work, finished)
}

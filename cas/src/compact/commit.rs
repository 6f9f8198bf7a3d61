//! The commit stage of a pass: the protocol that makes a batch count.
//!
//! ```text
//!  CommitJob { edit, pin, covered, next }
//!   1. chunks.sync()                 every chunk the edit names is durable
//!   2. edit.commit(covered)          manifest pages, then root, synced
//!   3. drop the pin                  GC may sweep again
//!   4. cursor := next                the validated hint for the next batch
//!   5. image.reclaim_log(covered)    overlay extents, segment files, quota
//!                                    (no further than the image's reclaim
//!                                    gate: what its bucket holds, cas::publish)
//! ```
//!
//! Jobs are committed strictly in order. The stage runs inline on the
//! inserting thread, or on a thread of its own (`compaction_threads` 3):
//! then the inserter goes on with the next batch while this one's syncs,
//! commit and segment deletions run, at most two jobs behind.
//!
//! A crash between any two steps is safe: before 2 the manifest is the old
//! one and the log holds everything; between 2 and 5 the manifest covers
//! records the log still holds (recovery skips them and deletes wholly
//! covered segments); a reclaim cut short leaves covered segments that the
//! next reclaim or recovery deletes.

use super::reader::Cursor;
use super::stats::CompactStats;
use super::{ImageCompaction, StopAt};
use crate::chunk::{ChunkPin, ChunkStore};
use crate::error::{Error, Result};
use crate::image::Image;
use crate::manifest::ManifestEdit;
use crossbeam::channel::{Receiver, Sender};
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
    /// The pin its chunks were inserted under (None: it inserted nothing).
    pub pin: Option<ChunkPin<'s>>,
    pub covered: u64,
    pub next: Cursor,
}

/// Runs the commit protocol (see the module docs).
pub struct Committer<'s> {
    image: &'s Image,
    state: &'s ImageCompaction,
    chunks: &'s ChunkStore,
    stop_at: StopAt,
    pub work: CompactStats,
}

impl<'s> Committer<'s> {
    pub fn new(
        image: &'s Image,
        state: &'s ImageCompaction,
        chunks: &'s ChunkStore,
        stop_at: StopAt,
    ) -> Committer<'s> {
        Committer { image, state, chunks, stop_at, work: CompactStats::default() }
    }

    pub fn commit(&mut self, job: CommitJob<'s>) -> Result<Flow> {
        let t = Instant::now();
        let CommitJob { edit, pin, covered, next } = job;
        if self.stop_at == StopAt::AfterInsert {
            return Ok(Flow::Stopped);
        }
        let before = self.chunks.stats().syncs;
        self.chunks.sync()?;
        self.work.syncs += self.chunks.stats().syncs.saturating_sub(before);
        if self.stop_at == StopAt::AfterChunkSync {
            return Ok(Flow::Stopped);
        }
        if !edit.is_empty() || covered > self.state.manifest.covered() {
            let cs = edit.commit(covered)?;
            self.work.manifest_pages_written += cs.pages_written;
            self.work.manifest_leaf_pages_touched += cs.leaf_pages_touched;
            self.work.bytes_initialized += cs.bytes_initialized;
            self.work.syncs += cs.syncs;
        }
        drop(pin);
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

    /// Ends the stage: the inline committer's counters (a commit thread
    /// returns its own when joined).
    pub fn close(&mut self) -> CompactStats {
        match self {
            CommitStage::Inline { committer, .. } => std::mem::take(&mut committer.work),
            CommitStage::Thread { tx, .. } => {
                tx.take();
                CompactStats::default()
            }
        }
    }
}

/// The body of a commit thread: commits jobs in order until the channel
/// closes, an error, or a stop; returns its counters.
pub fn run_thread<'s>(
    mut committer: Committer<'s>,
    jobs: &Receiver<CommitJob<'s>>,
    done: &Sender<Result<Flow>>,
) -> CompactStats {
    for job in jobs {
        let r = committer.commit(job);
        let end = !matches!(r, Ok(Flow::Continue));
        let _ = done.send(r);
        if end {
            break;
        }
    }
    committer.work
}

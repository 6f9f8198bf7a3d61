//! One compaction pass: the reading thread, the inserting thread, the
//! commit stage, the channels between them, and the buffers that
//! circulate back.
//!
//! ```text
//!  reader thread (scoped)                     pass thread (caller)              commit thread (scoped)
//!   read_batch -> Walker: hash --SubBatch-->   Inserter::blocks (hash what the
//!                                              Walker left, insert_missing)
//!                              --End------->   Inserter::end --CommitJob-->      sync, commit, reclaim
//!   free batch / extra buffers <--Back-----    (buffers return for reuse)
//! ```
//!
//! `compaction_threads`: 1 runs all of it on the pass thread, 2 adds the
//! reader thread (the commit protocol runs inline on the pass thread), 3
//! adds the commit thread. A commit's log reclamation runs beside the next
//! commit's chunk sync (which goes to a short-lived thread, commit.rs) when
//! that commit follows; a commit thread with nothing queued reclaims at
//! once, and every mode reclaims what is left at the end of the pass.
//!
//! Bounds: at most `SUBS_IN_FLIGHT` sub-batches wait in the channel; two
//! batch buffers exist per pass (the reader fills one while the inserter
//! still uses the other; with the reader thread each is read to half of
//! `compaction_batch_bytes`, two batches making one commit job, see
//! inserter.rs), at most `SUBS_IN_FLIGHT + 2` extra buffers, and
//! at most `JOBS_QUEUED_MAX` (2) commit jobs wait for the commit thread,
//! which commits at most `GROUP_JOBS_MAX` (3) at once. A job holds its
//! edit (`ManifestEdit::memory_bytes`: tens of bytes per block of the
//! batch) and its pins, no batch buffer.
//!
//! The reader runs ahead by at most one batch; the inserter ahead of the
//! commits by at most `GROUP_JOBS_MAX + JOBS_QUEUED_MAX` jobs and the one
//! it holds (each job up to two batches with the reader thread). What
//! depends on the state before a batch (partial blocks, holes) waits for
//! the commits in flight (inserter.rs).

use super::blocks::{Back, Msg, Sent, SubBatch, Walker};
use super::budget::{Budget, GrowBuf, Lease};
use super::commit::{run_thread, CommitJob, CommitStage, Committer, Flow};
use super::inserter::{Inserter, PerCommit};
use super::reader::{fallback_cursor, read_batch, Batch, Cursor, Limits, Outcome};
use super::stats::CompactStats;
use super::{ImageCompaction, StopAt};
use crate::chunk::ChunkStore;
use crate::error::{Error, Result};
use crate::image::Image;
use crate::wal::Log;
use crossbeam::channel::{bounded, unbounded, Receiver, Sender};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// Sub-batches waiting in the channel, at most.
pub const SUBS_IN_FLIGHT: usize = 4;

/// Where the reader starts and how far it may go.
pub struct Plan {
    pub start: Cursor,
    /// Records below this seq are read but not applied (fallback scan).
    pub apply_from: u64,
    /// The cursor came from the validated hint (a stale one may fall back).
    pub hinted: bool,
    pub covered: u64,
    pub limits: Limits,
    /// Read batches per commit job (inserter.rs).
    pub per_commit: PerCommit,
    pub max_batches: u64,
}

/// What a pass works on.
pub struct Ctx<'s> {
    pub image: &'s Image,
    pub state: &'s ImageCompaction,
    pub chunks: &'s ChunkStore,
    /// See `Compactor::upload_room`.
    pub upload_room: Option<&'s (dyn Fn() -> Result<()> + Send + Sync)>,
    pub budget: &'s Budget,
    pub stop_at: StopAt,
    pub threads: usize,
    /// The store's dropped-mapping count (`Compactor::refs_dropped`).
    pub refs_dropped: &'s AtomicU64,
}

/// Where the reader's sub-batches and batch ends go, and where it gets
/// buffers from.
trait Sink<'b> {
    fn send(&mut self, msg: Msg<'b>) -> Result<()>;
    fn batch(&mut self) -> Result<Batch<'b>>;
    fn extra(&mut self) -> GrowBuf;
    /// The inserting side has at most `queued` sub-batches waiting (it
    /// will soon wait for the reader): the reader leaves hashing to it
    /// (blocks.rs).
    fn inserter_idle(&self, queued: usize) -> bool;
}

/// The channel to the inserting thread.
struct ChannelSink<'b> {
    tx: Sender<Msg<'b>>,
    back: Receiver<Back<'b>>,
    budget: &'b Budget,
    batches_made: usize,
    batches: Vec<Batch<'b>>,
    extras: Vec<GrowBuf>,
}

fn closed() -> Error {
    Error::Unavailable("compaction pass".into(), "the inserting side stopped".into())
}

impl<'b> ChannelSink<'b> {
    fn stash(&mut self, msg: Back<'b>) {
        match msg {
            Back::Extra(e) => self.extras.push(e),
            Back::Batch(b) => {
                self.batches.push(Arc::try_unwrap(b).ok().expect("a returned batch has no other owner"))
            }
        }
    }
}

impl<'b> Sink<'b> for ChannelSink<'b> {
    fn send(&mut self, msg: Msg<'b>) -> Result<()> {
        self.tx.send(msg).map_err(|_| closed())
    }

    fn batch(&mut self) -> Result<Batch<'b>> {
        if self.batches_made < 2 {
            self.batches_made += 1;
            return Ok(Batch::new(self.budget.lease()));
        }
        while self.batches.is_empty() {
            let msg = self.back.recv().map_err(|_| closed())?;
            self.stash(msg);
        }
        Ok(self.batches.pop().expect("not empty"))
    }

    fn extra(&mut self) -> GrowBuf {
        while let Ok(msg) = self.back.try_recv() {
            self.stash(msg);
        }
        self.extras.pop().unwrap_or_default()
    }

    fn inserter_idle(&self, queued: usize) -> bool {
        self.tx.len() <= queued
    }
}

/// The inserter on the same thread.
struct InlineSink<'s, 'b> {
    inserter: &'s mut Inserter<'b>,
    budget: &'b Budget,
    free: Option<Batch<'b>>,
    extra: Option<GrowBuf>,
    stopped: bool,
}

impl<'b> Sink<'b> for InlineSink<'_, 'b> {
    fn send(&mut self, msg: Msg<'b>) -> Result<()> {
        if self.stopped {
            return Err(closed());
        }
        let flow = match msg {
            Msg::Blocks(sb) => {
                let flow = self.inserter.blocks(&sb)?;
                self.extra = Some(sb.extra);
                flow
            }
            Msg::End { batch, covered, next, work } => {
                let flow = self.inserter.end(covered, next, batch.record_bytes, &work)?;
                self.free = Some(Arc::try_unwrap(batch).ok().expect("an ended batch has no other owner"));
                flow
            }
        };
        self.stopped = flow == Flow::Stopped;
        Ok(())
    }

    fn batch(&mut self) -> Result<Batch<'b>> {
        Ok(self.free.take().unwrap_or_else(|| Batch::new(self.budget.lease())))
    }

    fn extra(&mut self) -> GrowBuf {
        self.extra.take().unwrap_or_default()
    }

    /// One thread does both sides: who hashes makes no difference.
    fn inserter_idle(&self, _: usize) -> bool {
        false
    }
}

/// The reading side: reads batches, walks them, sends everything on.
fn produce<'b>(
    log: &Log,
    plan: &Plan,
    sink: &mut dyn Sink<'b>,
    lease: &mut Lease<'b>,
) -> Result<CompactStats> {
    let mut work = CompactStats::default();
    let (mut cursor, mut apply_from, mut hinted) = (plan.start, plan.apply_from, plan.hinted);
    let mut covered = plan.covered;
    for n in 0..plan.max_batches {
        let mut batch = sink.batch()?;
        match read_batch(log, cursor, apply_from, &plan.limits, &mut batch)? {
            Outcome::Read => {}
            Outcome::CursorInvalid(why) if n == 0 && hinted => {
                tracing::debug!(%why, "compaction cursor did not validate; scanning from the covered seq");
                work.cursor_fallbacks += 1;
                cursor = fallback_cursor(log, covered)?;
                apply_from = covered + 1;
                hinted = false;
                match read_batch(log, cursor, apply_from, &plan.limits, &mut batch)? {
                    Outcome::Read => {}
                    Outcome::CursorInvalid(why) => return Err(invalid(log, why)),
                }
            }
            Outcome::CursorInvalid(why) => return Err(invalid(log, why)),
        }
        let progress = batch.next != cursor;
        if !progress {
            if batch.budget_cut {
                return Err(Error::MemoryBudget("compaction could not fit one log record".into()));
            }
            break;
        }
        let mut bw = CompactStats {
            records: batch.records,
            input_bytes: batch.input_bytes,
            zeroed_bytes: batch.zeroed_bytes,
            background_reads: batch.reads,
            background_read_bytes: batch.read_bytes,
            bytes_initialized: batch.initialized,
            read_ns: batch.read_ns,
            budget_waits: u64::from(batch.budget_cut),
            ..CompactStats::default()
        };
        let (next, batch_covered) = (batch.next, batch.covered.max(covered));
        let batch = Arc::new(batch);
        let walker = Walker::new(batch.clone(), sink.extra(), lease, sink.inserter_idle(0));
        let ww = walker.run(&mut |sb: SubBatch<'b>| {
            sink.send(Msg::Blocks(sb))?;
            Ok(Sent { extra: sink.extra(), inserter_idle: sink.inserter_idle(1) })
        })?;
        bw.add(&ww);
        sink.send(Msg::End { batch, covered: batch_covered, next, work: Box::new(bw) })?;
        cursor = next;
        apply_from = next.seq;
        covered = batch_covered;
        if cursor.seq > plan.limits.durable_seq {
            break;
        }
    }
    Ok(work)
}

fn invalid(log: &Log, why: String) -> Error {
    Error::Corruption {
        path: log.dir().to_path_buf(),
        offset: 0,
        detail: format!("compaction cursor: {why}"),
    }
}

/// Runs the pass (see the module docs); returns its work counters and
/// how it ended.
pub fn run(ctx: &Ctx<'_>, plan: &Plan) -> (CompactStats, Result<()>) {
    let log = &**ctx.image.log();
    let committer = Committer::new(ctx.image, ctx.state, ctx.chunks, ctx.stop_at, ctx.refs_dropped);
    if ctx.threads < 2 {
        let stage = CommitStage::Inline { committer: Box::new(committer), stopped: false };
        let mut ins =
            Inserter::new(ctx.state, ctx.chunks, ctx.upload_room, ctx.budget.lease(), stage, plan.per_commit);
        let mut lease = ctx.budget.lease();
        let mut sink =
            InlineSink { inserter: &mut ins, budget: ctx.budget, free: None, extra: None, stopped: false };
        let produced = produce(log, plan, &mut sink, &mut lease);
        let stopped = sink.stopped;
        let finished = ins.finish();
        let (mut work, closed) = ins.into_work();
        let result = match (produced, finished.and_then(|f| closed.map(|()| f))) {
            (_, Err(e)) => Err(e),
            (Err(_), Ok(_)) if stopped => Ok(()),
            (Err(e), _) => Err(e),
            (Ok(w), Ok(_)) => {
                work.add(&w);
                Ok(())
            }
        };
        return (work, result);
    }
    let (tx, rx) = bounded::<Msg<'_>>(SUBS_IN_FLIGHT);
    let (back_tx, back_rx) = unbounded::<Back<'_>>();
    std::thread::scope(|s| {
        let reader = std::thread::Builder::new()
            .name("cas-compact-rd".into())
            .spawn_scoped(s, move || {
                let mut lease = ctx.budget.lease();
                let mut sink = ChannelSink {
                    tx,
                    back: back_rx,
                    budget: ctx.budget,
                    batches_made: 0,
                    batches: Vec::new(),
                    extras: Vec::new(),
                };
                produce(log, plan, &mut sink, &mut lease)
            })
            .expect("spawn the compaction reader thread");
        let (stage, commit_thread) = if ctx.threads >= 3 {
            let (job_tx, job_rx) = bounded::<CommitJob<'_>>(super::commit::JOBS_QUEUED_MAX);
            let (done_tx, done_rx) = unbounded::<Result<Flow>>();
            let t = std::thread::Builder::new()
                .name("cas-compact-ci".into())
                .spawn_scoped(s, move || run_thread(committer, &job_rx, &done_tx))
                .expect("spawn the compaction commit thread");
            (CommitStage::Thread { tx: Some(job_tx), done: done_rx, in_flight: 0, stopped: false }, Some(t))
        } else {
            (CommitStage::Inline { committer: Box::new(committer), stopped: false }, None)
        };
        let mut ins =
            Inserter::new(ctx.state, ctx.chunks, ctx.upload_room, ctx.budget.lease(), stage, plan.per_commit);
        let consumed = consume(&rx, &back_tx, &mut ins);
        // Unblock the reader whichever way it waits (send or buffer return).
        drop(rx);
        drop(back_tx);
        let produced = reader.join().expect("the compaction reader thread panicked");
        let finished = ins.finish();
        let (mut work, mut closed) = ins.into_work();
        if let Some(t) = commit_thread {
            let (thread_work, thread_closed) = t.join().expect("the compaction commit thread panicked");
            work.add(&thread_work);
            closed = closed.and(thread_closed);
        }
        let finished = finished.and_then(|f| closed.map(|()| f));
        let result = match (consumed, finished, produced) {
            (Err(e), _, _) | (_, Err(e), _) => Err(e),
            (Ok(Flow::Stopped), _, _) | (_, Ok(Flow::Stopped), _) => Ok(()),
            (_, _, Err(e)) => Err(e),
            (_, _, Ok(w)) => {
                work.add(&w);
                Ok(())
            }
        };
        (work, result)
    })
}

/// The inserting side: until the channel closes or a stop.
fn consume<'b>(rx: &Receiver<Msg<'b>>, back: &Sender<Back<'b>>, inserter: &mut Inserter<'b>) -> Result<Flow> {
    for msg in rx {
        let flow = match msg {
            Msg::Blocks(sb) => {
                let flow = inserter.blocks(&sb)?;
                let _ = back.send(Back::Extra(sb.extra));
                flow
            }
            Msg::End { batch, covered, next, work } => {
                let flow = inserter.end(covered, next, batch.record_bytes, &work)?;
                let _ = back.send(Back::Batch(batch));
                flow
            }
        };
        if flow == Flow::Stopped {
            return Ok(Flow::Stopped);
        }
    }
    Ok(Flow::Continue)
}

//! One compaction pass: the reading thread and the inserting thread, the
//! channel between them, and the buffers that circulate back.
//!
//! ```text
//!  reader thread (scoped)                       pass thread (caller)
//!   read_batch -> Walker: hash   --SubBatch-->   Inserter::blocks (insert_missing)
//!                                --End------->   Inserter::end (sync, commit, reclaim)
//!   free batch / extra buffers  <--Back------    (buffers return for reuse)
//! ```
//!
//! Bounds: at most `SUBS_IN_FLIGHT` sub-batches wait in the channel; two
//! batch buffers exist per pass (the reader fills one while the inserter
//! still uses the other), and at most `SUBS_IN_FLIGHT + 2` extra buffers.
//! With `compaction_threads == 1` the inserter runs inline on the reading
//! thread instead (same code, no channel).
//!
//! The reader runs ahead by at most one batch: it may hash batch N+1 while
//! batch N commits. Partial blocks need the state before their batch, so
//! they are merged by the inserter, which commits batches in order.

use super::blocks::{Back, Msg, SubBatch, Walker};
use super::budget::{Budget, GrowBuf, Lease};
use super::inserter::{Flow, Inserter};
use super::reader::{fallback_cursor, read_batch, Batch, Cursor, Limits, Outcome};
use super::stats::CompactStats;
use crate::error::{Error, Result};
use crate::wal::Log;
use crossbeam::channel::{bounded, unbounded, Receiver, Sender};
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
    pub max_batches: u64,
}

/// Where the reader's sub-batches and batch ends go, and where it gets
/// buffers from.
trait Sink<'b> {
    fn send(&mut self, msg: Msg<'b>) -> Result<()>;
    fn batch(&mut self) -> Result<Batch<'b>>;
    fn extra(&mut self) -> GrowBuf;
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
        match msg {
            Msg::Blocks(sb) => {
                self.inserter.blocks(&sb)?;
                self.extra = Some(sb.extra);
            }
            Msg::End { batch, covered, next, work } => {
                if self.inserter.end(covered, next, &work)? == Flow::Stopped {
                    self.stopped = true;
                }
                self.free = Some(Arc::try_unwrap(batch).ok().expect("an ended batch has no other owner"));
            }
        }
        Ok(())
    }

    fn batch(&mut self) -> Result<Batch<'b>> {
        Ok(self.free.take().unwrap_or_else(|| Batch::new(self.budget.lease())))
    }

    fn extra(&mut self) -> GrowBuf {
        self.extra.take().unwrap_or_default()
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
        let walker = Walker::new(batch.clone(), sink.extra(), lease);
        let ww = walker.run(&mut |sb: SubBatch<'b>| {
            sink.send(Msg::Blocks(sb))?;
            Ok(sink.extra())
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

/// Runs the pass: `threads >= 2` pipelines reading and inserting.
pub fn run<'b>(
    log: &Log,
    plan: &Plan,
    inserter: &mut Inserter<'b>,
    budget: &'b Budget,
    threads: usize,
) -> Result<CompactStats> {
    if threads < 2 {
        let mut lease = budget.lease();
        let mut sink = InlineSink { inserter, budget, free: None, extra: None, stopped: false };
        return match produce(log, plan, &mut sink, &mut lease) {
            Err(_) if sink.stopped => Ok(CompactStats::default()),
            r => r,
        };
    }
    let (tx, rx) = bounded::<Msg<'b>>(SUBS_IN_FLIGHT);
    let (back_tx, back_rx) = unbounded::<Back<'b>>();
    std::thread::scope(|s| {
        let reader = std::thread::Builder::new()
            .name("cas-compact-rd".into())
            .spawn_scoped(s, move || {
                let mut lease = budget.lease();
                let mut sink = ChannelSink {
                    tx,
                    back: back_rx,
                    budget,
                    batches_made: 0,
                    batches: Vec::new(),
                    extras: Vec::new(),
                };
                produce(log, plan, &mut sink, &mut lease)
            })
            .expect("spawn the compaction reader thread");
        let consumed = consume(&rx, &back_tx, inserter);
        // Unblock the reader whichever way it waits (send or buffer return).
        drop(rx);
        drop(back_tx);
        let produced = reader.join().expect("the compaction reader thread panicked");
        match consumed {
            Err(e) => Err(e),
            Ok(Flow::Stopped) => Ok(CompactStats::default()),
            Ok(Flow::Continue) => produced,
        }
    })
}

/// The inserting side: until the channel closes or a stop.
fn consume<'b>(rx: &Receiver<Msg<'b>>, back: &Sender<Back<'b>>, inserter: &mut Inserter<'b>) -> Result<Flow> {
    for msg in rx {
        match msg {
            Msg::Blocks(sb) => {
                inserter.blocks(&sb)?;
                let _ = back.send(Back::Extra(sb.extra));
            }
            Msg::End { batch, covered, next, work } => {
                let flow = inserter.end(covered, next, &work)?;
                let _ = back.send(Back::Batch(batch));
                if flow == Flow::Stopped {
                    return Ok(Flow::Stopped);
                }
            }
        }
    }
    Ok(Flow::Continue)
}
